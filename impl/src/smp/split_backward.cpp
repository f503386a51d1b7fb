// The Linear layer's backward split into I (input gradient) and W (weight
// gradient), for the zero-bubble schedules (split_backward.hpp).
#include "split_backward.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

namespace partita::smp::detail {

namespace {

// The node of y = x W^T + b with an edge to x only: no edge to W or b, so
// no backward pass of autograd's ever computes their gradients; I computes
// dx and leaves dy for W.
struct LinearInputGradient : torch::autograd::Node {
  at::Tensor weight;
  std::shared_ptr<WeightGradWork> work;
  size_t entry = 0;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor& dy = grads[0];
    work->entries[entry].dy = dy;  // a second pass (autograd for other layers' W) sets the same values
    at::Tensor dx;
    // addmm's backward for its first matrix, x (row-major): dy.mm(W^T^T).
    if (dy.defined() && task_should_compute_output(0)) dx = dy.mm(weight);
    return {dx};
  }
  std::string name() const override { return "partita::smp::LinearInputGradient"; }
  void release_variables() override { weight.reset(); }
};

}  // namespace

bool can_split(const torch::nn::LinearImpl* layer, const at::Tensor& x) {
  return layer && x.defined() && x.dim() == 2 && x.is_contiguous() && x.requires_grad() &&
         layer->weight.is_contiguous() && at::isFloatingType(x.scalar_type());
}

at::Tensor split_linear(const torch::nn::LinearImpl& layer, const at::Tensor& x,
                        const std::shared_ptr<WeightGradWork>& work) {
  at::Tensor y;
  {
    at::AutoGradMode off(false);
    y = torch::nn::functional::linear(x, layer.weight, layer.bias);
  }
  work->entries.push_back({x, at::Tensor(), layer.weight, layer.bias});
  auto node = std::shared_ptr<LinearInputGradient>(new LinearInputGradient(), torch::autograd::deleteNode);
  node->weight = layer.weight;
  node->work = work;
  node->entry = work->entries.size() - 1;
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(y, node);
  return y;
}

namespace {
// As AccumulateGrad adds a gradient outside grad mode: the first one is
// kept (detached: a gradient must not be a view, zero_grad detaches it in
// place), later ones are added in place.
void accumulate(const at::Tensor& param, const at::Tensor& g) {
  if (!param.grad().defined()) const_cast<at::Tensor&>(param).mutable_grad() = g.detach();
  else const_cast<at::Tensor&>(param).mutable_grad().add_(g);
}
}  // namespace

int weight_gradients(WeightGradWork& work) {
  at::NoGradGuard no_grad;
  int n = 0;
  for (auto& e : work.entries) {
    if (!e.dy.defined()) continue;
    // addmm's backward for W^T (column-major): (dy^T x)^T, transposed back
    // by W^T's backward: dy^T x. The bias's: dy summed to its shape.
    if (e.weight.requires_grad()) {
      accumulate(e.weight, e.dy.t().mm(e.x));
      ++n;
    }
    if (e.bias.defined() && e.bias.requires_grad()) {
      accumulate(e.bias, e.dy.sum({0}, /*keepdim=*/true).view(e.bias.sizes()));
      ++n;
    }
    e.x = e.dy = at::Tensor();
  }
  return n;
}

}  // namespace partita::smp::detail
