// The pipeline's central check, shared by its spec test and its
// lockstep property: a model trained through smp::DistributedModel and
// smp::step equals the same model trained on one process with the whole
// batch (every replica's rows), loss, gradients and parameters, in float64.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"

namespace partita::testing {

// An MLP (Linear, GELU, Linear, GELU, ..., Linear: widths[0] in, widths.back()
// out) or a stack of transformer-style blocks (Linear(in, width), then one
// residual block x + Linear(GELU(Linear(LayerNorm(x)))) per hidden width
// widths[1..n-2] with width widths[1], then Linear(width, out)).
// `integer`: an MLP of Linear and ReLU with weights and biases drawn from
// {-1, 0, 1}, and check_against_serial draws integer-valued x and y: every
// value of the forward and backward is then exact in float64 (integers, or
// integers over the powers of two that the mean and the microbatches divide
// by, if the batch, the output width and the counts are powers of two), so
// the pipeline must equal one process bit for bit (tolerance 0).
struct ModelSpec {
  bool blocks = false;
  std::vector<int64_t> widths;
  uint64_t seed = 1;
  bool integer = false;
};

// Float64, parameters drawn from `seed`: the same model on every rank.
torch::nn::Sequential build_model(const ModelSpec& spec);

// The seed's step: the mean-squared error of the model's output against y,
// model.backward(loss), return the loss.
inline auto mse_step(smp::DistributedModel& model, int microbatches) {
  smp::StepOptions o;
  o.microbatches(microbatches);
  return smp::step(
      [&model](at::Tensor x, at::Tensor y) {
        at::Tensor loss = torch::mse_loss(model(x), y);
        model.backward(loss);
        return loss;
      },
      o);
}

struct PipelineRun {
  ModelSpec model;
  int microbatches = 1;
  std::vector<int> split_points;  // empty: balanced by parameter count
  int64_t batch = 8;              // per replica
  int steps = 5;
  double lr = 0.05;
};

std::ostream& operator<<(std::ostream& os, const PipelineRun& r);

// Collective over the world, after smp::init (partitions and pipeline come
// from the configuration). Returns "" when every step's loss and gradients
// and the final parameters equal the single-process run within `tol`, else
// the first difference. `stats` receives the model's counters of the last step.
std::string check_against_serial(const PipelineRun& run, double tol = 1e-10,
                                 smp::PipelineStats* stats = nullptr);

}  // namespace partita::testing
