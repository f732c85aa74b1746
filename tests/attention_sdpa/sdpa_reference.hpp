// A plain float64 reference of the "sdpa" operation (operations.h) and random problems for
// the attention_sdpa tests: the textbook formula, one score row at a time, no tiling.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace polyprobe::test {

// A random problem with its own storage; strides in elements (b0, b1, head, row).
template <class S>
struct SdpaProblem {
  pp_sdpa_args args{};
  std::vector<S> q, k, v, out;
};

// Sizes, weighting, mask and layout drawn from `rng`: sometimes K and V shared across b0
// (stride 0), sometimes padded rows, sometimes duplicated keys (exact argmax ties).
template <class S>
SdpaProblem<S> random_problem(std::mt19937_64& rng, int64_t max_len = 40) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  SdpaProblem<S> p;
  pp_sdpa_args& a = p.args;
  a.struct_size = sizeof(a);
  a.dtype = sizeof(S) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
  a.weighting = pick(0, 1) == 0 ? PP_SDPA_SOFTMAX : PP_SDPA_ARGMAX;
  a.causal = static_cast<int32_t>(pick(0, 1));
  a.b0 = pick(1, 3), a.b1 = pick(1, 3), a.heads = pick(1, 3);
  a.q_len = pick(1, max_len);
  a.kv_len = pick(0, 1) == 0 ? a.q_len : pick(1, max_len + 30);
  a.head_dim = pick(1, 20), a.v_dim = pick(1, 20);
  a.scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  const bool share_kv = pick(0, 1) == 1;
  auto layout = [&](int64_t rows, int64_t cols, int64_t* st, bool shared) {
    st[3] = cols + pick(0, 2);  // padded rows sometimes
    st[2] = rows * st[3];
    st[1] = a.heads * st[2];
    st[0] = shared ? 0 : a.b1 * st[1];
    return (shared ? 1 : a.b0) * a.b1 * a.heads * rows * st[3];
  };
  std::normal_distribution<double> gauss(0.0, 1.5);
  auto fill = [&](std::vector<S>& t, int64_t n) {
    t.resize(static_cast<std::size_t>(n));
    for (S& x : t) x = static_cast<S>(gauss(rng));
  };
  fill(p.q, layout(a.q_len, a.head_dim, a.q_strides, false));
  fill(p.k, layout(a.kv_len, a.head_dim, a.k_strides, share_kv));
  fill(p.v, layout(a.kv_len, a.v_dim, a.v_strides, share_kv));
  p.out.assign(static_cast<std::size_t>(layout(a.q_len, a.v_dim, a.out_strides, false)), S(-7));
  if (a.weighting == PP_SDPA_ARGMAX && a.kv_len > 2 && pick(0, 1) == 1) {
    // Exact ties: some keys copy an earlier key, so equal scores meet the tie rule.
    const auto row = static_cast<std::size_t>(a.k_strides[3]);
    const auto block = static_cast<std::size_t>(a.k_strides[2]);
    for (int64_t j = 1; j < a.kv_len; ++j) {
      if (pick(0, 2) != 0) continue;
      const auto src = static_cast<std::size_t>(pick(0, j - 1));
      for (std::size_t base = 0; base + block <= p.k.size(); base += block)
        for (int64_t d = 0; d < a.head_dim; ++d)
          p.k[base + static_cast<std::size_t>(j) * row + static_cast<std::size_t>(d)] =
              p.k[base + src * row + static_cast<std::size_t>(d)];
    }
  }
  a.q = p.q.data(), a.k = p.k.data(), a.v = p.v.data(), a.out = p.out.data();
  return p;
}

// The reference output of `a`, computed in float64 from its inputs, in `out`'s layout.
template <class S>
std::vector<double> reference_sdpa(const pp_sdpa_args& a) {
  const auto* q = static_cast<const S*>(a.q);
  const auto* k = static_cast<const S*>(a.k);
  const auto* v = static_cast<const S*>(a.v);
  std::vector<double> out(
      static_cast<std::size_t>(a.b0 * a.b1 * a.heads * a.q_len * a.out_strides[3]), 0.0);
  std::vector<double> w(static_cast<std::size_t>(a.kv_len));
  for (int64_t b0 = 0; b0 < a.b0; ++b0)
    for (int64_t b1 = 0; b1 < a.b1; ++b1)
      for (int64_t h = 0; h < a.heads; ++h) {
        auto at = [&](const int64_t* st) { return b0 * st[0] + b1 * st[1] + h * st[2]; };
        const S* qp = q + at(a.q_strides);
        const S* kp = k + at(a.k_strides);
        const S* vp = v + at(a.v_strides);
        double* op = out.data() + at(a.out_strides);
        for (int64_t i = 0; i < a.q_len; ++i) {
          const int64_t n = a.causal ? std::min(a.kv_len, i + 1) : a.kv_len;
          int64_t best = 0;
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t d = 0; d < a.head_dim; ++d)
              s += static_cast<double>(qp[i * a.q_strides[3] + d]) *
                   static_cast<double>(kp[j * a.k_strides[3] + d]);
            w[static_cast<std::size_t>(j)] = s * a.scale;
            if (w[static_cast<std::size_t>(j)] > w[static_cast<std::size_t>(best)]) best = j;
          }
          double sum = 0;
          const double top = w[static_cast<std::size_t>(best)];  // read before it is overwritten
          for (int64_t j = 0; j < n; ++j) {
            double& x = w[static_cast<std::size_t>(j)];
            x = a.weighting == PP_SDPA_ARGMAX ? (j == best ? 1.0 : 0.0) : std::exp(x - top);
            sum += x;
          }
          for (int64_t c = 0; c < a.v_dim; ++c) {
            double acc = 0;
            for (int64_t j = 0; j < n; ++j)
              acc +=
                  w[static_cast<std::size_t>(j)] * static_cast<double>(vp[j * a.v_strides[3] + c]);
            op[i * a.out_strides[3] + c] = acc / sum;
          }
        }
      }
  return out;
}

}  // namespace polyprobe::test
