#pragma once

#include <cstdint>

#include "partita/options.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every P_x worker ends with the concatenation along tensor dimension `dim`
// of the inputs of its team (the workers that differ from it only along
// partition dimension `axis`), in team order; others with a clone.
// Adjoint (autograd): the reduce-scatter.
Tensors all_gather(const Partition& P_x, int axis, int64_t dim, const Tensors& x);
// DistDL's form (GatherAxes in partita/options.hpp).
Tensors all_gather(const Partition& P_x, const GatherAxes& axes, const Tensors& x);

}  // namespace partita::reference
