// The delta paths: `sparse` (full space) and `subspace-delta` (rank-one subspaces).
//
// A particle's coordinates are rank-one changes of affine layers (Term): a full-space
// weight W[o, i] changes the pre-activation by theta e_o (x_i), a subspace A-coordinate by
// theta e_o (v^T x), a B-coordinate by theta u (x_i). The change of a group's candidates
// is carried forward as a delta, feature-major [features, candidates * batch]:
//   - sparse (a few units) while it only touched one-hot rows, through elementwise layers
//     as f(a + delta) - f(a), computed exactly;
//   - dense one affine layer later (W delta, one GEMM per group);
//   - whole activations after a host layer (its forward on a + delta, stacked).
// The loss comes from the incumbent's outputs plus the final delta.
//
// Kink tables. When sparse units enter affine layer l followed by ReLU and affine l+2,
// the response of l+2 to unit u for sample b is M_b[:, u] = W_{l+2} diag(mask_b) W_l[:, u]
// as long as no ReLU unit changes side. inv_room[u, b] = max_j |W_l[j, u]| / |z_jb| bounds
// that: if sum_k |delta_k,b| inv_room[u_k, b] < 1/2, every |dz_j| < |z_j| / 2, so no unit
// crosses its kink and the linear response is exact; other samples are recomputed
// exactly. This turns a dense (out_{l+1} x out_{l+2}) suffix per sample into out_{l+2}
// multiply-adds. The tables cost B out_{l+2} out_{l+1} in_l per call, so they are built
// only when more than in_l candidates would use them.
#include "delta_path.hpp"

#include "unit_change.hpp"

#include <polyprobe/plugin/kernels/activations.hpp>
#include <polyprobe/plugin/kernels/lif.hpp>
#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace polyprobe::cpu_tbb {
namespace {
// Input units whose kink-table responses are one product: fixed, so a unit's column is the same
// bits whichever other blocks a call builds (a rank of a sharded step builds only those its
// slice's candidates read).
constexpr int64_t kUnitBlock = 32;
}  // namespace

template <class S>
std::vector<char> DeltaPath<S>::changed_units(std::size_t layer, int64_t units) const {
  std::vector<char> changed(static_cast<std::size_t>(units), 0);
  // A sparse change reaches `layer`'s input from the nearest affine layer before it through
  // elementwise layers only; anything else (a host layer between, none before): every unit.
  int64_t source = static_cast<int64_t>(layer) - 1;
  while (source >= 0 &&
         ctx_.plan.layers[static_cast<std::size_t>(source)].op == LayerOp::elementwise)
    --source;
  if (source < 0 || ctx_.plan.layers[static_cast<std::size_t>(source)].op != LayerOp::affine ||
      ctx_.plan.layers[static_cast<std::size_t>(source)].out != units)
    return std::vector<char>(changed.size(), 1);
  const std::vector<Term>& terms = ctx_.planner->terms();
  for (const std::size_t i : ctx_.planner->selected()) {
    const Group& g = ctx_.planner->groups()[i];
    if (g.path != Path::delta) continue;
    for (int64_t k = g.terms_begin; k < g.terms_end; ++k) {
      const Term& t = terms[static_cast<std::size_t>(k)];
      if (t.layer != source) continue;
      if (t.row < 0 || t.row >= units) return std::vector<char>(changed.size(), 1);  // dense u
      changed[static_cast<std::size_t>(t.row)] = 1;
    }
  }
  return changed;
}

template <class S>
double DeltaPath<S>::table_bytes() const {
  double values = 0;
  for (const KinkTable& k : kink_)
    if (k.built) values += static_cast<double>(k.response.size() + k.inv_room.size());
  return sizeof(S) * values;
}

template <class S>
void DeltaPath<S>::apply_elementwise(const LayerPlan& layer, const S* in, S* out, int64_t count,
                                     Scratch& s) const {
  if (layer.is_relu) {
    for (int64_t i = 0; i < count; ++i) out[i] = in[i] > S(0) ? in[i] : S(0);
    return;
  }
  if (layer.view->op == PP_OP_ACTIVATION && layer.view->op_attrs != nullptr) {
    // A built-in activation: its formula (kernels/activations.hpp, as the core's layer
    // evaluates it), without the host call's buffers.
    const auto& attrs = *static_cast<const pp_activation_attrs*>(layer.view->op_attrs);
    const auto each = [&](auto f) {
      for (int64_t i = 0; i < count; ++i) out[i] = f(in[i]);
    };
    switch (attrs.fn) {
      case PP_ACT_IDENTITY:
        std::copy(in, in + count, out);
        return;
      case PP_ACT_SIGN:
        each([](S v) { return kernels::sign(v); });
        return;
      case PP_ACT_STAIRCASE:
        each([step = static_cast<S>(attrs.step)](S v) { return kernels::staircase(v, step); });
        return;
      case PP_ACT_GELU:
        each([](S v) { return kernels::gelu(v); });
        return;
      case PP_ACT_GELU_TANH:
        each([](S v) { return kernels::gelu_tanh(v); });
        return;
      case PP_ACT_TANH:  // Eigen's tanh, as the core's layer
        Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>(out, count) =
            Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(in, count).tanh();
        return;
      default:
        break;  // a function this plugin does not know: the host's forward
    }
  }
  if (layer.view->op == PP_OP_LIF && layer.view->op_attrs != nullptr) {
    const auto& lif = *static_cast<const pp_lif_attrs*>(layer.view->op_attrs);
    kernels::lif_rates(in, out, count, lif.steps, static_cast<S>(lif.beta),
                       static_cast<S>(lif.threshold), lif.reset_to_zero != 0);
    return;
  }
  // The layer's own forward on a flat buffer viewed as rows of its width: probed to be
  // elementwise and indifferent to where a value sits.
  const int64_t width = layer.in, rows = (count + width - 1) / width;
  s.buffer.assign(static_cast<std::size_t>(rows * width), S(0));
  s.buffer_out.resize(static_cast<std::size_t>(rows * width));
  std::copy(in, in + count, s.buffer.begin());
  const int32_t dtype = pp::dtype_of<S>();
  const int64_t shape[2] = {rows, width}, p_shape[1] = {0};
  pp_tensor tin{s.buffer.data(), dtype, PP_DEVICE_TYPE_CPU, 0, 2, shape, nullptr};
  pp_tensor tp{s.buffer.data(), dtype, PP_DEVICE_TYPE_CPU, 0, 1, p_shape, nullptr};
  pp_tensor tout{s.buffer_out.data(), dtype, PP_DEVICE_TYPE_CPU, 0, 2, shape, nullptr};
  pp_error err{};
  if (layer.view->host_forward(layer.view->host_layer, &tin, &tp, &tout, &err) != PP_OK)
    throw std::runtime_error(std::string("layer '") + layer.view->kind + "': " + err.message);
  std::copy(s.buffer_out.begin(), s.buffer_out.begin() + count, out);
}

namespace {
// The units of `used` not yet in `done` (sized to `used` on first use); marks them done.
std::vector<char> not_yet(const std::vector<char>& used, std::vector<char>& done) {
  if (done.size() != used.size()) done.assign(used.size(), 0);
  std::vector<char> need(used.size(), 0);
  for (std::size_t u = 0; u < used.size(); ++u)
    if (used[u] != 0 && done[u] == 0) need[u] = done[u] = 1;
  return need;
}
}  // namespace

template <class S>
void DeltaPath<S>::build_tables() {
  // Within one generation of the incumbent cache (one incumbent on one batch) the tables only
  // grow: a call builds the units its candidates read that no earlier call of the generation
  // built (the chunks of a sharded step share one incumbent).
  const bool fresh = tables_generation_ != ctx_.inc.generation;
  tables_generation_ = 0;  // until complete
  if (fresh) {
    last_layer_done_.clear();
    for (KinkTable& k : kink_) k.block_done.clear(), k.cumulant_done.clear();
  }
  build_kink_tables();
  if (fresh) build_direction_tables();  // a function of the incumbent alone
  tables_generation_ = ctx_.inc.generation;
}

template <class S>
void DeltaPath<S>::build_kink_tables() {
  const std::size_t n_layers = ctx_.plan.layers.size();
  // Cumulants of the last layer's columns, when enough candidates will change one unit
  // feeding it (rank-one logit changes; float32 cross-entropy only). A direction's series
  // costs about what three candidates' exact losses cost over the batch (measured on
  // mnist128-sub256 and mlp256-sub512, where 1.1-2.3 users per direction made the table a
  // loss), hence the factor.
  last_layer_cumulants_.built = false;
  if (std::is_same_v<S, float> && ctx_.loss == kernels::LossKind::cross_entropy && n_layers > 0 &&
      ctx_.plan.layers.back().op == LayerOp::affine) {
    const LayerPlan& last = ctx_.plan.layers.back();
    // Its users change one unit of the last layer's input: candidates of the two layers before
    // it (an affine layer and its activation). None, none is built (a cnn's last layer follows
    // a pooling layer, and its own 47,000 candidates never read it). The threshold still
    // counts the last layer's own candidates, as it did when it was tuned: which route a
    // candidate takes decides its float32 rounding, so this keeps every loss's bits, and the
    // ranks of a sharded run deciding as before (docs/scale.md).
    int64_t users = 0;
    for (std::size_t k = n_layers >= 3 ? n_layers - 3 : 0; k + 1 < n_layers; ++k)
      users += ctx_.planner->threshold_candidates()[k];
    const int64_t own = ctx_.planner->threshold_candidates()[n_layers - 1];
    if (users > 0 && users + own > 3 * last.in) {
      // The directions this call reads: the units its candidates change at the last layer's input.
      const std::vector<char> need =
          not_yet(changed_units(n_layers - 1, last.in), last_layer_done_);
      build_cumulants(last_layer_cumulants_, last.in, ctx_.inc.eff.data() + last.offset, 1, last.in,
                      0, need);
    }
  }
  for (std::size_t l = 0; l + 2 < n_layers; ++l) {
    KinkTable& table = kink_[l];
    table.built = false;
    const LayerPlan &first = ctx_.plan.layers[l], &relu = ctx_.plan.layers[l + 1],
                    &second = ctx_.plan.layers[l + 2];
    if (first.op != LayerOp::affine || relu.op != LayerOp::elementwise || !relu.is_relu ||
        second.op != LayerOp::affine)
      continue;
    int64_t users = 0;  // delta candidates whose sparse change can reach layer l
    for (std::size_t k = l >= 2 ? l - 2 : 0; k < l; ++k)
      users += ctx_.planner->threshold_candidates()[k];
    if (users <= first.in) continue;
    const int64_t in = first.in, mid = first.out, out = second.out, batch = ctx_.inc.batch;
    // Only the blocks of units this call's candidates change (all of them in one process; a
    // rank of a sharded step reads a few): the rest of the table is left as it was, unread.
    const std::vector<char> used = changed_units(l, in);
    const bool started = !table.block_done.empty();  // this generation built blocks already
    if (!started)
      table.block_done.assign(static_cast<std::size_t>((in + kUnitBlock - 1) / kUnitBlock), 0);
    std::vector<int64_t> blocks;  // first unit of each block to build
    for (int64_t u0 = 0; u0 < in; u0 += kUnitBlock)
      if (table.block_done[static_cast<std::size_t>(u0 / kUnitBlock)] == 0 &&
          std::any_of(used.begin() + u0, used.begin() + std::min(in, u0 + kUnitBlock),
                      [](char c) { return c != 0; })) {
        blocks.push_back(u0);
        table.block_done[static_cast<std::size_t>(u0 / kUnitBlock)] = 1;
      }
    // It counts as built, as the whole step decided: every block this call's candidates read
    // is built (by this call or an earlier one of the generation), and one whose candidates
    // read none computes nothing (the incumbent's activations it would read are not even
    // transposed for this call).
    table.built = true;
    table.cumulants.built = false;
    if (blocks.empty() && std::none_of(used.begin(), used.end(), [](char c) { return c != 0; }))
      continue;
    const Mat<S>& z = ctx_.inc.acts_t[l + 1];  // [mid, batch], the ReLU's input
    const Eigen::Map<const Mat<S>> w_first(ctx_.inc.eff.data() + first.offset, mid, in);
    const Eigen::Map<const Mat<S>> w_second(ctx_.inc.eff.data() + second.offset, out, mid);
    Mat<S>& abs_first_t = table.abs_weights;  // [in, mid], kept between calls
    if (!started) {
      table.response.resize(in * out, batch);
      table.inv_room.resize(in, batch);
      table.room_up.resize(in, batch);
      table.room_down.resize(in, batch);
      abs_first_t = ctx_.inc.weights_t[l].cwiseAbs();
    }
    if (!blocks.empty())
      ctx_.arena->execute([&] {
        tbb::parallel_for(
            tbb::blocked_range<int64_t>(0, batch), [&](const tbb::blocked_range<int64_t>& r) {
              Mat<S> masked(out, mid), response(out, kUnitBlock);
              Eigen::Array<S, 1, Eigen::Dynamic> inv_z(mid), signed_inv_z(mid), ratio(mid);
              for (int64_t b = r.begin(); b != r.end(); ++b) {
                for (int64_t j = 0; j < mid; ++j) {
                  const S zj = z(j, b);
                  if (zj > S(0))
                    masked.col(j) = w_second.col(j);
                  else
                    masked.col(j).setZero();
                  inv_z(j) = S(1) / std::max(std::abs(zj), std::numeric_limits<S>::min());
                  signed_inv_z(j) = zj < S(0) ? -inv_z(j) : inv_z(j);
                }
                // A unit exactly at its kink crosses for any move: that sample is always exact.
                const bool at_kink = (z.col(b).array() == S(0)).any();
                for (const int64_t u0 : blocks) {
                  const int64_t width = std::min(kUnitBlock, in - u0);
                  response.leftCols(width).noalias() = masked * w_first.middleCols(u0, width);
                  for (int64_t u = u0; u < u0 + width; ++u) {
                    table.response.col(b).segment(u * out, out) = response.col(u - u0);
                    table.inv_room(u, b) = (abs_first_t.row(u).array() * inv_z).maxCoeff();
                    ratio = ctx_.inc.weights_t[l].row(u).array() * signed_inv_z;
                    table.room_up(u, b) =
                        at_kink ? std::numeric_limits<S>::max() : (-ratio).maxCoeff();
                    table.room_down(u, b) =
                        at_kink ? std::numeric_limits<S>::max() : ratio.maxCoeff();
                  }
                }
              }
            });
      });
    if (std::is_same_v<S, float> && ctx_.loss == kernels::LossKind::cross_entropy &&
        l + 3 == n_layers)
      build_cumulants(table.cumulants, in, table.response.data(), out * batch, batch, 1,
                      not_yet(used, table.cumulant_done));
  }
}

template <class S>
void DeltaPath<S>::build_direction_tables() {
  direction_.resize(ctx_.dense_u.size());
  const std::size_t n_layers = ctx_.plan.layers.size();
  // Every direction's table is independent: split over threads (each table is written by
  // one thread, so the tables are the same for any thread count).
  ctx_.arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, ctx_.dense_u.size(), 4),
        [&](const tbb::blocked_range<std::size_t>& range) {
          Mat<S> masked;
          for (std::size_t k = range.begin(); k != range.end(); ++k) {
            DirectionTable& table = direction_[k];
            table.built = false;
            const auto l = static_cast<std::size_t>(ctx_.dense_u_layer[k]);
            if (l + 2 >= n_layers || ctx_.plan.layers[l].op != LayerOp::affine ||
                ctx_.plan.layers[l + 1].op != LayerOp::elementwise ||
                !ctx_.plan.layers[l + 1].is_relu || ctx_.plan.layers[l + 2].op != LayerOp::affine ||
                static_cast<int64_t>(ctx_.dense_u[k].size()) != ctx_.plan.layers[l].out)
              continue;
            const LayerPlan& second = ctx_.plan.layers[l + 2];
            const int64_t mid = ctx_.plan.layers[l].out, batch = ctx_.inc.batch;
            const Mat<S>& z = ctx_.inc.acts_t[l + 1];  // [mid, batch]
            const Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, 1>> u(ctx_.dense_u[k].data(),
                                                                          mid);
            masked.resize(mid, batch);
            table.room_up.resize(batch);
            table.room_down.resize(batch);
            for (int64_t b = 0; b < batch; ++b) {
              S up = std::numeric_limits<S>::lowest(), down = std::numeric_limits<S>::lowest();
              for (int64_t j = 0; j < mid; ++j) {
                const S zj = z(j, b);
                masked(j, b) = zj > S(0) ? u(j) : S(0);
                if (zj == S(0)) {  // at the kink: any move crosses
                  up = down = std::numeric_limits<S>::max();
                  continue;
                }
                const S ratio = u(j) / zj;
                up = std::max(up, -ratio);
                down = std::max(down, ratio);
              }
              table.room_up(b) = up;
              table.room_down(b) = down;
            }
            const Eigen::Map<const Mat<S>> w_second(ctx_.inc.eff.data() + second.offset, second.out,
                                                    mid);
            table.response.noalias() = w_second * masked;
            table.layer = static_cast<int32_t>(l);
            table.built = true;
          }
        });
  });
}

template <class S>
void DeltaPath<S>::apply_direction(std::size_t l, int32_t u_index, int64_t n, Scratch& s) const {
  const DirectionTable& table = direction_[static_cast<std::size_t>(u_index)];
  const LayerPlan& second = ctx_.plan.layers[l + 2];
  const int64_t batch = ctx_.inc.batch, out = second.out, mid = ctx_.plan.layers[l].out;
  const auto& u = ctx_.dense_u[static_cast<std::size_t>(u_index)];
  const Eigen::Map<const Mat<S>> w_second(ctx_.inc.eff.data() + second.offset, out, mid);
  s.next.resize(out, n * batch);
  Eigen::Matrix<S, Eigen::Dynamic, 1>& acc = s.column;
  acc.resize(out);
  Eigen::Matrix<S, Eigen::Dynamic, 1>& da = s.tmp_col;
  da.resize(mid);
  constexpr int lanes = kLanes<S>;
  for (int64_t i = 0; i < n; ++i) {
    const auto step = s.step.row(i).array();
    for (int64_t o = 0; o < out; ++o)
      s.next.row(o).segment(i * batch, batch).array() = table.response.row(o).array() * step;
    for (int64_t b = 0; b < batch; ++b) {
      const S v = step(b);
      const S room = v > S(0) ? v * table.room_up(b) : -v * table.room_down(b);
      if (room < S(0.999)) continue;
      // A ReLU unit may cross its kink: the linear response above plus, per unit that does
      // cross, its exact change minus its linear one through the next layer (a column of W
      // each, not the whole out x mid product), found by a vector scan (for_each_crossing).
      const S* pre = ctx_.inc.acts[l + 1].row(b).data();
      const S* post = ctx_.inc.acts[l + 2].row(b).data();
      const S* uu = u.data();
      if (out <= lanes) {  // a narrow next layer: its whole product is as cheap
        for (int64_t j = 0; j < mid; ++j) {
          const S x = pre[j] + uu[j] * v;
          da(j) = (x > S(0) ? x : S(0)) - post[j];
        }
        s.next.col(i * batch + b).noalias() = w_second * da;
        continue;
      }
      bool any = false;
      auto add = [&](int64_t j) {
        const S dz = uu[j] * v, x = pre[j] + dz;
        if ((x > S(0)) == (pre[j] > S(0))) return;
        const S correction = (x > S(0) ? x : S(0)) - post[j] - (pre[j] > S(0) ? dz : S(0));
        if (!any) acc.setZero();
        any = true;
        acc += ctx_.inc.weights_t[l + 2].row(j).transpose() * correction;
      };
      for_each_crossing(pre, uu, v, mid, add);
      if (any) s.next.col(i * batch + b) += acc;
    }
  }
  s.delta.swap(s.next);
}

template <class S>
void DeltaPath<S>::apply_kink(std::size_t l, int64_t n, Scratch& s) const {
  const KinkTable& table = kink_[l];
  const LayerPlan &first = ctx_.plan.layers[l], &second = ctx_.plan.layers[l + 2];
  const int64_t batch = ctx_.inc.batch, out = second.out, mid = first.out;
  const auto n_units = static_cast<int64_t>(s.units.size());
  const Mat<S>& z = ctx_.inc.acts_t[l + 1];
  const Mat<S>& relu_z = ctx_.inc.acts_t[l + 2];
  s.next.resize(out, n * batch);
  s.tmp_b.resize(batch);
  Eigen::Matrix<S, Eigen::Dynamic, 1>& dz = s.column;
  dz.resize(mid);
  constexpr int lanes = kLanes<S>;
  const int64_t stride = n * batch;
  for (int64_t i = 0; i < n; ++i) {
    auto block = s.next.middleCols(i * batch, batch);
    // The linear response and the room bound, a packet of samples at a time.
    for (int64_t b = 0; b < batch; b += lanes) {
      const bool full = b + lanes <= batch;
      Packet<S> room = Packet<S>::Zero();
      Packet<S> acc[16];
      const int64_t out_blocked = std::min<int64_t>(out, 16);
      for (int64_t o = 0; o < out_blocked; ++o) acc[o].setZero();
      if (full) {
        for (int64_t o = out_blocked; o < out; ++o)
          PacketMap<S>(s.next.data() + o * stride + i * batch + b).setZero();
        for (int64_t k = 0; k < n_units; ++k) {
          const int64_t u = s.units[static_cast<std::size_t>(k)];
          const Packet<S> v = ConstPacketMap<S>(s.sparse.data() + k * stride + i * batch + b);
          room += v.abs() * ConstPacketMap<S>(table.inv_room.data() + u * batch + b);
          const S* response = table.response.data() + u * out * batch + b;
          for (int64_t o = 0; o < out_blocked; ++o)
            acc[o] += ConstPacketMap<S>(response + o * batch) * v;
          for (int64_t o = out_blocked; o < out; ++o)
            PacketMap<S>(s.next.data() + o * stride + i * batch + b) +=
                ConstPacketMap<S>(response + o * batch) * v;
        }
        for (int64_t o = 0; o < out_blocked; ++o)
          PacketMap<S>(s.next.data() + o * stride + i * batch + b) = acc[o];
        PacketMap<S>(s.tmp_b.data() + b) = room;
      } else {
        for (int64_t r = b; r < batch; ++r) {
          S rr = 0;
          for (int64_t o = 0; o < out; ++o) block(o, r) = S(0);
          for (int64_t k = 0; k < n_units; ++k) {
            const int64_t u = s.units[static_cast<std::size_t>(k)];
            const S v = s.sparse(k, i * batch + r);
            rr += std::abs(v) * table.inv_room(u, r);
            for (int64_t o = 0; o < out; ++o) block(o, r) += table.response(u * out + o, r) * v;
          }
          s.tmp_b(r) = rr;
        }
      }
    }
    for (int64_t b = 0; b < batch; ++b) {
      if (s.tmp_b(b) < S(0.5)) continue;
      // A ReLU unit may cross its kink for this sample: correct exactly the units that do.
      dz.setZero();
      for (int64_t k = 0; k < n_units; ++k)
        dz += ctx_.inc.weights_t[l].row(s.units[static_cast<std::size_t>(k)]).transpose() *
              s.sparse(k, i * batch + b);
      for (int64_t j = 0; j < mid; ++j) {
        const S v = z(j, b) + dz(j);
        if ((v > S(0)) == (z(j, b) > S(0))) continue;
        const S exact = (v > S(0) ? v : S(0)) - relu_z(j, b);
        const S linear = z(j, b) > S(0) ? dz(j) : S(0);
        block.col(b) += ctx_.inc.weights_t[l + 2].row(j).transpose() * (exact - linear);
      }
    }
  }
  s.delta.swap(s.next);
}

template <class S>
void DeltaPath<S>::evaluate(const Candidates& c, const Group& g, Scratch& s, double* losses) const {
  if (static_cast<std::size_t>(g.first_layer) < ctx_.inc.transposed_from)
    throw std::logic_error("delta path: layer " + std::to_string(g.first_layer) +
                           "'s feature-major activations were not made (transpose_from)");
  const int64_t n = g.end - g.begin, batch = ctx_.inc.batch, nb = n * batch;
  const int32_t d = c.d;
  const Term* terms = ctx_.planner->terms().data() + g.terms_begin;
  const int64_t n_terms = g.terms_end - g.terms_begin;
  // theta per candidate and term: full space uses the effective change Q(w + d) - Q(w).
  s.theta.resize(static_cast<std::size_t>(n * n_terms));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < n_terms; ++t) {
      const double delta = c.displacement[(g.begin + i) * d + terms[t].slot];
      const int64_t p = terms[t].param;
      s.theta[static_cast<std::size_t>(i * n_terms + t)] =
          ctx_.subspace_mode
              ? static_cast<S>(delta)
              : ctx_.effective(p, ctx_.inc.base[static_cast<std::size_t>(p)] + delta) -
                    ctx_.inc.eff[static_cast<std::size_t>(p)];
    }
  if (ctx_.l2 != 0.0 && ctx_.subspace_mode) ctx_.collect_touched(c, g.particle, s);

  // The losses from per-candidate means, with the regularisation.
  auto finish = [&](const double* means) {
    for (int64_t i = 0; i < n; ++i)
      losses[g.begin + i] = means[i] + ctx_.l2_term(c, g, g.begin + i, s);
  };
  s.row_losses.resize(static_cast<std::size_t>(n));

  enum class State { none, sparse, dense } state = State::none;
  Mat<S>& delta = s.delta;
  int64_t ti = 0;
  const std::size_t n_layers = ctx_.plan.layers.size();
  for (std::size_t l = static_cast<std::size_t>(g.first_layer); l < n_layers; ++l) {
    const LayerPlan& layer = ctx_.plan.layers[l];
    if (layer.op == LayerOp::affine) {
      const auto layer_id = static_cast<int32_t>(l);
      const bool has_terms = ti < n_terms && terms[ti].layer == layer_id;
      // One unit left to change: the logits move along one direction per sample.
      const bool one_unit = state == State::sparse && s.units.size() == 1 && ti == n_terms;
      // The rank-one shortcut: the losses are completed by finish_task.
      const auto rank_one = [&](const Cumulants& table, int64_t kink_layer) {
        const std::size_t first = s.exact.pending.size();
        rank_one_losses(table, s.units[0], s.sparse, n, kink_layer, s.exact);
        for (int64_t i = 0; i < n; ++i) {
          typename ExactLanes<S>::Pending& p = s.exact.pending[first + static_cast<std::size_t>(i)];
          p.loss_index = g.begin + i;
          p.l2 = ctx_.l2_term(c, g, g.begin + i, s);
        }
      };
      if (one_unit && l + 1 == n_layers && last_layer_cumulants_.built) {
        rank_one(last_layer_cumulants_, -1);
        return;
      }
      if (one_unit && l + 3 == n_layers && kink_[l].built && kink_[l].cumulants.built) {
        rank_one(kink_[l].cumulants, static_cast<int64_t>(l));
        return;
      }
      if (state == State::sparse && kink_[l].built &&
          (ti == n_terms || terms[ti].layer > layer_id + 2)) {
        apply_kink(l, n, s);
        state = State::dense;
        l += 2;
        continue;
      }
      // The incoming delta through this layer's weights.
      if (state == State::sparse) {
        // A few columns of W times the sparse rows: outer products, no temporaries.
        for (std::size_t k = 0; k < s.units.size(); ++k) {
          const auto column = ctx_.inc.weights_t[l].row(s.units[k]).transpose();
          if (k == 0)
            s.next.noalias() = column * s.sparse.row(0);
          else
            s.next.noalias() += column * s.sparse.row(static_cast<int64_t>(k));
        }
      } else if (state == State::dense) {
        const Eigen::Map<const Mat<S>> w(ctx_.inc.eff.data() + layer.offset, layer.out, layer.in);
        s.next.noalias() = w * delta;
      }
      if (!has_terms) {
        if (state != State::none) {
          delta.swap(s.next);
          state = State::dense;
        }
        continue;
      }
      // This layer's own coordinates act on the candidate's input a + delta.
      int64_t te = ti;
      bool one_hot = true, one_direction = true;
      for (; te < n_terms && terms[te].layer == layer_id; ++te) {
        one_hot = one_hot && terms[te].row >= 0;
        one_direction = one_direction && terms[te].row < 0 &&
                        terms[te].u_index == terms[ti].u_index && terms[te].col != kDenseV;
      }
      if (state == State::none && one_direction &&
          (te == n_terms || terms[te].layer > layer_id + 2) &&
          direction_[static_cast<std::size_t>(terms[ti].u_index)].built) {
        // Every term moves the pre-activation along one u: a scalar per sample, then the
        // direction table through the ReLU and the next affine layer.
        s.step.setZero(n, batch);
        for (int64_t t = ti; t < te; ++t)
          for (int64_t i = 0; i < n; ++i) {
            const S theta = s.theta[static_cast<std::size_t>(i * n_terms + t)];
            if (terms[t].col == kBias)
              s.step.row(i).array() += theta;
            else
              s.step.row(i) += theta * ctx_.inc.acts_t[l].row(terms[t].col);
          }
        apply_direction(l, terms[ti].u_index, n, s);
        state = State::dense;
        ti = te;
        l += 2;
        continue;
      }
      if (state == State::none && ti == 0 && te == n_terms && l + 1 < n_layers &&
          ctx_.plan.layers[l + 1].is_relu &&
          std::all_of(terms + ti, terms + te, [&](const Term& t) {
            return t.row >= 0 && t.row == terms[ti].row && (t.col >= 0 || t.col == kBias);
          })) {
        // All of the group's terms move one unit's weights and bias, and a ReLU follows: that
        // unit's change after the ReLU straight from the inputs, as the route below computes
        // it (s.theta is [n, n_terms], these terms' own layout).
        const int64_t unit = terms[ti].row;
        s.inputs.clear();
        for (int64_t t = ti; t < te; ++t)
          s.inputs.push_back(terms[t].col == kBias ? nullptr
                                                   : ctx_.inc.acts_t[l].row(terms[t].col).data());
        s.units.assign(1, unit);
        s.sparse.resize(1, nb);
        unit_relu_change(ctx_.inc.acts_t[l + 1].row(unit).data(),
                         ctx_.inc.acts_t[l + 2].row(unit).data(), s.inputs.data(), s.theta.data(),
                         n_terms, n, batch, s.sparse.data());
        state = State::sparse;
        ti = te;
        ++l;  // past the ReLU
        continue;
      }
      const bool sparse_out = state == State::none && one_hot;
      std::vector<int64_t>& out_units = s.units;  // free: the incoming state is none
      if (sparse_out) {
        out_units.clear();
        for (int64_t t = ti; t < te; ++t)
          if (std::find(out_units.begin(), out_units.end(), terms[t].row) == out_units.end())
            out_units.push_back(terms[t].row);
        s.dense_in.setZero(static_cast<int64_t>(out_units.size()), nb);
      } else if (state == State::none) {
        s.next.setZero(layer.out, nb);
      }
      Mat<S>& target = sparse_out ? s.dense_in : s.next;
      s.src.resize(batch);
      s.directions.clear();
      for (int64_t t = ti; t < te; ++t)
        if (terms[t].row < 0 && std::find(s.directions.begin(), s.directions.end(),
                                          terms[t].u_index) == s.directions.end())
          s.directions.push_back(terms[t].u_index);
      s.by_direction.setZero(static_cast<int64_t>(s.directions.size()), nb);
      for (int64_t t = ti; t < te; ++t) {
        const Term& term = terms[t];
        const int64_t out_row =
            sparse_out ? std::find(out_units.begin(), out_units.end(), term.row) - out_units.begin()
                       : term.row;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t col0 = i * batch;
          // src = v^T (a + delta) for this candidate.
          if (term.col == kBias) {
            s.src.setOnes();
          } else if (term.col >= 0) {
            s.src = ctx_.inc.acts_t[l].row(term.col).array();
            if (state == State::dense) s.src += delta.row(term.col).segment(col0, batch).array();
            if (state == State::sparse)
              for (std::size_t k = 0; k < s.units.size(); ++k)
                if (s.units[k] == term.col)
                  s.src += s.sparse.row(static_cast<int64_t>(k)).segment(col0, batch).array();
          } else {
            s.src = ctx_.inc.v_src.row(term.v_index).array();
            const auto& v = ctx_.dense_v_s[static_cast<std::size_t>(term.v_index)];
            if (state == State::dense) s.src += (v * delta.middleCols(col0, batch)).array();
            if (state == State::sparse)
              for (std::size_t k = 0; k < s.units.size(); ++k)
                s.src += v(s.units[k]) *
                         s.sparse.row(static_cast<int64_t>(k)).segment(col0, batch).array();
          }
          s.src *= s.theta[static_cast<std::size_t>(i * n_terms + t)];
          if (out_row >= 0) {
            target.row(out_row).segment(col0, batch).array() += s.src;
          } else {
            // Terms along one dense u add up first: one outer product per direction.
            const int64_t dir = std::find(s.directions.begin(), s.directions.end(), term.u_index) -
                                s.directions.begin();
            s.by_direction.row(dir).segment(col0, batch).array() += s.src;
          }
        }
      }
      for (std::size_t k = 0; k < s.directions.size(); ++k) {
        const auto& u = ctx_.dense_u[static_cast<std::size_t>(s.directions[k])];
        target.noalias() +=
            Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, 1>>(u.data(), layer.out) *
            s.by_direction.row(static_cast<int64_t>(k));
      }
      ti = te;
      if (sparse_out) {
        s.sparse.swap(s.dense_in);
        state = State::sparse;
      } else {
        delta.swap(s.next);
        state = State::dense;
      }
    } else if (layer.op == LayerOp::elementwise) {
      if (state == State::none) continue;
      const Mat<S>& a = ctx_.inc.acts_t[l];
      const Mat<S>& fa = ctx_.inc.acts_t[l + 1];
      if (state == State::sparse) {
        const auto n_units = static_cast<int64_t>(s.units.size());
        for (int64_t k = 0; k < n_units; ++k) {
          const int64_t u = s.units[static_cast<std::size_t>(k)];
          for (int64_t i = 0; i < n; ++i) s.sparse.row(k).segment(i * batch, batch) += a.row(u);
        }
        s.dense_in.resize(n_units, nb);
        apply_elementwise(layer, s.sparse.data(), s.dense_in.data(), n_units * nb, s);
        for (int64_t k = 0; k < n_units; ++k) {
          const int64_t u = s.units[static_cast<std::size_t>(k)];
          for (int64_t i = 0; i < n; ++i)
            s.sparse.row(k).segment(i * batch, batch) =
                s.dense_in.row(k).segment(i * batch, batch) - fa.row(u);
        }
      } else if (layer.is_relu) {
        for (int64_t i = 0; i < n; ++i) {
          auto block = delta.middleCols(i * batch, batch);
          block = (a + block).cwiseMax(S(0)) - fa;
        }
      } else {
        for (int64_t i = 0; i < n; ++i) delta.middleCols(i * batch, batch) += a;
        s.next.resize(delta.rows(), nb);
        apply_elementwise(layer, delta.data(), s.next.data(), delta.size(), s);
        for (int64_t i = 0; i < n; ++i)
          delta.middleCols(i * batch, batch) = s.next.middleCols(i * batch, batch) - fa;
      }
    } else {
      // A host layer: whole activations a + delta from here on, stacked sample-major.
      s.stack.resize(nb, layer.in);
      for (int64_t i = 0; i < n; ++i) {
        auto rows = s.stack.middleRows(i * batch, batch);
        rows = ctx_.inc.acts[l];
        if (state == State::dense) rows += delta.middleCols(i * batch, batch).transpose();
        if (state == State::sparse)
          for (std::size_t k = 0; k < s.units.size(); ++k)
            rows.col(s.units[k]) +=
                s.sparse.row(static_cast<int64_t>(k)).segment(i * batch, batch).transpose();
      }
      const Mat<S>& out = forward_suffix(ctx_.plan, l, s.stack, ctx_.inc.eff.data(), s.suffix);
      for (int64_t i = 0; i < n; ++i)
        losses[g.begin + i] = ctx_.rows_loss(out, i * batch) + ctx_.l2_term(c, g, g.begin + i, s);
      return;
    }
  }
  if (state == State::none) {
    for (int64_t i = 0; i < n; ++i)
      losses[g.begin + i] =
          ctx_.inc.base_loss - ctx_.l2 * ctx_.inc.base_sq + ctx_.l2_term(c, g, g.begin + i, s);
    return;
  }
  if (state == State::sparse && sparse_delta_losses(s.units, s.sparse, n, s.row_losses.data())) {
    finish(s.row_losses.data());
    return;
  }
  if (state == State::sparse) {
    s.next.setZero(ctx_.plan.out_features, nb);
    for (std::size_t k = 0; k < s.units.size(); ++k)
      s.next.row(s.units[k]) = s.sparse.row(static_cast<int64_t>(k));
    delta.swap(s.next);
  }
  delta_losses(delta, n, s.row_losses.data(), s);
  finish(s.row_losses.data());
}

// S is a type here, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define POLYPROBE_INSTANTIATE(S)                                                                   \
  template double DeltaPath<S>::table_bytes() const;                                               \
  template void DeltaPath<S>::apply_elementwise(const LayerPlan&, const S*, S*, int64_t, Scratch&) \
      const;                                                                                       \
  template void DeltaPath<S>::build_tables();                                                      \
  template void DeltaPath<S>::build_kink_tables();                                                 \
  template std::vector<char> DeltaPath<S>::changed_units(std::size_t, int64_t) const;              \
  template void DeltaPath<S>::apply_kink(std::size_t, int64_t, Scratch&) const;                    \
  template void DeltaPath<S>::build_direction_tables();                                            \
  template void DeltaPath<S>::apply_direction(std::size_t, int32_t, int64_t, Scratch&) const;      \
  template void DeltaPath<S>::evaluate(const Candidates&, const Group&, Scratch&, double*) const;
// NOLINTEND(bugprone-macro-parentheses)
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
