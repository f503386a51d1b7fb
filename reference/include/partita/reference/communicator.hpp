// The serial reference of the differentiable communicator (seed 003): each
// call is the operation applied to the list of every rank's tensor, on one
// process (`x[r]` is what rank r passes; the result holds what each rank
// gets). Plain torch operations (clone, cat, narrow, sum), so the adjoint of
// every differentiable call comes from autograd. Independent of impl/.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "partita/reduce_op.hpp"

namespace partita::reference::comm {

using Tensors = std::vector<at::Tensor>;

// Every rank gets op over all ranks' tensors.
Tensors allreduce(const Tensors& x, ReduceOp op);
// Every rank gets the root's tensor.
Tensors bcast(const Tensors& x, int root);
// The root gets op over all ranks' tensors, the others zeros of their shape.
Tensors reduce(const Tensors& x, ReduceOp op, int root);
// The root gets the concatenation along `axis`; the others a tensor of their
// shape with extent 0 along it.
Tensors gather(const Tensors& x, int64_t axis, int root);
Tensors allgather(const Tensors& x, int64_t axis);
// Rank r gets its piece of the root's tensor: extent numelem[r] along `axis`,
// after the pieces of the ranks before it.
Tensors scatter(const Tensors& x, int64_t axis, const std::vector<int64_t>& numelem, int root);
// Rank j gets piece j (numelem[j] along scatter_axis) of every rank's tensor,
// concatenated along gather_axis in rank order; with equal axes, its piece
// of the concatenation of all ranks' tensors along that axis.
Tensors alltoall(const Tensors& x, int64_t gather_axis, int64_t scatter_axis,
                 const std::vector<int64_t>& numelem);
// Point to point in a ring: every rank sends to rank + shift (mod size), so
// rank r receives x[r - shift]: a rotation of the list.
Tensors ring(const Tensors& x, int shift);

}  // namespace partita::reference::comm
