// The per-sample losses and the objective that every evaluator must reproduce.
#include <polyprobe/error.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/plugin/kernels/losses.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace polyprobe {

void Loss::check_targets(const Targets& targets, int64_t out_features) const {
  if (needs_labels()) {
    if (!targets.is_classification())
      throw Error("loss '" + name() + "' needs class labels, but the targets are values");
    for (std::size_t i = 0; i < targets.labels.size(); ++i) {
      const int64_t label = targets.labels[i];
      if (label < 0 || label >= out_features)
        throw Error("label " + std::to_string(label) + " of sample " + std::to_string(i) +
                    " is out of range for a model with " + std::to_string(out_features) +
                    " outputs");
    }
  } else if (targets.is_classification()) {
    throw Error("loss '" + name() + "' needs regression targets (" + std::to_string(out_features) +
                " values per sample), but the data has class labels; use cross_entropy, hinge "
                "or zero_one");
  } else if (targets.values.cols() != out_features) {
    throw Error("loss '" + name() + "' needs " + std::to_string(out_features) +
                " target values per sample, got " + std::to_string(targets.values.cols()));
  }
}

namespace {

// Each loss applies its row kernel from polyprobe/plugin/kernels/losses.hpp to every output row.
template <kernels::LossKind Kind>
class KernelLoss final : public Loss {
 public:
  explicit KernelLoss(const char* name) : name_(name) {}
  std::string name() const override { return name_; }
  bool needs_labels() const override { return Kind != kernels::LossKind::mse; }
  void per_sample(ConstMatrixRef<float> out, const Targets& t, int64_t first,
                  std::span<float> losses) const override {
    run<float>(out, t, first, losses);
  }
  void per_sample(ConstMatrixRef<double> out, const Targets& t, int64_t first,
                  std::span<double> losses) const override {
    run<double>(out, t, first, losses);
  }

 private:
  template <class S>
  void run(ConstMatrixRef<S> out, const Targets& t, int64_t first, std::span<S> losses) const {
    // Rows of a row-major Ref are contiguous (inner stride 1).
    for (int64_t r = 0; r < out.rows(); ++r) {
      const int64_t row = first + r;
      const int64_t label = t.is_classification() ? t.labels[static_cast<std::size_t>(row)] : 0;
      const double* target = t.is_classification() ? nullptr : t.values.row(row).data();
      losses[static_cast<std::size_t>(r)] =
          kernels::loss_row<S>(Kind, out.row(r).data(), out.cols(), label, target);
    }
  }
  const char* name_;
};

}  // namespace

std::unique_ptr<Loss> make_loss(std::string_view name, double l2) {
  std::unique_ptr<Loss> loss;
  using kernels::LossKind;
  if (name == "cross_entropy")
    loss = std::make_unique<KernelLoss<LossKind::cross_entropy>>("cross_entropy");
  else if (name == "mse")
    loss = std::make_unique<KernelLoss<LossKind::mse>>("mse");
  else if (name == "hinge")
    loss = std::make_unique<KernelLoss<LossKind::hinge>>("hinge");
  else if (name == "zero_one")
    loss = std::make_unique<KernelLoss<LossKind::zero_one>>("zero_one");
  else
    throw Error("unknown loss '" + std::string(name) +
                "' (use cross_entropy, mse, hinge or zero_one)");
  if (!(l2 >= 0.0) || !std::isfinite(l2))
    throw Error("l2 regularisation weight must be a finite number >= 0, got " + std::to_string(l2));
  loss->l2 = l2;
  return loss;
}

namespace {
template <class S>
double mean_loss(const Model& model, const Loss& loss, const Batch& batch,
                 std::span<const double> params) {
  const Matrix<S> x = batch.inputs.cast<S>();
  const Matrix<S> out = model.forward<S>(x, params);
  std::vector<S> per(static_cast<std::size_t>(out.rows()));
  loss.per_sample(out, batch.targets, 0, per);
  double sum = 0.0;
  for (S v : per) sum += static_cast<double>(v);
  return sum / static_cast<double>(per.size());
}
}  // namespace

double objective(const Model& model, const Loss& loss, const Batch& batch,
                 std::span<const double> params, DType dtype) {
  if (batch.size() == 0) throw Error("cannot evaluate the objective on an empty batch");
  double value = dtype == DType::f32 ? mean_loss<float>(model, loss, batch, params)
                                     : mean_loss<double>(model, loss, batch, params);
  if (loss.l2 != 0.0)
    value += loss.l2 * std::inner_product(params.begin(), params.end(), params.begin(), 0.0);
  return value;
}

}  // namespace polyprobe
