#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>

#include <nlohmann/json.hpp>

#include <type_traits>
#include <vector>

namespace polyprobe {

Model::Model(Shape input_shape, DType dtype) : input_shape_(std::move(input_shape)), dtype_(dtype) {
  if (input_shape_.dims.empty() || input_shape_.numel() <= 0)
    throw Error("model input shape " + input_shape_.str() + " is empty");
}

const Shape& Model::output_shape() const {
  return layers_.empty() ? input_shape_ : layers_.back()->output_shape();
}

void Model::add(std::shared_ptr<const Layer> layer) {
  if (!layer) throw Error("cannot add a null layer to a model");
  const std::size_t index = layers_.size();
  if (layer->input_shape() != output_shape())
    throw Error("layer " + std::to_string(index) + " (" + layer->kind() + ") expects input " +
                layer->input_shape().str() + " but the previous output is " + output_shape().str());
  layer_offsets_.push_back(num_parameters());
  for (const ParamSpec& spec : layer->parameters()) {
    const int64_t offset = num_parameters();
    entries_.push_back(
        {std::to_string(index) + "." + spec.name, index, spec.shape, offset, spec.numel()});
    params_.resize(static_cast<std::size_t>(offset + spec.numel()), 0.0);
  }
  layers_.push_back(std::move(layer));
}

void Model::initialize(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const int64_t count = layers_[i]->parameter_count();
    layers_[i]->initialize(
        std::span<double>(params_).subspan(static_cast<std::size_t>(layer_offsets_[i]),
                                           static_cast<std::size_t>(count)),
        rng);
  }
}

template <class S>
Matrix<S> Model::forward(ConstMatrixRef<S> x, std::span<const double> params) const {
  if (static_cast<int64_t>(params.size()) != num_parameters())
    throw Error("parameter vector has " + std::to_string(params.size()) + " entries, model has " +
                std::to_string(num_parameters()));
  if constexpr (std::is_same_v<S, double>) {
    return forward_converted<S>(x, params);
  } else {
    const std::vector<S> converted(params.begin(), params.end());
    return forward_converted<S>(x, converted);
  }
}

template <class S>
Matrix<S> Model::forward_converted(ConstMatrixRef<S> x, std::span<const S> params) const {
  if (x.cols() != input_shape_.numel())
    throw Error("model input has " + std::to_string(x.cols()) + " features, expected " +
                std::to_string(input_shape_.numel()) + " (shape " + input_shape_.str() + ")");
  if (static_cast<int64_t>(params.size()) != num_parameters())
    throw Error("parameter vector has " + std::to_string(params.size()) + " entries, model has " +
                std::to_string(num_parameters()));
  Matrix<S> current = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    const auto count = static_cast<std::size_t>(layer.parameter_count());
    const auto offset = static_cast<std::size_t>(layer_offsets_[i]);
    Matrix<S> next(current.rows(), layer.output_shape().numel());
    layer.forward(current, params.subspan(offset, count), next);
    current.swap(next);
  }
  return current;
}

template Matrix<float> Model::forward<float>(ConstMatrixRef<float>, std::span<const double>) const;
template Matrix<float> Model::forward_converted<float>(ConstMatrixRef<float>,
                                                       std::span<const float>) const;
template Matrix<double> Model::forward_converted<double>(ConstMatrixRef<double>,
                                                         std::span<const double>) const;
template Matrix<double> Model::forward<double>(ConstMatrixRef<double>,
                                               std::span<const double>) const;

}  // namespace polyprobe
