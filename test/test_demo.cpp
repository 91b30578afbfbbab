// The main demo on its default settings: DiLoCo's held-out loss within 5% of
// synchronous data parallel while each worker sends at least H/2 times fewer
// bytes. Runs the same code as examples/train_char_mlp.
#include <doctest/doctest.h>

#include "char_mlp/experiment.hpp"

TEST_CASE("demo defaults: DiLoCo within 5% of data parallel with >= H/2 times fewer bytes") {
  char_mlp::config c;  // the demo's defaults
  c.log_every = 0;
  const auto data = char_mlp::load_dataset(c);
  c.dims.vocab = data.vocab();
  const auto ddp = char_mlp::on_threads(c.workers, [&](auto& comm) { return char_mlp::run_data_parallel(c, data, comm); });
  const auto dl = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<diloco::compress::none>(c, data, comm, "diloco");
  });
  MESSAGE("data parallel loss ", ddp.held_out_loss, ", bytes ", ddp.bytes_per_worker);
  MESSAGE("diloco loss ", dl.held_out_loss, ", bytes ", dl.bytes_per_worker);
  // Both learned something: far below the uniform guess log(vocab).
  CHECK(ddp.held_out_loss < 0.5 * std::log(static_cast<double>(data.vocab())));
  CHECK(dl.held_out_loss <= 1.05 * ddp.held_out_loss);
  CHECK(static_cast<double>(ddp.bytes_per_worker) >=
        (c.inner_steps / 2.0) * static_cast<double>(dl.bytes_per_worker));
  CHECK(dl.rounds == static_cast<std::uint64_t>(c.steps / c.inner_steps));
  CHECK(ddp.rounds == static_cast<std::uint64_t>(c.steps));
}
