#pragma once

#include <cstdint>

#include "partita/options.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every P_x worker ends with its piece, by the balanced decomposition along
// tensor dimension `dim`, of the sum of its team's inputs (the workers that
// differ from it only along partition dimension `axis`); others with a
// clone. Adjoint (autograd): the all-gather.
Tensors reduce_scatter(const Partition& P_x, int axis, int64_t dim, const Tensors& x);
// DistDL's form (GatherAxes in partita/options.hpp).
Tensors reduce_scatter(const Partition& P_x, const GatherAxes& axes, const Tensors& x);

}  // namespace partita::reference
