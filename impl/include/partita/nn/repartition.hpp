// partita::nn::Repartition (the seeds' Transpose; `Transpose` is an alias).
//
// Forward: the global tensor tiled by P_x's inputs moves to the balanced
// decomposition over P_y. The inputs may tile it unevenly (any extents that
// tile it along P_x's grid); the global shape is discovered on every call
// from the inputs (workers outside P_x learn it), so a call with other
// shapes re-plans. Partitions with fewer dimensions than the tensor are
// padded with leading ones. A worker only in P_x returns {0}; a worker in
// neither a clone of its input.
// Each worker computes its (slice, size, partner) send and receive lists
// (seed 000) and moves the pieces in one exchange: by default non-blocking
// point-to-point messages, what stays local copied without MPI (measured
// 12-24% faster than the alternative at >= 64 KiB, 2 ranks); or one
// MPI_Ialltoallw. Either way the slices are addressed in place through
// subarray datatypes (no packing by partita). docs/benchmarks.md has the
// measurement behind the default.
// Adjoint: the reverse repartition (the same lists, directions swapped;
// the pieces do not overlap, so the adjoint's sum is a copy).
// A thin wrapper of functional::repartition (functional.hpp).
// Construction is collective over the world.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"

namespace partita::nn {

class RepartitionImpl : public torch::nn::Module {
 public:
  RepartitionImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                  RepartitionExchange how = RepartitionExchange::kPointToPoint,
                  Shapes shapes = Shapes::kPerCall);
  torch::Tensor forward(const torch::Tensor& x);
  const functional::RepartitionPlan& plan() const { return plan_; }

 private:
  functional::RepartitionPlan plan_;
};
TORCH_MODULE(Repartition);

// The seeds' name.
using TransposeImpl = RepartitionImpl;
using Transpose = Repartition;

}  // namespace partita::nn
