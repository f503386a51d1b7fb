// partita::nn::Broadcast — seed 000/001 Broadcast as a torch::nn module.
//
// Forward: every worker of P_y receives a copy of the subtensor held by the
// P_x worker it is paired with by the broadcast rules (docs/design.md); a worker
// only in P_x returns a zero-volume tensor ({batch, 0} with preserve_batch);
// a worker in neither returns a clone of its zero-volume input.
// Adjoint: the sum-reduce over the same teams — each P_x worker receives the
// sum of the gradients of the copies of its subtensor (seed 000, "the
// subtensors on P_y are sum-reduced back to P_x").
//
// A thin wrapper of functional::broadcast (functional.hpp).
// Construction is collective over the world (every rank builds the layer,
// inactive ones too) and creates the teams' communicators once; a call
// exchanges one small header per rank of P_x ∪ P_y (so shape and dtype
// errors raise on all of them) and then moves the data.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"
#include "partita/options.hpp"

namespace partita::nn {

class BroadcastImpl : public torch::nn::Module {
 public:
  BroadcastImpl(const mpi::Partition& P_x, const mpi::Partition& P_y, Options options = {});
  torch::Tensor forward(const torch::Tensor& x);

  const mpi::Partition& P_send() const { return plan_.P_send(); }
  const mpi::Partition& P_recv() const { return plan_.P_recv(); }
  // What forward passes to functional::broadcast.
  const functional::BroadcastPlan& plan() const { return plan_; }

 private:
  functional::BroadcastPlan plan_;
};
TORCH_MODULE(Broadcast);

}  // namespace partita::nn
