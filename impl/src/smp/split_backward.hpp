// Internal to partita::smp (split_backward.cpp): a backward split into the
// input gradient (the zero-bubble schedules' I) and the weight gradient
// (W), where the layer type allows it (issue 31; docs/pipeline.md, "I and
// W"). A torch::nn::Linear called on a contiguous 2-D input is run by
// split_linear: its autograd node has an edge to the input only, computes
// dx = dy W and keeps dy beside the saved x; weight_gradients later turns
// every kept (x, dy) into grad_W += dy^T x and grad_b += sum_rows(dy), the
// very operations autograd's addmm backward performs, so the gradients are
// the full backward's bit for bit. Other layers' parameters keep autograd.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <vector>

namespace partita::smp::detail {

// The weight-gradient work of one microbatch on one chunk: one entry per
// Linear call, filled in by the input-gradient pass.
struct WeightGradWork {
  struct Entry {
    at::Tensor x, dy;        // the layer's input (saved in the forward), its output's gradient (from I)
    at::Tensor weight, bias;  // the parameters (bias may be undefined)
  };
  std::vector<Entry> entries;
};

// Whether split_linear can run `layer` on x (a Linear, x contiguous 2-D).
bool can_split(const torch::nn::LinearImpl* layer, const at::Tensor& x);
// The Linear's forward (at::linear, as its module computes it) with a
// backward node that computes the input's gradient only and records dy in
// `work`. With x not requiring grad, the node is still in the graph only if
// x is a leaf that requires grad: the caller makes it one.
at::Tensor split_linear(const torch::nn::LinearImpl& layer, const at::Tensor& x,
                        const std::shared_ptr<WeightGradWork>& work);
// W for the Linear layers: every entry whose dy the input-gradient pass set
// adds its weight and bias gradients (accumulated as autograd accumulates).
// Returns how many weight gradients it computed.
int weight_gradients(WeightGradWork& work);

}  // namespace partita::smp::detail
