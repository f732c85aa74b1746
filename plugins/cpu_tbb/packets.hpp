// The vector vocabulary of the cpu_tbb kernels: row-major matrices, per-sample arrays and
// packets of one AVX-512 register's worth of samples.
#pragma once

#include <Eigen/Core>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

namespace polyprobe::cpu_tbb {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Arr = Eigen::Array<S, 1, Eigen::Dynamic>;  // one value per sample

// A register's worth of samples (one AVX-512 vector): the hot loops run over the batch in
// fixed-size packets, which Eigen compiles to straight-line vector code.
template <class S>
inline constexpr int kLanes = static_cast<int>(64 / sizeof(S));
template <class S>
using Packet = Eigen::Array<S, kLanes<S>, 1>;
template <class S>
using PacketMap = Eigen::Map<Packet<S>, Eigen::Unaligned>;
template <class S>
using ConstPacketMap = Eigen::Map<const Packet<S>, Eigen::Unaligned>;

// Bit i set where lane i of p compares with threshold as asked (false for NaN). Eigen's
// boolean arrays compile to scalar code; this is one vector compare where the instruction set
// has it.
enum class LaneTest { at_least, greater, at_most };
template <LaneTest test, class S>
inline uint32_t lanes_where(const Packet<S>& p, S threshold) {
#if defined(__AVX512F__)
  constexpr int predicate = test == LaneTest::at_least  ? _CMP_GE_OQ
                            : test == LaneTest::greater ? _CMP_GT_OQ
                                                        : _CMP_LE_OQ;
  if constexpr (std::is_same_v<S, float>)
    return _mm512_cmp_ps_mask(_mm512_loadu_ps(p.data()), _mm512_set1_ps(threshold), predicate);
  else
    return _mm512_cmp_pd_mask(_mm512_loadu_pd(p.data()), _mm512_set1_pd(threshold), predicate);
#else
  uint32_t mask = 0;
  for (int i = 0; i < kLanes<S>; ++i)
    if (test == LaneTest::at_least  ? p(i) >= threshold
        : test == LaneTest::greater ? p(i) > threshold
                                    : p(i) <= threshold)
      mask |= uint32_t{1} << i;
  return mask;
#endif
}
template <class S>
inline uint32_t lanes_at_least(const Packet<S>& p, S threshold) {
  return lanes_where<LaneTest::at_least>(p, threshold);
}
template <class S>
inline uint32_t lanes_greater(const Packet<S>& p, S threshold) {
  return lanes_where<LaneTest::greater>(p, threshold);
}

// Per lane, p > 0 ? if_positive : otherwise (otherwise for NaN): one masked blend where the
// instruction set has it (Eigen's select on a comparison compiles to a branch per lane).
template <class S>
inline Packet<S> select_positive(const Packet<S>& p, const Packet<S>& if_positive,
                                 const Packet<S>& otherwise) {
  Packet<S> out;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>)
    _mm512_storeu_ps(out.data(),
                     _mm512_mask_blend_ps(static_cast<__mmask16>(lanes_greater<S>(p, S(0))),
                                          _mm512_loadu_ps(otherwise.data()),
                                          _mm512_loadu_ps(if_positive.data())));
  else
    _mm512_storeu_pd(out.data(),
                     _mm512_mask_blend_pd(static_cast<__mmask8>(lanes_greater<S>(p, S(0))),
                                          _mm512_loadu_pd(otherwise.data()),
                                          _mm512_loadu_pd(if_positive.data())));
#else
  for (int i = 0; i < kLanes<S>; ++i) out(i) = p(i) > S(0) ? if_positive(i) : otherwise(i);
#endif
  return out;
}

// The first `count` (<= kLanes) values at p, zeros in the other lanes; reads nothing past them.
template <class S>
inline Packet<S> load_first(const S* p, int64_t count) {
#if defined(__AVX512F__)
  Packet<S> out;
  const auto mask = static_cast<uint16_t>((uint32_t{1} << count) - 1);
  if constexpr (std::is_same_v<S, float>)
    _mm512_storeu_ps(out.data(), _mm512_maskz_loadu_ps(mask, p));
  else
    _mm512_storeu_pd(out.data(), _mm512_maskz_loadu_pd(static_cast<uint8_t>(mask), p));
  return out;
#else
  Packet<S> out = Packet<S>::Zero();
  for (int64_t i = 0; i < count; ++i) out(i) = p[i];
  return out;
#endif
}

// The units j in [j0, end) whose pre-activation z_j may change sign (cross a ReLU kink) when
// moved by w_j * s, written to found in unit order; returns how many. The test runs a packet
// of units at a time with z + w * s fused into one rounding (the caller confirms each unit in
// its own arithmetic); units past the last whole packet of [j0, end) are written unfiltered
// (the caller tests them itself). end - j0 <= kCrossingChunk, the capacity of found.
inline constexpr int64_t kCrossingChunk = 256;
template <class S>
inline int collect_crossing(const S* z, const S* w, S s, int64_t j0, int64_t end, int32_t* found) {
  constexpr int lanes = kLanes<S>;
  const int64_t whole = j0 + (end - j0) / lanes * lanes;
  int count = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>) {
    // A few units of hundreds cross, in packets no branch predictor can foresee: each
    // packet's crossing units are packed by a vector compress (the register form: the memory
    // form is microcoded on some cores), no branch per packet.
    const __m512i step = _mm512_set1_epi32(lanes);
    const __m512 scale = _mm512_set1_ps(s), zero = _mm512_setzero_ps();
    __m512i index =
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j0)),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (; j0 < whole; j0 += lanes) {
      const __m512 before = _mm512_loadu_ps(z + j0);
      const __m512 after = _mm512_fmadd_ps(_mm512_loadu_ps(w + j0), scale, before);
      const __mmask16 m = static_cast<__mmask16>(_mm512_cmp_ps_mask(after, zero, _CMP_GT_OQ) ^
                                                 _mm512_cmp_ps_mask(before, zero, _CMP_GT_OQ));
      // found has room for a whole packet past count: count + lanes <= kCrossingChunk here.
      _mm512_storeu_si512(found + count, _mm512_maskz_compress_epi32(m, index));
      count += std::popcount(static_cast<uint32_t>(m));
      index = _mm512_add_epi32(index, step);
    }
  }
#endif
  for (; j0 < whole; j0 += lanes) {
    const Packet<S> before = ConstPacketMap<S>(z + j0);
    const Packet<S> after = before + ConstPacketMap<S>(w + j0) * s;
    for (uint32_t m = lanes_greater<S>(after, S(0)) ^ lanes_greater<S>(before, S(0)); m != 0;
         m &= m - 1)
      found[count++] = static_cast<int32_t>(j0 + std::countr_zero(m));
  }
  for (; j0 < end; ++j0) found[count++] = static_cast<int32_t>(j0);
  return count;
}

// Calls add(j) for the units j in [0, mid) that collect_crossing finds, in unit order.
template <class S, class Add>
inline void for_each_crossing(const S* z, const S* w, S s, int64_t mid, Add&& add) {
  alignas(64) int32_t found[kCrossingChunk];
  for (int64_t j0 = 0; j0 < mid; j0 += kCrossingChunk) {
    const int count = collect_crossing(z, w, s, j0, std::min(mid, j0 + kCrossingChunk), found);
    for (int i = 0; i < count; ++i) add(static_cast<int64_t>(found[i]));
  }
}

}  // namespace polyprobe::cpu_tbb
