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

namespace {
// Encoded bytes per parameter from the definition of the block-wise format:
// every tensor cut into blocks of B (the last one partial but occupying a
// full block), each 4 bytes of scale plus B * bits / 8 of values, and one
// 64-byte header per shard (one shard per worker).
double blockwise_bytes_per_parameter(const char_mlp::model& m, int workers, std::size_t block, int bits) {
  std::size_t blocks = 0, total = 0;
  for (const std::size_t n : m.tensor_sizes()) {
    blocks += (n + block - 1) / block;
    total += n;
  }
  return static_cast<double>(blocks * (4 + block * static_cast<std::size_t>(bits) / 8) +
                             static_cast<std::size_t>(workers) * 64) /
         static_cast<double>(total);
}
}  // namespace

TEST_CASE("demo defaults: int8 + error feedback within 2% and int4 + error feedback within 5% of DiLoCo") {
  namespace cp = diloco::compress;
  char_mlp::config c;
  c.log_every = 0;
  const auto data = char_mlp::load_dataset(c);
  c.dims.vocab = data.vocab();
  const auto plain = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::none>(c, data, comm, "diloco");
  });
  const auto i8 = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int8, 128>>>(c, data, comm, "int8");
  });
  const auto i4 = char_mlp::on_threads(c.workers, [&](auto& comm) {
    return char_mlp::run_diloco<cp::error_feedback<cp::blockwise<diloco::int4, 128>>>(c, data, comm, "int4");
  });
  MESSAGE("diloco ", plain.held_out_loss, ", int8+ef ", i8.held_out_loss, " (", i8.encoded_bytes_per_parameter,
          " B/param), int4+ef ", i4.held_out_loss, " (", i4.encoded_bytes_per_parameter, " B/param)");
  CHECK(i8.held_out_loss <= 1.02 * plain.held_out_loss);
  CHECK(i4.held_out_loss <= 1.05 * plain.held_out_loss);
  const char_mlp::model shape(c.dims, c.seed);
  CHECK(i8.encoded_bytes_per_parameter == doctest::Approx(blockwise_bytes_per_parameter(shape, c.workers, 128, 8)));
  CHECK(i4.encoded_bytes_per_parameter == doctest::Approx(blockwise_bytes_per_parameter(shape, c.workers, 128, 4)));
  // The promise for large tensors, (4 + B bits/8) / B, within the padding of
  // this small model's partial blocks and headers.
  CHECK(i8.encoded_bytes_per_parameter < 1.10 * (132.0 / 128.0));
  CHECK(i4.encoded_bytes_per_parameter < 1.10 * (68.0 / 128.0));
  // Fewer bytes sent than fp32 DiLoCo, by about the encoding's ratio.
  CHECK(static_cast<double>(i8.bytes_per_worker) < 0.35 * static_cast<double>(plain.bytes_per_worker));
  CHECK(static_cast<double>(i4.bytes_per_worker) < 0.2 * static_cast<double>(plain.bytes_per_worker));
}
