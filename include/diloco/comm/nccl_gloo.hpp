// SPDX-License-Identifier: Apache-2.0
#pragma once

// nccl::from_store with Gloo's rendezvous stores (FileStore, HashStore,
// RedisStore, PrefixStore): rank 0 publishes the ncclUniqueId under
// options.store_key, the others wait for it up to options.store_timeout.
//
//   gloo::rendezvous::FileStore store("/shared/rendezvous");
//   auto comm = diloco::comm::nccl::from_store(store, rank, size, {.device = local_rank});
//
// One key per communicator: wrap the store in a gloo::rendezvous::PrefixStore
// (or set store_key) when several share it, and start from an empty store,
// since a key left over from an earlier run would hand out a dead id (its
// record is well formed, so the ranks would time out joining it).
// Needs the diloco::nccl and diloco::gloo targets.

#include "diloco/core/require_cxx20.hpp"

#include <gloo/rendezvous/store.h>

#include "diloco/comm/nccl.hpp"

static_assert(diloco::comm::unique_id_store<gloo::rendezvous::Store>,
              "gloo::rendezvous::Store no longer has the set/wait/get interface nccl::from_store expects");
