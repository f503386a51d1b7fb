// partita::nn::AllGather along one dimension of a Cartesian partition
// (docs/design.md, "The primitives"); its adjoint, partita::nn::ReduceScatter, is in
// reduce_scatter.hpp (included here, where it was declared before).
//
// Teams: the workers of P_x that differ only along partition dimension
// `axis`, in order along it.
// AllGather forward: every member gets the concatenation of the team's
// inputs along tensor dimension `dim` (inputs may differ in extent along
// `dim` only). Adjoint: the reduce-scatter — the team's gradients summed, and
// each member keeps the slice its own input occupied.
// Workers outside P_x return a clone of their (zero-volume) input.
// A thin wrapper of functional::all_gather (functional.hpp).
// Construction is collective over the active members of P_x.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"
#include "partita/nn/reduce_scatter.hpp"
#include "partita/options.hpp"

namespace partita::nn {

class AllGatherImpl : public torch::nn::Module {
 public:
  AllGatherImpl(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes = Shapes::kPerCall);
  // DistDL's form: AllGather(P_x, {.axes = {0}}) or {.axes_keep = {1}}; the
  // dimensions listed are gathered one after the other (ascending), and
  // backward divides by the scale_backward extents (without touching the
  // caller's gradient). Errors (neither or both given, a dimension out of
  // range or repeated) raise PartitionError on every rank.
  AllGatherImpl(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes = Shapes::kPerCall);
  torch::Tensor forward(const torch::Tensor& x);
  const functional::AllGatherPlan& plan() const { return plan_; }

 private:
  functional::AllGatherPlan plan_;
};
TORCH_MODULE(AllGather);

}  // namespace partita::nn
