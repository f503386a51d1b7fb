// Internal to partita::smp (stages.cpp): the model's layers and the stage
// bounds, computed alike on every rank of the pp group.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "partita/smp/pipeline.hpp"

namespace partita::smp::detail {

struct Stages {
  std::vector<std::string> names;                            // every layer's ("3", "block1")
  std::vector<std::shared_ptr<torch::nn::Module>> children;  // every layer
  std::vector<LayerCall> calls;                              // how to call each
  std::vector<int> bounds;  // stages + 1 numbers: stage s holds layers [bounds[s], bounds[s+1])
};

// Collective over the world (the ranks compare their models): the model's
// layers (a Sequential's children, or any module's ordered children of
// callable types) split into ranks * v stages (v virtual stages per rank)
// by `split_points` (empty: balanced by parameter count). UsageError on
// every rank for a child the pipeline cannot call, parameters outside the
// children, different models or split points on different ranks, fewer
// layers than stages, bad split points, and distributed layers not built
// on their stage's ranks with M = tp (docs/3d.md, "Bad input").
Stages split_into_stages(const std::shared_ptr<torch::nn::Module>& model, const std::vector<int>& split_points,
                         int ranks, int v = 1);

// Whether `m` is or holds one of partita's distributed layers
// (partita::nn::DistributedLinearBase): their parameters live on some of
// the layer's workers only, and the layer itself sums their gradients over
// its partition's data-parallel axis (docs/3d.md).
bool holds_distributed_layers(const std::shared_ptr<torch::nn::Module>& m);
// The parameters of `m` that every data-parallel replica holds alike: all
// but those of partita's distributed layers that sum their gradients over
// their copies themselves (a replicated Linear layer's blocks are included).
// The pipeline averages these over the dp group after a step.
std::vector<at::Tensor> replicated_parameters(const std::shared_ptr<torch::nn::Module>& m);
// The parameters of partita's distributed layers in `m` on this rank that
// the layers sum over their copies (the blocks it stores; none on a
// data-parallel copy of a non-ZeRO layer; a replicated layer's are not).
std::vector<at::Tensor> distributed_parameters(const std::shared_ptr<torch::nn::Module>& m);

}  // namespace partita::smp::detail
