# SPDX-License-Identifier: Apache-2.0
"""One process of test_gloo_two_processes: DiLoCo over diloco.gloo.from_env()
(RANK, WORLD_SIZE, LOCAL_RANK, DILOCO_STORE), AdamW inner, one-step delay;
saves its replica and theta_global to argv[1]."""
import sys

import torch

import diloco
from reference import inner_optimizer, inner_step, make_model

torch.set_num_threads(1)
comm = diloco.gloo.from_env()
model = make_model(seed=comm.rank + 17)
opt = inner_optimizer("adamw", model.parameters())
outer = diloco.DiLoCo(model.parameters(), inner_steps=3, sync="one_step_delay", comm=comm)
for t in range(1, 10):
    inner_step(model, opt, comm.rank, t)
    outer.step()
outer.finish()
torch.save(([p.detach().clone() for p in model.parameters()], [g.clone() for g in outer.global_parameters()],
            outer.rank, comm.kind), sys.argv[1])
