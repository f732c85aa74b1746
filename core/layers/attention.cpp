// Multi-head self-attention over [L, E] token samples, as nn.MultiheadAttention(E, heads,
// batch_first=True) called with query = key = value = x, without masks or dropout.
//
// Parameters keep PyTorch's names and shapes: in_proj_weight [3E, E], in_proj_bias [3E],
// out_proj.weight [E, E], out_proj.bias [E]. attention = "softmax" is PyTorch's layer;
// attention = "argmax" replaces each row of attention weights by the one-hot of its largest
// score (the first one on ties, as torch.argmax): hard attention, not differentiable.
// causal = true lets position i attend to positions j <= i only (PyTorch's is_causal, the
// top-left mask), for softmax and argmax alike: the masked scores take no part in the
// maximum or the normalisation, and their weights are zero.
//
// The attention itself (softmax(scale Q K^T) V per head) runs as the "sdpa" operation when a
// plugin offers one for the CPU and the dtype (attention_sdpa: fused, no L x L scores), else
// explicitly here; both compute the same function, to rounding.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

#include <polyprobe/operations.hpp>
#include <polyprobe/plugin/plugin.hpp>

#include <algorithm>

namespace polyprobe {
namespace {

enum class Weighting { softmax, argmax };

class SelfAttention final : public LayerBase<SelfAttention> {
 public:
  SelfAttention(const nlohmann::json& attrs, const Shape& input,
                std::shared_ptr<const OperationTable> operations)
      : input_(input), operations_(std::move(operations)) {
    check_attribute_names(attrs, "self_attention", {"num_heads", "attention", "bias", "causal"});
    if (input.dims.size() != 2)
      throw Error("layer 'self_attention' needs a per-sample input of shape [L, E], got " +
                  input.str());
    length_ = input.dims[0];
    embed_ = input.dims[1];
    heads_ = attr_required<int64_t>(attrs, "self_attention", "num_heads");
    bias_ = attr_or<bool>(attrs, "self_attention", "bias", true);
    causal_ = attr_or<bool>(attrs, "self_attention", "causal", false);
    const auto weighting = attr_or<std::string>(attrs, "self_attention", "attention", "softmax");
    if (weighting == "softmax")
      weighting_ = Weighting::softmax;
    else if (weighting == "argmax")
      weighting_ = Weighting::argmax;
    else
      throw Error("layer 'self_attention': attention must be \"softmax\" or \"argmax\"");
    if (heads_ <= 0 || embed_ % heads_ != 0)
      throw Error("layer 'self_attention': num_heads (" + std::to_string(heads_) +
                  ") must be positive and divide the embedding size " + std::to_string(embed_));
  }

  std::string kind() const override { return "self_attention"; }
  nlohmann::json attributes() const override {
    return {{"num_heads", heads_},
            {"attention", weighting_ == Weighting::softmax ? "softmax" : "argmax"},
            {"bias", bias_},
            {"causal", causal_}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return input_; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs{{"in_proj_weight", {3 * embed_, embed_}}};
    if (bias_) specs.push_back({"in_proj_bias", {3 * embed_}});
    specs.push_back({"out_proj.weight", {embed_, embed_}});
    if (bias_) specs.push_back({"out_proj.bias", {embed_}});
    return specs;
  }
  LayerContract contract() const override {
    LayerContract c;
    c.site_local = true;
    return c;
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    // PyTorch: xavier_uniform_ on in_proj_weight, Linear's default on out_proj.weight, zero
    // biases.
    std::fill(params.begin(), params.end(), 0.0);
    const double xavier = std::sqrt(6.0 / static_cast<double>(embed_ + 3 * embed_));
    std::uniform_real_distribution<double> u(-xavier, xavier);
    for (int64_t i = 0; i < 3 * embed_ * embed_; ++i) params[static_cast<std::size_t>(i)] = u(rng);
    layers::fill_fan_in_uniform(params.subspan(static_cast<std::size_t>(out_weight_offset()),
                                               static_cast<std::size_t>(embed_ * embed_)),
                                embed_, rng);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    const OperationTable::Entry* sdpa =
        operations_->find(PP_OPERATION_SDPA, PP_DEVICE_NAME_CPU, pp::dtype_of<S>());
    if (sdpa != nullptr && forward_fused<S>(*sdpa->op, x, params, y)) return;
    const int64_t head_dim = embed_ / heads_;
    const S scale = S(1) / std::sqrt(static_cast<S>(head_dim));
    Eigen::Map<const Matrix<S>> in_weight(params.data(), 3 * embed_, embed_);
    Eigen::Map<const Matrix<S>> out_weight(params.data() + out_weight_offset(), embed_, embed_);
    Matrix<S> qkv(length_, 3 * embed_), mixed(length_, embed_), scores(length_, length_);
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      Eigen::Map<const Matrix<S>> tokens(layers::sample_in(x, b), length_, embed_);
      qkv.noalias() = tokens * in_weight.transpose();
      if (bias_)
        qkv.rowwise() +=
            Eigen::Map<const Vector<S>>(params.data() + 3 * embed_ * embed_, 3 * embed_)
                .transpose();
      for (int64_t h = 0; h < heads_; ++h) {
        const auto q = qkv.middleCols(h * head_dim, head_dim);
        const auto k = qkv.middleCols(embed_ + h * head_dim, head_dim);
        const auto v = qkv.middleCols(2 * embed_ + h * head_dim, head_dim);
        scores.noalias() = (q * scale) * k.transpose();
        weigh_rows(scores);
        mixed.middleCols(h * head_dim, head_dim).noalias() = scores * v;
      }
      Eigen::Map<Matrix<S>> out(layers::sample_out(y, b), length_, embed_);
      out.noalias() = mixed * out_weight.transpose();
      if (bias_)
        out.rowwise() += Eigen::Map<const Vector<S>>(
                             params.data() + out_weight_offset() + embed_ * embed_, embed_)
                             .transpose();
    }
  }

 private:
  int64_t out_weight_offset() const { return 3 * embed_ * embed_ + (bias_ ? 3 * embed_ : 0); }

  // The forward with the attention as one call of the operation over the whole batch
  // (b0 = 1, b1 = samples): q|k|v of every sample, then the op, then the output projection.
  // False (and nothing written) when the op declines these arguments.
  template <class S>
  bool forward_fused(const pp_operation& op, ConstMatrixRef<S> x, std::span<const S> params,
                     MatrixRef<S> y) const {
    const int64_t batch = x.rows(), len = length_, e = embed_, hd = embed_ / heads_;
    Eigen::Map<const Matrix<S>> in_weight(params.data(), 3 * e, e);
    Eigen::Map<const Matrix<S>> out_weight(params.data() + out_weight_offset(), e, e);
    Matrix<S> qkv(batch * len, 3 * e), mixed(batch * len, e);
    for (Eigen::Index b = 0; b < batch; ++b) {
      Eigen::Map<const Matrix<S>> tokens(layers::sample_in(x, b), len, e);
      qkv.middleRows(b * len, len).noalias() = tokens * in_weight.transpose();
    }
    if (bias_)
      qkv.rowwise() += Eigen::Map<const Vector<S>>(params.data() + 3 * e * e, 3 * e).transpose();
    pp_sdpa_args a{};
    a.struct_size = sizeof(a);
    a.dtype = pp::dtype_of<S>();
    a.weighting = weighting_ == Weighting::argmax ? PP_SDPA_ARGMAX : PP_SDPA_SOFTMAX;
    a.causal = causal_ ? 1 : 0;
    a.b0 = 1, a.b1 = batch, a.heads = heads_;
    a.q_len = a.kv_len = len, a.head_dim = a.v_dim = hd;
    a.scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const int64_t in_strides[4] = {0, len * 3 * e, hd, 3 * e}, out_strides[4] = {0, len * e, hd, e};
    a.q = qkv.data(), a.k = qkv.data() + e, a.v = qkv.data() + 2 * e, a.out = mixed.data();
    std::copy(in_strides, in_strides + 4, a.q_strides);
    std::copy(in_strides, in_strides + 4, a.k_strides);
    std::copy(in_strides, in_strides + 4, a.v_strides);
    std::copy(out_strides, out_strides + 4, a.out_strides);
    pp_error err{};
    const int status = static_cast<const pp_sdpa_table*>(op.table)->run(&a, &err);
    if (status == PP_UNSUPPORTED) return false;
    if (status != PP_OK)
      throw Error("layer 'self_attention': the sdpa operation failed: " + std::string(err.message));
    for (Eigen::Index b = 0; b < batch; ++b) {
      Eigen::Map<Matrix<S>> out(layers::sample_out(y, b), len, e);
      out.noalias() = mixed.middleRows(b * len, len) * out_weight.transpose();
      if (bias_)
        out.rowwise() +=
            Eigen::Map<const Vector<S>>(params.data() + out_weight_offset() + e * e, e).transpose();
    }
    return true;
  }

  // Turns each row of scores into attention weights: softmax, or the one-hot of its argmax,
  // over the keys the row sees (all, or j <= r when causal; the others get weight 0).
  template <class S>
  void weigh_rows(Matrix<S>& scores) const {
    for (Eigen::Index r = 0; r < scores.rows(); ++r) {
      const Eigen::Index visible = causal_ ? std::min(r + 1, scores.cols()) : scores.cols();
      auto row = scores.row(r).head(visible);
      Eigen::Index best = 0;
      for (Eigen::Index c = 1; c < visible; ++c)
        if (row(c) > row(best)) best = c;
      scores.row(r).tail(scores.cols() - visible).setZero();
      if (weighting_ == Weighting::argmax) {
        row.setZero();
        row(best) = S(1);
      } else {
        const S top = row(best);  // read before the row is overwritten
        row = (row.array() - top).exp().matrix();
        row /= row.sum();
      }
    }
  }

  Shape input_;
  int64_t length_ = 0, embed_ = 0, heads_ = 1;
  bool bias_ = true, causal_ = false;
  Weighting weighting_ = Weighting::softmax;
  std::shared_ptr<const OperationTable> operations_;  // never null; may be empty
};

}  // namespace

void register_attention(LayerFactory& factory) {
  factory.add(
      "self_attention",
      {[operations = factory.operations()](const nlohmann::json& attrs, const Shape& input) {
         return std::make_shared<const SelfAttention>(attrs, input, operations);
       },
       "multi-head self-attention on [L, E] (nn.MultiheadAttention); attributes "
       "num_heads, attention (softmax, or argmax: hard, not differentiable), bias, causal "
       "(position i sees positions j <= i)",
       "core"});
}

}  // namespace polyprobe
