// unit_change.hpp. Compiled with -ffp-contract=off (CMakeLists.txt): the general route
// stores each product before adding it, and a fused multiply-add would round differently.
#include "unit_change.hpp"

#include "packets.hpp"

namespace polyprobe::cpu_tbb {

// relu(v) is select_positive(v, v, 0): v > 0 ? v : 0, and 0 for NaN, as the scalar test.
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
      const Packet<S> v = ConstPacketMap<S>(z + b) + dz;
      PacketMap<S>{o + b} =
          select_positive<S>(v, v, Packet<S>::Zero()) - ConstPacketMap<S>(relu_z + b);
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
