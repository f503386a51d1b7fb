// partita::nn::SequenceParallelLayerNorm: Megatron's sequence-parallel
// LayerNorm (docs/transformer.md). Each worker of P_x normalises its own
// tokens over the last dimension (never split) with the whole weight and
// bias, which every worker holds; the gradients of weight and bias, partial
// on each worker (its own tokens' share), are summed over the workers that
// differ along `grad_sum_axes` (by default every axis of P_x but the first,
// the data-parallel one, whose copies smp's pipeline averages). Forward: no
// communication. Adjoint: one all-reduce of dW and db over that team.
//
// Construction is collective over the world; ranks outside P_x hold the
// parameters too but a call there returns a clone of the input.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "partita/arg.hpp"
#include "partita/mpi/partition.hpp"

namespace partita::nn {

// Set in LibTorch's style: LayerNormOptions().eps(1e-6).dtype(at::kDouble).
struct LayerNormOptions {
  PARTITA_ARG(double, eps) = 1e-5;
  PARTITA_ARG(bool, elementwise_affine) = true;
  PARTITA_ARG(at::ScalarType, dtype) = at::kFloat;
  // The axes of P_x whose workers' gradients are summed; empty (the
  // default): every axis but the first.
  PARTITA_ARG(std::vector<int>, grad_sum_axes);
};

namespace detail {
struct GradSum;
}

class SequenceParallelLayerNormImpl : public torch::nn::Module {
 public:
  SequenceParallelLayerNormImpl(const mpi::Partition& P_x, int64_t features,
                                const LayerNormOptions& options = LayerNormOptions());
  torch::Tensor forward(const torch::Tensor& x);

  const mpi::Partition& partition() const { return P_x_; }
  int64_t features() const { return features_; }
  const LayerNormOptions& options() const { return options_; }
  // The workers whose gradients are summed with this rank's (P_x's team).
  const mpi::Partition& grad_sum_team() const;

  at::Tensor weight, bias;  // [features] each; undefined without affine

 private:
  mpi::Partition P_x_;
  int64_t features_;
  LayerNormOptions options_;
  std::shared_ptr<const detail::GradSum> sum_;
};
TORCH_MODULE(SequenceParallelLayerNorm);

}  // namespace partita::nn
