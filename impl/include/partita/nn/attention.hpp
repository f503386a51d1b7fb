// partita::nn::ParallelSelfAttention: Megatron's causal self-attention with
// the heads split over tp, between the all-gather and the reduce-scatter of
// sequence parallelism (docs/transformer.md). On a stage's partitions
// (tokens: d x t x 1, features: d x 1 x t):
//
//   x [b, T_s, H] split by tokens
//   -> qkv: DistributedLinearAllGather(tokens, features, H, 3H): the team's
//      tokens gathered, this worker's heads' q, k and v [b, T, 3 H / t]
//      (the global QKV weight's rows are ordered head by head, q, k, v of
//      each head together, so a balanced split gives whole heads)
//   -> per head: softmax(q k^T / sqrt(head_dim) + causal mask) v, the
//      softmax in float32 for 16-bit dtypes, else in the dtype
//   -> proj: DistributedLinearReduceScatter(features, tokens, H, H): the
//      heads' partial projections summed over the team, cut by tokens
//   -> y [b, T_s, H]
//
// The heads must divide by t (PartitionError otherwise, on every rank). The
// parameters are the two Linear layers' (W and b as seed 002 stores them,
// blocks over tp, on replica 0 or, with LinearOptions().replicated(true),
// on every replica).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/mpi/partition.hpp"
#include "partita/nn/linear.hpp"

namespace partita::nn {

class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  ParallelSelfAttentionImpl(const mpi::Partition& P_tokens, const mpi::Partition& P_features, int64_t hidden,
                            int64_t heads, const LinearOptions& options = LinearOptions());
  torch::Tensor forward(const torch::Tensor& x);

  int64_t hidden() const { return hidden_; }
  int64_t heads() const { return heads_; }

  DistributedLinearAllGather qkv{nullptr};
  DistributedLinearReduceScatter proj{nullptr};

 private:
  mpi::Partition P_tokens_;
  int64_t hidden_, heads_;
  // The agreement on x's token split (attention.cpp).
  std::shared_ptr<const void> split_;
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace partita::nn
