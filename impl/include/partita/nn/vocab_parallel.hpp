// Megatron's vocabulary-parallel layers on a stage's `tokens` partition
// (docs/transformer.md): the vocabulary split over the tp axis (axis 1 of
// P, a `d x t x 1` partition: replicas, tp ranks, 1), token ids and targets
// split by tokens over the same axis as every sequence-parallel activation
// is (what partita::distribute gives on P).
//
//  - VocabParallelEmbedding: each worker holds the rows [start, start +
//    rows) of the [vocab, hidden] table (balanced pieces). Forward: the
//    team's ids are all-gathered, each worker looks up the ids in its rows
//    (an id outside them gives zeros), and the partial embeddings are
//    reduce-scattered back to this worker's tokens: [batch, tokens_s,
//    hidden]. Adjoint: the all-gather of the output gradient, then the
//    lookup's adjoint into this worker's rows.
//  - VocabParallelCrossEntropy: logits [batch, tokens, vocab_s] split by
//    vocabulary (what DistributedLinearAllGather(P.tokens, P.features, ...)
//    gives), targets split by tokens; returns the loss of each of this
//    worker's tokens, [batch, tokens_s], without gathering the logits: the
//    maximum, the sum of exponentials and the target's logit are reduced
//    over the team. Adjoint: the loss gradients all-gathered over the team,
//    then softmax minus one-hot on this worker's vocabulary slice.
//
// An id or target outside [0, vocab) raises ShapeError on every worker of
// its team (each sees the whole team's after the all-gather). Construction
// is collective over the world; ranks outside P return a clone.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "partita/arg.hpp"
#include "partita/mpi/partition.hpp"

namespace partita::nn {

// Set in LibTorch's style: EmbeddingOptions().dtype(at::kDouble).
struct EmbeddingOptions {
  PARTITA_ARG(at::ScalarType, dtype) = at::kFloat;
};

namespace detail {
struct VocabTeam;
}

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(const mpi::Partition& P, int64_t vocab, int64_t hidden,
                             const EmbeddingOptions& options = EmbeddingOptions());
  // ids: int64 [batch, tokens_s], this worker's tokens.
  torch::Tensor forward(const torch::Tensor& ids);

  int64_t vocab() const { return vocab_; }
  int64_t hidden() const { return hidden_; }
  // This worker's rows of the table: [vocab_start(), vocab_start() + rows).
  int64_t vocab_start() const { return start_; }
  const mpi::Partition& partition() const { return P_; }

  at::Tensor weight;  // [rows, hidden]: N(0, 1) as torch::nn::Embedding

 private:
  mpi::Partition P_;
  int64_t vocab_, hidden_, start_ = 0;
  std::shared_ptr<const detail::VocabTeam> team_;
};
TORCH_MODULE(VocabParallelEmbedding);

class VocabParallelCrossEntropyImpl : public torch::nn::Module {
 public:
  VocabParallelCrossEntropyImpl(const mpi::Partition& P, int64_t vocab);
  // logits [batch, tokens, vocab_s] (float), targets int64 [batch, tokens_s]:
  // each token's loss [batch, tokens_s], float32 for 16-bit logits (taken
  // in float32), else the logits' dtype.
  torch::Tensor forward(const torch::Tensor& logits, const torch::Tensor& targets);

  int64_t vocab() const { return vocab_; }
  int64_t vocab_start() const { return start_; }
  const mpi::Partition& partition() const { return P_; }

 private:
  mpi::Partition P_;
  int64_t vocab_, start_ = 0, rows_ = 0;
  std::shared_ptr<const detail::VocabTeam> team_;
};
TORCH_MODULE(VocabParallelCrossEntropy);

}  // namespace partita::nn
