#pragma once

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// The halo exchange on a Cartesian P_x (docs/design.md, docs/primitives.md):
// every P_x worker passes its window, its bulk with `left[k]` and
// `right[k]` ghost slots along each tensor dimension k (P_x padded with
// leading ones to the tensor's dimensions). The bulks tile a global tensor;
// pad it by the widths and cut out each worker's window: every ghost
// element whose position lies inside the global tensor takes the global
// value there, every other element (the bulk, and ghosts beyond the global
// boundary) keeps the worker's own input. Workers outside P_x end with a
// clone. Adjoint (autograd): ghost gradients added into the bulk they came
// from and zeroed; ghosts beyond the boundary pass theirs through.
Tensors halo_exchange(const Partition& P_x, const Shape& left, const Shape& right, const Tensors& x);

}  // namespace partita::reference
