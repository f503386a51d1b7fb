// partita::nn::ReduceScatter along one dimension of a Cartesian partition
// (docs/design.md, "The primitives").
//
// Teams: the workers of P_x that differ only along partition dimension
// `axis`, in order along it.
// Forward: the team's inputs (one shape) summed, split along `dim` by the
// balanced decomposition (member i of k gets N/k + (i < N%k) rows starting
// at i*(N/k) + min(i, N%k)). Adjoint: the all-gather of the slices'
// gradients (all_gather.hpp).
// Workers outside P_x return a clone of their (zero-volume) input.
// A thin wrapper of functional::reduce_scatter (functional.hpp).
// Construction is collective over the active members of P_x.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"
#include "partita/options.hpp"

namespace partita::nn {

class ReduceScatterImpl : public torch::nn::Module {
 public:
  ReduceScatterImpl(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes = Shapes::kPerCall);
  // DistDL's form: ReduceScatter(P_x, {.axes = ...}) (axes_reduce_scatter)
  // or {.axes_keep = ...}; scale_backward must be empty.
  ReduceScatterImpl(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes = Shapes::kPerCall);
  torch::Tensor forward(const torch::Tensor& x);
  const functional::ReduceScatterPlan& plan() const { return plan_; }

 private:
  functional::ReduceScatterPlan plan_;
};
TORCH_MODULE(ReduceScatter);

}  // namespace partita::nn
