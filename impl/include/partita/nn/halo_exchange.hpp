// partita::nn::HaloExchange on a Cartesian partition (docs/design.md,
// docs/primitives.md).
//
// Every worker of P_x passes its window: its bulk with `left[k]` ghost
// slots before it and `right[k]` after it along each tensor dimension k
// (P_x is padded with leading ones to the tensor's dimensions; the bulks may
// tile the global tensor unevenly). Forward: a new tensor equal to the
// input whose ghosts are filled from the neighbours' bulk, one dimension
// after another, each step carrying the ghosts filled by the earlier ones,
// so corners arrive from the diagonal neighbour. Ghosts beyond the global
// boundary (no neighbour) keep the input's values.
// Adjoint, dimensions in reverse order: each ghost's gradient is sent back
// and added into the neighbour's bulk it came from, and zeroed; ghosts
// beyond the boundary pass their gradient through untouched (the forward is
// the identity there) and send nothing.
// A ghost wider than the neighbour's bulk that fills it, a window smaller
// than its ghosts, or bulks that do not tile a tensor raise the same
// ShapeError on every rank of P_x. Workers outside P_x return a clone.
// A thin wrapper of functional::halo_exchange (functional.hpp); with
// Storage::kInPlace, of functional::halo_exchange_, DistDL's in-place form
// (the ghosts of x itself are filled and x is returned).
// Construction is collective over P_x (the widths must agree).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"

namespace partita::nn {

class HaloExchangeImpl : public torch::nn::Module {
 public:
  // kNew: a new tensor (the default: outputs are new storage); kInPlace: x itself.
  enum class Storage { kNew, kInPlace };
  HaloExchangeImpl(const mpi::Partition& P_x, Shape left, Shape right,
                   Storage storage = Storage::kNew, Shapes shapes = Shapes::kPerCall);
  torch::Tensor forward(const torch::Tensor& x);
  const functional::HaloExchangePlan& plan() const { return plan_; }

 private:
  functional::HaloExchangePlan plan_;
  Storage storage_ = Storage::kNew;
};
TORCH_MODULE(HaloExchange);

}  // namespace partita::nn
