// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a compressor with no device form over device tensors.
// HOST_ONLY names it (test/CMakeLists.txt: compress::topk<>, which selects
// on the host, and compress::chunk_topk<8192>, whose chunks do not fit the
// device selection's shared memory).
// The device executor and buffers are stand-ins here, so that the
// compressor is the only thing wrong.
#include <diloco/diloco.hpp>

namespace diloco {
template <class T>
class buffer<T, device_space> : public buffer<T, host_space> {
 public:
  using buffer<T, host_space>::buffer;
};
struct stand_in_executor : exec::host {
  stand_in_executor() : exec::host(0) {}
  template <class T>
  using staging_buffer = host_buffer<T>;
  template <class P>
  void run_teams(std::size_t, const P&) const {}
  void checksum_segments(const kernels::segment_ref*, std::size_t, std::size_t, std::uint64_t*) const {}
};
namespace detail {
template <>
struct executor_for<device_space> {
  using type = stand_in_executor;
};
}  // namespace detail
}  // namespace diloco

void f(diloco::device_view<float> w, diloco::comm::local& comm) {
  diloco::algorithm<diloco::inner::adamw, diloco::outer::nesterov, diloco::compress::HOST_ONLY, diloco::comm::local> t(
      w, comm);
}
