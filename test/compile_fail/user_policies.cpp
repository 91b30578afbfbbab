// SPDX-License-Identifier: Apache-2.0
// A user's own optimizer and compressor written to the concepts
// (core/concepts.hpp, compress/codec.hpp): with nothing dropped this
// compiles and instantiates every path the algorithm takes through them
// (compile_ok_user_policies). -DDROP=<requirement> leaves one requirement
// out, and the algorithm must then be refused where it is named, with the
// requirement in the compiler's message (compile_fail_user_policy_*), not
// fail deep inside the library.
#include <diloco/diloco.hpp>

#include <cstdint>
#include <vector>

#define DROP_update 1
#define DROP_lr 2
#define DROP_codec 3
#define DROP_stochastic 4
#define CONCAT(a, b) a##b
#define DROPPED(what) CONCAT(DROP_, what)
#if !defined(DROP)
#define DROP none
#endif

// Plain SGD with a learning rate and nothing else.
struct plain_sgd {
  struct options {
#if DROPPED(DROP) == DROP_lr
    float step_size = 0.1f;
#else
    float lr = 0.1f;
#endif
    template <class F>
    friend void visit_options(const options& o, F&& f) {
#if DROPPED(DROP) == DROP_lr
      f("step_size", o.step_size);
#else
      f("lr", o.lr);
#endif
    }
  };
  struct step_update {
    float lr;
    DILOCO_HD void operator()(float& p, float g, float*, std::size_t) const { p -= lr * g; }
  };
#if DROPPED(DROP) != DROP_update
  using update = step_update;
#endif
  static constexpr const char* name = "plain sgd";
  static void validate(const options&) {}
  static std::size_t state_slots(const options&) { return 0; }
#if DROPPED(DROP) == DROP_lr
  static step_update make_update(const options& o, std::uint64_t) { return {o.step_size}; }
#else
  static step_update make_update(const options& o, std::uint64_t) { return {o.lr}; }
#endif
};

// int8 block-wise quantization under a name of the user's, reusing the
// library's codec.
struct my_int8 {
  using options = diloco::compress::codec_options;
#if DROPPED(DROP) != DROP_codec
  using codec = diloco::compress::blockwise<diloco::int8>::codec;
#endif
  static constexpr const char* name = "my int8";
  static constexpr bool lossless = false;
  static constexpr bool has_error_feedback = false;
#if DROPPED(DROP) != DROP_stochastic
  static constexpr bool stochastic = false;
#endif
  static void validate(const options&) {}
  static diloco::compress::blockwise<diloco::int8>::codec make_codec(const options&) { return {}; }
};

using trainer = diloco::algorithm<plain_sgd, diloco::outer::nesterov, my_int8, diloco::comm::threads>;

void train(diloco::comm::threads& comm) {
  std::vector<float> w(300, 0.0f), g(300, 1.0f);
  trainer t(w, comm, {.inner_steps = 2, .inner = {}});
  t.step(g);
  t.set_inner_lr(0.05f);
}
