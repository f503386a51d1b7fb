#include "partita/reference/layer_norm.hpp"

#include <ATen/ATen.h>

#include "partita/errors.hpp"
#include "partita/shape.hpp"

namespace partita::reference {

Tensors sequence_parallel_layer_norm(const Partition& P_x, int64_t features, const at::Tensor& weight,
                                     const at::Tensor& bias, double eps, const Tensors& x) {
  Tensors y;
  for (int r = 0; r < static_cast<int>(x.size()); ++r) {
    if (!P_x.active(r)) {
      y.push_back(x[r].clone());
      continue;
    }
    if (x[r].dim() == 0 || x[r].size(-1) != features)
      throw ShapeError("sequence_parallel_layer_norm: worker " + std::to_string(r) + " holds x of shape " +
                           shape_string(x[r].sizes().vec()) + ", not " + std::to_string(features) +
                           " features last",
                       rule_code::kTilingDims);
    // Normalised over the last dimension, written out.
    const at::Tensor mean = x[r].mean(-1, true);
    const at::Tensor var = (x[r] - mean).pow(2).mean(-1, true);
    at::Tensor out = (x[r] - mean) / (var + eps).sqrt();
    if (weight.defined()) out = out * weight;
    if (bias.defined()) out = out + bias;
    y.push_back(out);
  }
  return y;
}

}  // namespace partita::reference
