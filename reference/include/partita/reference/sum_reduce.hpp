#pragma once

#include "partita/options.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every P_y worker ends with the sum of the subtensors of the P_x workers
// paired with it (which must share one shape); P_x-only workers with a
// zero-volume tensor; others with a clone. Adjoint (autograd): the broadcast.
Tensors sum_reduce(const Partition& P_x, const Partition& P_y, const Tensors& x,
                   const Options& options = {});

}  // namespace partita::reference
