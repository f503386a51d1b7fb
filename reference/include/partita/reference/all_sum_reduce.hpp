#pragma once

#include <vector>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every P_x worker ends with the sum over the workers that differ from it
// only along `axes`; others with a clone. Self-adjoint.
Tensors all_sum_reduce(const Partition& P_x, const std::vector<int>& axes, const Tensors& x);

}  // namespace partita::reference
