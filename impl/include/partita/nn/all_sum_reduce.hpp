// partita::nn::AllSumReduce — seed 000's AllSumReduce as a torch::nn module.
//
// Forward: every worker of P_x returns the sum of the inputs of the workers
// that differ from it only along `axes` (its all-reduction team); a worker
// outside P_x returns a clone of its zero-volume input. No axes: a clone.
// Adjoint: itself (the same sum over the same teams), seed 000.
//
// A thin wrapper of functional::all_sum_reduce (functional.hpp).
// Construction is collective over the active members of P_x.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/nn/functional.hpp"

namespace partita::nn {

class AllSumReduceImpl : public torch::nn::Module {
 public:
  AllSumReduceImpl(const mpi::Partition& P_x, std::vector<int> axes,
                   Shapes shapes = Shapes::kPerCall);
  torch::Tensor forward(const torch::Tensor& x);

  const mpi::Partition& team() const { return plan_.team(); }
  const functional::AllSumReducePlan& plan() const { return plan_; }

 private:
  functional::AllSumReducePlan plan_;
};
TORCH_MODULE(AllSumReduce);

}  // namespace partita::nn
