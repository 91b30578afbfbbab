// SPDX-License-Identifier: Apache-2.0
// diloco._core: the extension module under the Python package `diloco`
// (python/diloco/). Tensors cross by DLPack (nanobind's ndarray), so the
// build needs no PyTorch; the GIL is released around every call that may run
// a collective or a pass; the library's errors become the exception classes
// defined here, with the same messages. docs/python.md is the user's page.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "any_comm.hpp"
#include "diloco/comm/threads.hpp"
#include "diloco/core/error.hpp"
#include "diloco/core/event.hpp"
#include "diloco/core/stats.hpp"
#include "diloco/version.hpp"
#include "trainer.hpp"
#ifdef DILOCO_PYTHON_GLOO
#include "diloco/comm/gloo.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace diloco::python {
namespace {

// ------------------------------------------------------------ exceptions
// The Python classes of the library's errors (created in the module's init).
PyObject* error_class = nullptr;
PyObject* config_error_class = nullptr;
PyObject* comm_error_class = nullptr;
PyObject* format_error_class = nullptr;
PyObject* state_error_class = nullptr;
PyObject* numeric_error_class = nullptr;

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const config_error& e) {
    PyErr_SetString(config_error_class, e.what());
  } catch (const comm_error& e) {
    PyErr_SetString(comm_error_class, e.what());
  } catch (const format_error& e) {
    PyErr_SetString(format_error_class, e.what());
  } catch (const state_error& e) {
    PyErr_SetString(state_error_class, e.what());
  } catch (const numeric_error& e) {
    PyErr_SetString(numeric_error_class, e.what());
  } catch (const diloco::error& e) {
    PyErr_SetString(error_class, e.what());
  }
}

PyObject* new_exception(nb::module_& m, const char* name, nb::handle bases, const char* doc) {
  const std::string full = std::string("diloco.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

// -------------------------------------------------------- communicators
/// A communicator as Python sees it: a shared handle (each DiLoCo keeps one).
struct py_comm {
  std::shared_ptr<comm_base> impl;
  int local_rank = 0;
  std::function<void()> close_fn;
};

/// Runs `fn(comm)` on `size` threads, one per worker (comm::threads), and
/// returns their results in rank order. A worker that raises breaks the
/// group (the others' collectives fail with CommError) and its exception is
/// raised here.
nb::list threads_run(int size, nb::object fn, double timeout_s) {
  if (size < 1) throw nb::value_error(("diloco.threads: size must be at least 1, got " + std::to_string(size)).c_str());
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000.0));
  comm::threads::world world(size, timeout);
  std::vector<nb::object> results(static_cast<std::size_t>(size));
  std::mutex failure_mutex;
  std::exception_ptr first_python_failure;  // touched with the GIL held
  {
    nb::gil_scoped_release release;
    try {
      world.run([&](comm::threads& c) {
        auto model = std::make_shared<comm_model<comm::threads>>(&c, nullptr, "threads");
        struct releaser {
          comm_model<comm::threads>* m;
          ~releaser() { m->release(); }
        } guard{model.get()};
        nb::gil_scoped_acquire acquire;
        try {
          py_comm pc{model, c.rank(), {}};
          nb::object r = fn(nb::cast(std::move(pc)));
          results[static_cast<std::size_t>(c.rank())] = std::move(r);
        } catch (nb::python_error& e) {
          std::string message = e.what();
          {
            std::lock_guard lock(failure_mutex);
            if (!first_python_failure) first_python_failure = std::current_exception();
          }
          throw diloco::error("diloco: a Python worker raised: " + message);
        }
      });
    } catch (...) {
      nb::gil_scoped_acquire acquire;
      if (first_python_failure) std::rethrow_exception(first_python_failure);
      throw;
    }
  }
  nb::list out;
  for (auto& r : results) out.append(r);
  return out;
}

py_comm make_local() { return py_comm{std::make_shared<local_model>(), 0, {}}; }

#ifdef DILOCO_PYTHON_GLOO
py_comm make_gloo(int rank, int size, const std::string& store, const std::string& run_id, const std::string& hostname,
                  const std::string& iface, double timeout_s, int local_world_size, int local_rank) {
  comm::gloo::options o;
  o.rank = rank;
  o.size = size;
  o.rendezvous = comm::detail_gloo::parse_store(store, "the store");
  o.run_id = run_id;
  if (!hostname.empty()) o.hostname = hostname;
  o.iface = iface;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000.0));
  o.local_world_size = local_world_size;
  std::unique_ptr<comm::gloo> g;
  {
    nb::gil_scoped_release release;
    g = std::make_unique<comm::gloo>(std::move(o));
  }
  comm::gloo* raw = g.get();
  auto model = std::make_shared<comm_model<comm::gloo>>(raw, std::move(g), "gloo");
  std::weak_ptr<comm_model<comm::gloo>> weak = model;
  return py_comm{model, local_rank, [weak] {
                   if (auto m = weak.lock()) m->close();
                 }};
}
#endif

// --------------------------------------------------------------- tensors
const char* dtype_name(nb::dlpack::dtype d) {
  using code = nb::dlpack::dtype_code;
  const auto c = static_cast<code>(d.code);
  if (c == code::Float && d.bits == 16) return "float16";
  if (c == code::Float && d.bits == 64) return "float64";
  if (c == code::Bfloat && d.bits == 16) return "bfloat16";
  if (c == code::Int) return "a signed integer type";
  if (c == code::UInt) return d.bits == 8 ? "uint8 (or bool)" : "an unsigned integer type";
  if (c == code::Bool) return "bool";
  if (c == code::Complex) return "a complex type";
  return "an unsupported type";
}

/// The element types a parameter may have.
enum class element { fp32, bf16, fp16 };
const char* element_name(element e) {
  return e == element::fp32 ? "float32" : e == element::bf16 ? "bfloat16" : "float16";
}

/// The user's tensor k as a writable host array of float32, bfloat16 or
/// float16 (its type in `type`), or TypeError (not a tensor, another dtype,
/// read-only) / ValueError (device, layout).
nb::ndarray<> as_array(nb::handle h, std::size_t k, element& type) {
  nb::ndarray<> a;
  if (!nb::try_cast(h, a, false)) {
    const std::string type = nb::type_name(h.type()).c_str();
    throw nb::type_error(("diloco: parameter " + std::to_string(k) + " (a " + type +
                          ") is not a writable tensor: pass torch tensors, NumPy arrays or objects with "
                          "__dlpack__, writable")
                             .c_str());
  }
  const nb::dlpack::dtype d = a.dtype();
  using code = nb::dlpack::dtype_code;
  if (d == nb::dtype<float>())
    type = element::fp32;
  else if (static_cast<code>(d.code) == code::Bfloat && d.bits == 16 && d.lanes == 1)
    type = element::bf16;
  else if (static_cast<code>(d.code) == code::Float && d.bits == 16 && d.lanes == 1)
    type = element::fp16;
  else
    throw nb::type_error(("diloco: parameter " + std::to_string(k) + " has dtype " + dtype_name(a.dtype()) +
                          "; diloco trains float32 tensors (torch.float32, numpy.float32), or bfloat16 / float16 "
                          "ones (a low-precision replica)")
                             .c_str());
  if (a.device_type() != nb::device::cpu::value)
    throw nb::value_error(("diloco: parameter " + std::to_string(k) +
                           " is not in CPU memory; this build of diloco._core takes CPU tensors only")
                              .c_str());
  std::int64_t expected = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected)
      throw nb::value_error(("diloco: parameter " + std::to_string(k) +
                             " is not contiguous (strides in elements do not follow its shape in row-major "
                             "order); diloco keeps pointers into the tensors, so they must be contiguous: pass "
                             "tensor.contiguous() and keep training that one")
                                .c_str());
    expected *= static_cast<std::int64_t>(a.shape(d));
  }
  return a;
}

// ------------------------------------------------------------ the trainer
/// Holds a callable across threads: copies share one reference, and the
/// last one drops it with the GIL held.
struct py_callable {
  nb::object fn;
  ~py_callable() {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire acquire;
      fn.reset();
    }
  }
};

nb::dict event_dict(const event& e) {
  nb::dict d;
  d["kind"] = to_string(e.kind);
  d["rank"] = e.rank;
  d["world"] = e.world;
  d["inner_step"] = e.inner_step;
  d["round"] = e.round;
  d["fragment"] = e.fragment;
  d["fragment_round"] = e.fragment_round;
  d["bytes_sent"] = e.bytes_sent;
  d["bytes_received"] = e.bytes_received;
  d["pseudo_gradient_norm"] = e.pseudo_gradient_norm;
  d["compression_error_norm"] = e.compression_error_norm;
  d["blocked_seconds"] = e.blocked_seconds;
  d["hidden_seconds"] = e.hidden_seconds;
  d["problem"] = e.problem;
  d["corrupt"] = e.corrupt;
  return d;
}

nb::dict stats_dict(const diloco::stats& s) {
  nb::dict d;
  d["inner_steps"] = s.inner_steps;
  d["rounds"] = s.rounds;
  d["rejected_rounds"] = s.rejected_rounds;
  d["aborted_rounds"] = s.aborted_rounds;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["setup_bytes"] = s.setup_bytes;
  d["last_round_bytes_sent"] = s.last_round_bytes_sent;
  d["last_round_bytes_received"] = s.last_round_bytes_received;
  d["pseudo_gradient_norm"] = s.pseudo_gradient_norm;
  d["compression_error_norm"] = s.compression_error_norm;
  d["encoded_bytes_per_parameter"] = s.encoded_bytes_per_parameter;
  d["wire_bytes_per_parameter"] = s.wire_bytes_per_parameter;
  d["comm_seconds"] = s.comm_seconds;
  d["last_round_comm_seconds"] = s.last_round_comm_seconds;
  d["outer_seconds"] = s.outer_seconds;
  d["blocked_seconds"] = s.blocked_seconds;
  d["last_round_blocked_seconds"] = s.last_round_blocked_seconds;
  d["hidden_seconds"] = s.hidden_seconds;
  d["last_round_hidden_seconds"] = s.last_round_hidden_seconds;
  d["workers"] = s.workers;
  d["membership_changes"] = s.membership_changes;
  nb::list fragments;
  for (std::uint64_t b : s.fragment_bytes_sent) fragments.append(b);
  d["fragment_bytes_sent"] = fragments;
  return d;
}

/// The object behind diloco.DiLoCo: the user's tensors (kept alive), the
/// communicator and the trainer.
class py_trainer {
 public:
  py_trainer(nb::list params, py_comm* comm, const std::string& outer, float outer_lr, float outer_momentum,
             float outer_dampening, float outer_weight_decay, bool outer_nesterov, const std::string& compress,
             const std::string& sync, std::size_t inner_steps, std::size_t fragments, std::size_t delay, float alpha,
             std::uint64_t seed, bool broadcast_initial, int host_threads, nb::object on_event) {
    element type = element::fp32;
    for (std::size_t k = 0; k < params.size(); ++k) {
      element t = element::fp32;
      tensors_.push_back(as_array(params[k], k, t));
      if (k == 0) type = t;
      if (t != type)
        throw nb::type_error(("diloco: parameter " + std::to_string(k) + " is " + element_name(t) +
                              " but parameter 0 is " + element_name(type) +
                              "; every parameter of one DiLoCo instance has the same dtype")
                                 .c_str());
    }
    trainer_config c;
    c.outer = outer;
    c.outer_lr = outer_lr;
    c.outer_momentum = outer_momentum;
    c.outer_dampening = outer_dampening;
    c.outer_weight_decay = outer_weight_decay;
    c.outer_nesterov = outer_nesterov;
    c.compress = compress;
    c.sync = sync;
    c.inner_steps = inner_steps;
    c.fragments = fragments;
    c.delay = delay;
    c.alpha = alpha;
    c.seed = seed;
    c.broadcast_initial = broadcast_initial;
    c.host_threads = host_threads;
    if (!on_event.is_none()) {
      auto holder = std::make_shared<py_callable>(py_callable{on_event});
      c.on_event = [holder](const event& e) {
        nb::gil_scoped_acquire acquire;
        holder->fn(event_dict(e));
      };
    }
    any_comm ac(comm != nullptr ? comm->impl : std::make_shared<local_model>());
    auto build = [&]<class E>() {
      std::vector<std::span<E>> spans;
      for (auto& a : tensors_) spans.emplace_back(static_cast<E*>(a.data()), a.size());
      nb::gil_scoped_release release;
      trainer_ = make_trainer(c, spans, std::move(ac));
    };
    if (type == element::fp32)
      build.template operator()<float>();
    else if (type == element::bf16)
      build.template operator()<bfloat16>();
    else
      build.template operator()<float16>();
  }

  ~py_trainer() {
    // The engine may wait for its exchanges in flight; other workers'
    // threads may need the GIL to get there.
    if (trainer_ && Py_IsInitialized() && PyGILState_Check()) {
      nb::gil_scoped_release release;
      trainer_.reset();
    }
  }

  trainer_base& get() const {
    if (!trainer_) throw state_error("diloco: this DiLoCo instance is closed");
    return *trainer_;
  }

  bool step() {
    trainer_base& t = get();
    nb::gil_scoped_release release;
    return t.step();
  }
  void finish() {
    trainer_base& t = get();
    nb::gil_scoped_release release;
    t.finish();
  }
  void close() {
    nb::gil_scoped_release release;
    trainer_.reset();
  }
  nb::bytes save() {
    trainer_base& t = get();
    std::vector<std::byte> bytes;
    {
      nb::gil_scoped_release release;
      bytes = t.save_bytes();
    }
    return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void load(nb::bytes b) {
    trainer_base& t = get();
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(b.data()), b.size());
    nb::gil_scoped_release release;
    t.load_bytes(bytes);
  }

  std::unique_ptr<trainer_base> trainer_;
  std::vector<nb::ndarray<>> tensors_;
};

}  // namespace
}  // namespace diloco::python

NB_MODULE(_core, m) {
  using namespace diloco::python;
  m.doc() = "diloco's compiled core (DiLoCo over DLPack tensors); use the `diloco` package";
  m.attr("__version__") = std::to_string(diloco::version_major) + "." + std::to_string(diloco::version_minor) + "." +
                          std::to_string(diloco::version_patch);

  nb::handle runtime(PyExc_RuntimeError);
  error_class = new_exception(m, "Error", runtime, "Every error the diloco library reports.");
  config_error_class = new_exception(m, "ConfigError", nb::make_tuple(nb::handle(error_class), nb::handle(PyExc_ValueError)),
                                     "An option, policy or tensor that does not fit what was expected.");
  comm_error_class = new_exception(m, "CommError", error_class,
                                   "A collective that could not complete: a peer vanished, timed out or disagreed.");
  format_error_class = new_exception(m, "FormatError", error_class,
                                     "Bytes (a checkpoint, a wire buffer) that do not decode.");
  state_error_class =
      new_exception(m, "StateError", error_class, "An operation that is not valid in the object's current state.");
  numeric_error_class = new_exception(m, "NumericError", error_class,
                                      "Non-finite values where finite numbers are required; the round is rejected.");
  nb::register_exception_translator(translate);

  nb::class_<py_comm>(m, "Comm", "A communicator: this worker's place in a group (rank, size).")
      .def_prop_ro("rank", [](const py_comm& c) { return c.impl->rank(); })
      .def_prop_ro("size", [](const py_comm& c) { return c.impl->size(); })
      .def_prop_ro("kind", [](const py_comm& c) { return std::string(c.impl->kind()); })
      .def_ro("local_rank", &py_comm::local_rank)
      .def("close",
           [](py_comm& c) {
             if (c.close_fn) {
               nb::gil_scoped_release release;
               c.close_fn();
             }
           },
           "Leaves the group now (gloo); later operations raise StateError.");

  m.def("local", &make_local, "A world of one worker (no communication).");
  m.def("threads_run", &threads_run, "size"_a, "fn"_a, "timeout"_a = 300.0);
#ifdef DILOCO_PYTHON_GLOO
  m.attr("has_gloo") = true;
  m.def("gloo", &make_gloo, "rank"_a, "size"_a, "store"_a, "run_id"_a = "diloco", "hostname"_a = "127.0.0.1",
        "iface"_a = "", "timeout"_a = 30.0, "local_world_size"_a = 0, "local_rank"_a = 0);
#else
  m.attr("has_gloo") = false;
#endif

  nb::list grid, grid_bf16, grid_fp16;
  for (const auto& [key, factory] : registry<float>()) grid.append(key);
  for (const auto& [key, factory] : registry<diloco::bfloat16>()) grid_bf16.append(key);
  for (const auto& [key, factory] : registry<diloco::float16>()) grid_fp16.append(key);
  m.attr("compiled") = grid;
  m.attr("compiled_bfloat16") = grid_bf16;
  m.attr("compiled_float16") = grid_fp16;

  nb::class_<py_trainer>(m, "Trainer")
      .def(nb::init<nb::list, py_comm*, const std::string&, float, float, float, float, bool, const std::string&,
                    const std::string&, std::size_t, std::size_t, std::size_t, float, std::uint64_t, bool, int,
                    nb::object>(),
           "params"_a, "comm"_a.none(), "outer"_a, "outer_lr"_a, "outer_momentum"_a, "outer_dampening"_a,
           "outer_weight_decay"_a, "outer_nesterov"_a, "compress"_a, "sync"_a, "inner_steps"_a, "fragments"_a,
           "delay"_a, "alpha"_a, "seed"_a, "broadcast_initial"_a, "host_threads"_a, "on_event"_a.none())
      .def("step", &py_trainer::step)
      .def("finish", &py_trainer::finish)
      .def("close", &py_trainer::close)
      .def("save", &py_trainer::save)
      .def("load", &py_trainer::load)
      .def("stats", [](const py_trainer& t) { return stats_dict(t.get().statistics()); })
      .def("global_flat",
           [](nb::handle self, const std::string& framework) -> nb::object {
             const py_trainer& t = nb::cast<const py_trainer&>(self);
             float* data = const_cast<float*>(t.get().global_data());
             const std::size_t n = t.get().global_size();
             // A view into theta_global that keeps this object alive.
             if (framework == "torch") return nb::cast(nb::ndarray<nb::pytorch, float, nb::ndim<1>>(data, {n}, self));
             return nb::cast(nb::ndarray<nb::numpy, const float, nb::ndim<1>>(data, {n}, self));
           },
           "framework"_a = "numpy")
      .def("global_offset", [](const py_trainer& t, std::size_t k) {
        if (k >= t.get().tensor_count()) throw nb::index_error("diloco: no such parameter tensor");
        return t.get().global_offset(k);
      })
      .def_prop_ro("rank", [](const py_trainer& t) { return t.get().rank(); })
      .def_prop_ro("world_size", [](const py_trainer& t) { return t.get().world_size(); })
      .def_prop_ro("steps_in_round", [](const py_trainer& t) { return t.get().steps_in_round(); })
      .def_prop_ro("parameter_count", [](const py_trainer& t) { return t.get().parameter_count(); })
      .def_prop_ro("policies", [](const py_trainer& t) { return t.get().policies(); });
}
