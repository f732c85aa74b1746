// The subspace's direction projections v^T x (direction_projections.hpp).
#include "direction_projections.hpp"

#include <map>
#include <stdexcept>
#include <type_traits>

namespace polyprobe::cpu_tbb {

template <class S>
DirectionProjections<S>::DirectionProjections(const ModelPlan& plan,
                                              const std::vector<Direction>& directions,
                                              const std::vector<int32_t>& layers,
                                              const pp_host_api* host)
    : directions_(directions), layers_(layers), by_operation_(directions.size(), 0) {
  const int32_t dtype = std::is_same_v<S, float> ? PP_DTYPE_F32 : PP_DTYPE_F64;
  if (host != nullptr && host->find_operation != nullptr && !directions.empty()) {
    const pp_operation* op = host->find_operation(host->ctx, PP_OPERATION_FACTORED_CORRECTION,
                                                  PP_DEVICE_TYPE_CPU, dtype);
    if (op != nullptr) {
      op_ = static_cast<const pp_factored_correction_table*>(op->table);
      provider_ = host->operation_provider(host->ctx, op);
    }
  }
  if (op_ == nullptr) return;
  std::map<int32_t, std::vector<int32_t>> rows_of;
  for (std::size_t j = 0; j < directions.size(); ++j) {
    const auto l = static_cast<std::size_t>(layers[j]);
    if (plan.layers[l].op == LayerOp::affine) rows_of[layers[j]].push_back(static_cast<int32_t>(j));
  }
  for (auto& [layer, rows] : rows_of) {
    if (rows.size() < kMinShared) continue;
    SharedLayer s;
    s.layer = layer;
    const int64_t in = plan.layers[static_cast<std::size_t>(layer)].in;
    s.dirs.resize(static_cast<int64_t>(rows.size()), in);
    s.contiguous = true;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      s.dirs.row(static_cast<int64_t>(k)) = directions[static_cast<std::size_t>(rows[k])];
      s.contiguous = s.contiguous && rows[k] == rows[0] + static_cast<int32_t>(k);
      by_operation_[static_cast<std::size_t>(rows[k])] = 1;
    }
    s.rows = std::move(rows);
    shared_.push_back(std::move(s));
  }
}

template <class S>
void DirectionProjections<S>::compute(const ModelPlan& plan, const std::vector<Mat<S>>& acts,
                                      Mat<S>& v_src) {
  const int64_t batch = acts.empty() ? 0 : acts[0].rows();
  v_src.resize(static_cast<int64_t>(directions_.size()), batch);
  v_src.setZero();
  for (std::size_t j = 0; j < directions_.size(); ++j) {
    // A conv weight's v spans one filter (c_in kh kw values, not the input width): such
    // coordinates go to the site-local or dense paths, which never read this row.
    const auto l = static_cast<std::size_t>(layers_[j]);
    if (by_operation_[j] != 0 || plan.layers[l].op != LayerOp::affine) continue;
    v_src.row(static_cast<int64_t>(j)).noalias() =
        (acts[l] * directions_[j].transpose()).transpose();
  }
  for (const SharedLayer& s : shared_) {
    const Mat<S>& x = acts[static_cast<std::size_t>(s.layer)];
    const auto n = static_cast<int64_t>(s.rows.size());
    if (!s.contiguous) scratch_.resize(n, batch);
    pp_factored_project_args a{};
    a.struct_size = sizeof(a);
    a.dtype = std::is_same_v<S, float> ? PP_DTYPE_F32 : PP_DTYPE_F64;
    a.samples = batch;
    a.width = x.cols();
    a.n_dirs = n;
    a.x = x.data();
    a.x_stride = x.cols();
    a.dirs = s.dirs.data();
    a.dirs_stride = s.dirs.cols();
    a.out = s.contiguous ? v_src.row(s.rows[0]).data() : scratch_.data();
    a.out_stride = batch;
    a.threads = 0;  // the calling arena's threads
    pp_error err{};
    if (op_->project(&a, &err) != PP_OK)
      throw std::runtime_error("the factored_correction operation (" + provider_ +
                               ") failed: " + err.message);
    if (!s.contiguous)
      for (int64_t k = 0; k < n; ++k)
        v_src.row(s.rows[static_cast<std::size_t>(k)]) = scratch_.row(k);
  }
}

template <class S>
std::string DirectionProjections<S>::describe() const {
  if (directions_.empty()) return "no dense subspace directions";
  if (op_ == nullptr)
    return "one product per direction (no factored_correction operation loaded for cpu, " +
           std::string(std::is_same_v<S, float> ? "float32" : "float64") + ")";
  if (shared_.empty())
    return "one product per direction (no affine layer has " + std::to_string(kMinShared) +
           " or more directions for factored_correction from " + provider_ + ")";
  std::string text = "factored_correction from " + provider_ + " for layer";
  text += shared_.size() > 1 ? "s " : " ";
  for (std::size_t i = 0; i < shared_.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shared_[i].layer) + " (" +
            std::to_string(shared_[i].rows.size()) + " directions)";
  std::size_t own = 0;
  for (char c : by_operation_) own += c == 0 ? 1 : 0;
  if (own > 0) text += "; " + std::to_string(own) + " other directions one product each";
  return text;
}

template class DirectionProjections<float>;
template class DirectionProjections<double>;

}  // namespace polyprobe::cpu_tbb
