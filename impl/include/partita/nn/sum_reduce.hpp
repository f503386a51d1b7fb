// partita::nn::SumReduce — seed 001's SumReduce layer as a torch::nn module.
//
// Forward: every worker of P_y returns the sum of the subtensors of the P_x
// workers paired with it by the reduction rules (its own input included
// when it is one of them); a worker only in P_x returns a zero-volume tensor
// ({batch, 0} with preserve_batch); a worker in neither a clone of its
// zero-volume input.
// Adjoint: the broadcast over the same teams (seed 001, "Adjoint"): each P_x
// worker receives a copy of the gradient of the sum it contributed to.
//
// A thin wrapper of functional::sum_reduce (functional.hpp).
// Construction and calls follow the same rules as Broadcast.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"
#include "partita/options.hpp"

namespace partita::nn {

class SumReduceImpl : public torch::nn::Module {
 public:
  SumReduceImpl(const mpi::Partition& P_x, const mpi::Partition& P_y, Options options = {});
  torch::Tensor forward(const torch::Tensor& x);

  const mpi::Partition& P_send() const { return plan_.P_send(); }
  const mpi::Partition& P_recv() const { return plan_.P_recv(); }
  // What forward passes to functional::sum_reduce.
  const functional::SumReducePlan& plan() const { return plan_; }

 private:
  functional::SumReducePlan plan_;
};
TORCH_MODULE(SumReduce);

}  // namespace partita::nn
