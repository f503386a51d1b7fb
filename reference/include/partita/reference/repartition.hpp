#pragma once

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// The seeds' Transpose: the global tensor tiled by P_x's inputs (any extents
// that tile it along P_x's grid) is cut by the balanced decomposition over
// P_y. Partitions with fewer dimensions than the tensor are padded with
// leading ones. Every P_y worker ends with its piece; P_x-only workers with
// {0}; others with a clone. Adjoint (autograd): the reverse repartition.
Tensors repartition(const Partition& P_x, const Partition& P_y, const Tensors& x);

}  // namespace partita::reference
