// Header-only C++ helpers for plugin authors, over plugin/abi.h.
//
// A plugin written in C++ uses exceptions and RAII inside, and this header turns them into
// the ABI's status codes at the boundary: every function pointer a plugin hands out goes
// through pp::guard, so no exception ever crosses into the host. It depends on nothing but
// the C++ standard library and plugin/abi.h, so a third-party plugin needs no other part
// of polyprobe (it does not link the core).
#pragma once

#include <polyprobe/plugin/abi.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

// Marks the one exported symbol of a plugin; everything else stays hidden.
#define POLYPROBE_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace pp {

// Writes a reason into a pp_error (truncating), tolerating a null error pointer.
inline void set_error(pp_error* err, std::string_view message) {
  if (err == nullptr) return;
  const std::size_t n = std::min(message.size(), sizeof(err->message) - 1);
  std::memcpy(err->message, message.data(), n);
  err->message[n] = '\0';
}

// Runs `body` and converts any exception into PP_FAILED with its message.
template <class Body>
int guard(pp_error* err, Body&& body) noexcept {
  try {
    body();
    return PP_OK;
  } catch (const std::exception& e) {
    set_error(err, e.what());
  } catch (...) {
    set_error(err, "unknown exception");
  }
  return PP_FAILED;
}

template <class T>
constexpr int32_t dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return PP_DTYPE_F32;
  else if constexpr (std::is_same_v<T, double>)
    return PP_DTYPE_F64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return PP_DTYPE_I64;
  else
    static_assert(sizeof(T) == 0, "no pp_dtype for this type");
}

inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case PP_DTYPE_F32:
      return "float32";
    case PP_DTYPE_F64:
      return "float64";
    case PP_DTYPE_I64:
      return "int64";
    case PP_DTYPE_BF16:
      return "bfloat16";
    case PP_DTYPE_F16:
      return "float16";
    default:
      return "unknown";
  }
}

inline int64_t numel(const pp_tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// The data of a contiguous CPU tensor as a typed span; throws when dtype or layout differ.
template <class T>
std::span<T> as_span(const pp_tensor& t) {
  if (t.dtype != dtype_of<std::remove_const_t<T>>())
    throw std::invalid_argument(std::string("tensor has dtype ") + dtype_name(t.dtype) +
                                ", expected " + dtype_name(dtype_of<std::remove_const_t<T>>()));
  if (t.device != PP_DEVICE_TYPE_CPU) throw std::invalid_argument("tensor is not in CPU memory");
  if (t.strides != nullptr) {
    int64_t expected = 1;
    for (int32_t i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected)
        throw std::invalid_argument("tensor is not contiguous row-major");
      expected *= t.shape[i];
    }
  }
  return {static_cast<T*>(t.data), static_cast<std::size_t>(numel(t))};
}

// Whether this CPU has the instruction set the calling plugin was compiled for (-march:
// AVX-512, AVX2 and FMA are checked); false with the reason in *why when it lacks one, so a
// plugin's probe can refuse instead of crashing on an illegal instruction.
inline bool probe_cpu_isa(pp_error* why) {
#if defined(__x86_64__)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) {
    set_error(why, "built for AVX-512 (-march), which this CPU lacks");
    return false;
  }
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    set_error(why, "built for AVX2 and FMA (-march), which this CPU lacks");
    return false;
  }
#endif
#endif
  (void)why;
  return true;
}

// The number of rows of a [rows, ...] tensor and the elements per row.
inline int64_t rows(const pp_tensor& t) { return t.ndim == 0 ? 1 : t.shape[0]; }
inline int64_t row_size(const pp_tensor& t) { return t.ndim == 0 ? 1 : numel(t) / t.shape[0]; }

// ---- Layer kinds ----------------------------------------------------------------------
//
// A layer class L provides:
//   static std::unique_ptr<L> create(std::string_view attrs_json, std::span<const int64_t>
//   in_shape); void describe(pp_layer_info& info) const;     // output shape, parameters, contract
//   template <class T> void forward(std::span<const T> in, int64_t batch,
//                                   std::span<const T> params, std::span<T> out) const;
// and optionally
//   void init_params(uint64_t seed, std::span<double> params) const;
// make_layer_kind<L>(kind, summary) turns it into the ABI's pp_layer_kind.
template <class L>
struct LayerAdapter {
  static int create(const char* attrs_json, int32_t in_ndim, const int64_t* in_shape, void** self,
                    pp_error* err) {
    return guard(err, [&] {
      auto layer = L::create(attrs_json ? attrs_json : "{}",
                             std::span<const int64_t>(in_shape, static_cast<std::size_t>(in_ndim)));
      *self = layer.release();
    });
  }
  static void destroy(void* self) { delete static_cast<L*>(self); }
  static int describe(const void* self, pp_layer_info* info, pp_error* err) {
    return guard(err, [&] {
      *info = pp_layer_info{};
      info->struct_size = sizeof(pp_layer_info);
      static_cast<const L*>(self)->describe(*info);
    });
  }
  template <class T>
  static void run(const L& layer, const pp_tensor& in, const pp_tensor& params, pp_tensor& out) {
    layer.template forward<T>(as_span<const T>(in), rows(in), as_span<const T>(params),
                              as_span<T>(out));
  }
  static int forward(const void* self, const pp_tensor* in, const pp_tensor* params, pp_tensor* out,
                     pp_error* err) {
    return guard(err, [&] {
      const L& layer = *static_cast<const L*>(self);
      if (in->dtype == PP_DTYPE_F32)
        run<float>(layer, *in, *params, *out);
      else if (in->dtype == PP_DTYPE_F64)
        run<double>(layer, *in, *params, *out);
      else
        throw std::invalid_argument(std::string("unsupported dtype ") + dtype_name(in->dtype));
    });
  }
  static int init_params(const void* self, uint64_t seed, double* params, int64_t count,
                         pp_error* err) {
    return guard(err, [&] {
      static_cast<const L*>(self)->init_params(
          seed, std::span<double>(params, static_cast<std::size_t>(count)));
    });
  }
};

template <class L>
constexpr pp_layer_kind make_layer_kind(const char* kind, const char* summary) {
  pp_layer_kind k{};
  k.struct_size = sizeof(pp_layer_kind);
  k.kind = kind;
  k.summary = summary;
  k.create = &LayerAdapter<L>::create;
  k.destroy = &LayerAdapter<L>::destroy;
  k.describe = &LayerAdapter<L>::describe;
  k.forward = &LayerAdapter<L>::forward;
  if constexpr (requires(const L& l, uint64_t s, std::span<double> p) { l.init_params(s, p); })
    k.init_params = &LayerAdapter<L>::init_params;
  return k;
}

// ---- Evaluator sessions ---------------------------------------------------------------
//
// A session class S provides (each may throw; the message becomes the call's pp_error):
//   void set_batch(const pp_batch_view& batch);
//   void set_particles(const pp_particle_layout& layout);
//   void set_incumbent(const pp_tensor& theta);
//   void move_incumbent(const double* moves);
//   void score(const pp_score_request& request, double* losses, double* incumbent_loss);
//   void read_incumbent(pp_tensor& theta);           // may be const
// and optionally
//   const char* explain();                           // JSON, valid until the next call
//   void transport(const pp_transport_request& request);
//   bool draws_rotations(int32_t d);                 // (with transport) may be const
// make_session_api<S>() turns it into the ABI's pp_session_api (the optional members are
// NULL when S lacks them), and hand_over_session() gives a created session to the host.
template <class S>
struct SessionAdapter {
  static S& session(void* self) { return *static_cast<S*>(self); }
  static int set_batch(void* self, const pp_batch_view* batch, pp_error* err) {
    return guard(err, [&] { session(self).set_batch(*batch); });
  }
  static int set_particles(void* self, const pp_particle_layout* layout, pp_error* err) {
    return guard(err, [&] { session(self).set_particles(*layout); });
  }
  static int set_incumbent(void* self, const pp_tensor* theta, pp_error* err) {
    return guard(err, [&] { session(self).set_incumbent(*theta); });
  }
  static int move_incumbent(void* self, const double* moves, pp_error* err) {
    return guard(err, [&] { session(self).move_incumbent(moves); });
  }
  static int score(void* self, const pp_score_request* request, double* losses,
                   double* incumbent_loss, pp_error* err) {
    return guard(err, [&] { session(self).score(*request, losses, incumbent_loss); });
  }
  static int read_incumbent(void* self, pp_tensor* theta, pp_error* err) {
    return guard(err, [&] { session(self).read_incumbent(*theta); });
  }
  // explain has no error channel: a failure reads as "nothing to explain".
  static const char* explain(void* self) noexcept {
    try {
      return session(self).explain();
    } catch (...) {
      return nullptr;
    }
  }
  static int transport(void* self, const pp_transport_request* request, pp_error* err) {
    return guard(err, [&] { session(self).transport(*request); });
  }
  // A question, not a call that can fail: an exception reads as "no".
  static int draws_rotations(void* self, int32_t d) noexcept {
    try {
      return session(self).draws_rotations(d) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }
  static void destroy(void* self) noexcept { delete static_cast<S*>(self); }
};

template <class S>
constexpr pp_session_api make_session_api() {
  pp_session_api api{};
  api.struct_size = sizeof(pp_session_api);
  api.set_batch = &SessionAdapter<S>::set_batch;
  api.set_particles = &SessionAdapter<S>::set_particles;
  api.set_incumbent = &SessionAdapter<S>::set_incumbent;
  api.move_incumbent = &SessionAdapter<S>::move_incumbent;
  api.score = &SessionAdapter<S>::score;
  api.read_incumbent = &SessionAdapter<S>::read_incumbent;
  api.destroy = &SessionAdapter<S>::destroy;
  if constexpr (requires(S & s) {
                  { s.explain() } -> std::convertible_to<const char*>;
                })
    api.explain = &SessionAdapter<S>::explain;
  if constexpr (requires(S & s, const pp_transport_request& r) { s.transport(r); })
    api.transport = &SessionAdapter<S>::transport;
  if constexpr (requires(S & s, int32_t d) {
                  { s.draws_rotations(d) } -> std::convertible_to<bool>;
                })
    api.draws_rotations = &SessionAdapter<S>::draws_rotations;
  return api;
}

// The one table per session class that make_session_api<S>() builds.
template <class S>
inline constexpr pp_session_api session_api_of = make_session_api<S>();

// Gives a created session to the host: the outputs of pp_plugin::session_create. The host
// frees it through the table's destroy.
template <class S>
void hand_over_session(std::unique_ptr<S> session, void** self, const pp_session_api** api) {
  *api = &session_api_of<S>;
  *self = session.release();
}

// The body of a pp_plugin::session_supports: `reason()` returns why the session cannot serve
// (empty when it can); 1 when it can, else 0 with the reason (or the exception's message).
template <class Reason>
int answer_supports(pp_error* why, Reason&& reason) noexcept {
  try {
    const std::string text = reason();
    if (text.empty()) return 1;
    set_error(why, text);
  } catch (const std::exception& e) {
    set_error(why, e.what());
  } catch (...) {
    set_error(why, "unknown exception");
  }
  return 0;
}

// Fills a pp_param_spec.
inline pp_param_spec param_spec(const char* name, std::initializer_list<int64_t> shape) {
  pp_param_spec s{};
  s.name = name;
  s.ndim = static_cast<int32_t>(shape.size());
  std::copy(shape.begin(), shape.end(), s.shape);
  return s;
}

// Sets the per-sample output shape of a pp_layer_info.
inline void set_out_shape(pp_layer_info& info, std::span<const int64_t> shape) {
  if (shape.size() > PP_MAX_DIMS) throw std::invalid_argument("output shape has too many dims");
  info.out_ndim = static_cast<int32_t>(shape.size());
  std::copy(shape.begin(), shape.end(), info.out_shape);
}

}  // namespace pp
