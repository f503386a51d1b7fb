#pragma once

#include "partita/options.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every P_y worker ends with a copy of the subtensor of the P_x worker
// paired with it; P_x-only workers with a zero-volume tensor; others with a
// clone of their input. Adjoint (autograd): the sum-reduce.
Tensors broadcast(const Partition& P_x, const Partition& P_y, const Tensors& x,
                  const Options& options = {});

}  // namespace partita::reference
