// The sequence-parallel LayerNorm's serial twin: one global weight and bias
// ([features]), and every worker of P_x normalises its own tokens with them
// over the last dimension. Written on the global parameters, so autograd
// through it gives the whole gradient: the sum of every worker's share.
#pragma once

#include <cstdint>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// What each world rank returns: LayerNorm of its x on P_x's workers (x's
// last dimension must be `features`: ShapeError otherwise), a clone
// elsewhere. weight and bias may be undefined (no affine part).
Tensors sequence_parallel_layer_norm(const Partition& P_x, int64_t features, const at::Tensor& weight,
                                     const at::Tensor& bias, double eps, const Tensors& x);

}  // namespace partita::reference
