// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco::experiment: compare DiLoCo variants, chosen at compile time, on
// one problem with the same data and seeds (CMake component `json`, target
// diloco::json, for the JSON report).
//
//   namespace dx = diloco::experiment;
//   using list = dx::variants<dx::data_parallel<>, dx::variant<>,
//                             dx::variant<inner::adamw, outer::nesterov, int4_ef>>;
//   auto rows = dx::run<list>(problem, dx::on_threads{8}, {.steps = 2000, .inner_steps = 50});
//   dx::write_table(stdout, rows);  dx::write_csv(file, rows);  dx::write_json(file, rows);
//
// experiment/variants.hpp  the variant types, named<>, grid<>
// experiment/run.hpp       problems, launchers, settings, rows, run<>()
// experiment/report.hpp    table, CSV, curves CSV, JSON

#include "diloco/experiment/report.hpp"
#include "diloco/experiment/run.hpp"
#include "diloco/experiment/variants.hpp"
