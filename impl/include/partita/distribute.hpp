// Cutting a global tensor into this rank's piece and putting it back
// together: DTensor's distribute_tensor and full_tensor for a Partition
// (docs/partitions.md, "A global tensor and its pieces").
//
//   auto P = mpi::Partition::world().create_cartesian_topology_partition({2, 1});
//   at::Tensor mine = partita::distribute(global, P);   // this rank's rows
//   at::Tensor back = partita::gather(mine, P);         // == global on P's workers
//
// The pieces are the balanced decomposition along every dimension
// (docs/design.md): a length n over p workers gives worker i n/p elements,
// one more for each of the first n%p workers, in row-major worker order. A
// partition of fewer dimensions than the tensor is read with leading ones
// ({2} on a 3-D tensor is {1, 1, 2}).
#pragma once

#include "partita/mpi/partition.hpp"

namespace at {
class Tensor;
}

namespace partita {

// This worker's piece of `global`: its balanced block, a copy (contiguous,
// never a view of `global`, with global's dtype and no autograd history).
// Local: no communication, so every worker of P must pass the same global
// tensor. A worker outside P (or with the null partition) gets a
// zero-volume tensor {0} of global's dtype. Throws ShapeError when P has
// more dimensions than `global`.
at::Tensor distribute(const at::Tensor& global, const mpi::Partition& P);

// The global tensor whose pieces the workers of P hold (the inverse of
// distribute for any pieces that tile a tensor: uneven, or not balanced).
// Collective over P's workers (under partita's waiting policy); a worker
// outside P returns an undefined tensor at once without communicating.
// Every worker of P gets the whole tensor, a new one without autograd
// history. Throws ShapeError on every worker of P when the pieces do not
// tile a tensor (a piece with another number of dimensions, pieces of one
// slab with different extents) or do not share one dtype.
at::Tensor gather(const at::Tensor& local, const mpi::Partition& P);

}  // namespace partita
