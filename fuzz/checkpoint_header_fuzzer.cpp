// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the checkpoint reader: arbitrary bytes must give a
// format_error or a verified image, never a crash, a sanitizer report or an
// out-of-bounds read.
//
//   input[0] bit 0 clear: input[1..] is the whole file (raw mode);
//            bit 0 set:   input[1..] is the header section's payload, framed
//                         into a file with valid checksums, so the header's
//                         field parser and check_header see arbitrary fields.
//
// Built with -DDILOCO_FUZZ_MAKE_SEEDS it is instead a program that writes
// seed inputs (valid checkpoints in both modes) into the directory given as
// its argument; run_fuzzer.sh does that before fuzzing.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <diloco/checkpoint/format.hpp>
#include <string>
#include <vector>

namespace ck = diloco::checkpoint;

namespace {

std::vector<ck::field> sample_header() {
  return {{"scope", diloco::option_value::of_text("worker")},
          {"policy.sync", diloco::option_value::of_text("eager")},
          {"rank", diloco::option_value::of_unsigned(1)},
          {"options.outer.lr", diloco::option_value::of_double(0.7f)},
          {"options.host_threads", diloco::option_value::of_signed(-1)},
          {"options.broadcast_initial", diloco::option_value::of_bool(true)}};
}

std::vector<ck::expected_field> expected() {
  std::vector<ck::expected_field> out;
  for (auto& f : sample_header()) out.push_back({f, f.name != "options.host_threads"});
  return out;
}

std::vector<std::byte> sample_file() {
  ck::writer w(sample_header());
  const float theta[5] = {1.0f, -2.0f, 0.5f, 0.0f, 3.25f};
  w.buffer("theta_global", theta, 5);
  w.scalar("rounds", 7);
  w.buffer("empty", nullptr, 0);
  const std::byte segment[3] = {std::byte{1}, std::byte{0xfe}, std::byte{7}};
  w.bytes("fragment.0.ready.gathered", segment, 3);
  return std::move(w).finish();
}

// A file around an arbitrary header payload, with every checksum valid.
std::vector<std::byte> framed(const std::uint8_t* data, std::size_t size) {
  const auto base = sample_file();
  const auto img = ck::parse(base);
  const auto& h = img.sections[0];
  std::vector<std::byte> body(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(h.payload_offset));
  ck::detail::set_u64(body, h.offset + 8, size);
  body.insert(body.end(), reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
  ck::detail::put_u64(body, ck::detail::checksum(body.data() + h.offset, body.size() - h.offset));
  body.insert(body.end(), base.begin() + static_cast<std::ptrdiff_t>(h.end), base.end() - ck::trailer_bytes);
  ck::detail::set_u64(body, 16, body.size() + ck::trailer_bytes);
  ck::detail::put_u64(body, ck::detail::checksum(body.data(), body.size()));
  return body;
}

void exercise(std::span<const std::byte> bytes) {
  try {
    const auto img = ck::parse(bytes);
    std::vector<float> values;
    std::vector<std::byte> raw;
    for (std::size_t i = 1; i < img.sections.size(); ++i) {
      const auto& s = img.sections[i];
      if (s.kind == ck::section_kind::scalar) {
        (void)img.scalar(s);
      } else if (s.kind == ck::section_kind::bytes) {
        raw.resize(s.elements());
        img.raw(s, raw.data());
      } else {
        values.resize(s.elements());
        img.floats(s, values.data());
      }
    }
    for (const auto& f : img.header) (void)f.value.to_string();
    ck::check_header(img, expected());
  } catch (const diloco::format_error&) {
  }
}

}  // namespace

#if defined(DILOCO_FUZZ_MAKE_SEEDS)
#include <fstream>
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  auto write = [&](const std::string& name, std::uint8_t mode, std::span<const std::byte> body) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.put(static_cast<char>(mode));
    out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  };
  const auto file = sample_file();
  write("seed_checkpoint_raw", 0, file);
  const auto img = ck::parse(file);
  const auto& h = img.sections[0];
  write("seed_checkpoint_header", 1, std::span<const std::byte>(file).subspan(h.payload_offset, h.payload_bytes));
  ck::writer empty({});
  write("seed_checkpoint_empty", 0, std::move(empty).finish());
  return 0;
}
#else
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) {
    const auto file = framed(data + 1, size - 1);
    exercise(file);
  } else {
    exercise(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data + 1), size - 1));
  }
  return 0;
}
#endif
