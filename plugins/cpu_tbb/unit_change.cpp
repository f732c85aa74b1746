// unit_change.hpp. Compiled with -ffp-contract=off (CMakeLists.txt): the general route
// stores each product before adding it, and a fused multiply-add would round differently.
#include "unit_change.hpp"

#include "packets.hpp"

namespace polyprobe::cpu_tbb {
namespace {

// v > 0 ? v : 0 in every lane, 0 for NaN (as the scalar test).
template <class S>
Packet<S> relu_lanes(const Packet<S>& v) {
#if defined(__AVX512F__)
  // MAXPS returns its second operand when the first is NaN or both are zero.
  Packet<S> out;
  if constexpr (std::is_same_v<S, float>)
    _mm512_storeu_ps(out.data(), _mm512_max_ps(_mm512_loadu_ps(v.data()), _mm512_setzero_ps()));
  else
    _mm512_storeu_pd(out.data(), _mm512_max_pd(_mm512_loadu_pd(v.data()), _mm512_setzero_pd()));
  return out;
#else
  Packet<S> out;
  for (int i = 0; i < kLanes<S>; ++i) out(i) = v(i) > S(0) ? v(i) : S(0);
  return out;
#endif
}

}  // namespace

template <class S>
void unit_relu_change(const S* z, const S* relu_z, const S* const* x, const S* theta,
                      int64_t n_terms, int64_t n, int64_t batch, S* out) {
  constexpr int lanes = kLanes<S>;
  const int64_t whole = batch / lanes * lanes;
  for (int64_t i = 0; i < n; ++i) {
    const S* th = theta + i * n_terms;
    S* o = out + i * batch;
    for (int64_t b = 0; b < whole; b += lanes) {
      Packet<S> dz = Packet<S>::Zero();
      for (int64_t t = 0; t < n_terms; ++t) {
        Packet<S> term = Packet<S>::Constant(th[t]);
        if (x[t] != nullptr) term = ConstPacketMap<S>(x[t] + b) * th[t];
        dz = dz + term;
      }
      PacketMap<S>{o + b} =
          relu_lanes<S>(ConstPacketMap<S>(z + b) + dz) - ConstPacketMap<S>(relu_z + b);
    }
    for (int64_t b = whole; b < batch; ++b) {
      S dz = 0;
      for (int64_t t = 0; t < n_terms; ++t) dz = dz + (x[t] == nullptr ? th[t] : x[t][b] * th[t]);
      const S v = z[b] + dz;
      o[b] = (v > S(0) ? v : S(0)) - relu_z[b];
    }
  }
}

template void unit_relu_change<float>(const float*, const float*, const float* const*, const float*,
                                      int64_t, int64_t, int64_t, float*);
template void unit_relu_change<double>(const double*, const double*, const double* const*,
                                       const double*, int64_t, int64_t, int64_t, double*);

}  // namespace polyprobe::cpu_tbb
