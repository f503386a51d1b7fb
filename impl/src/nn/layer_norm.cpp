#include "partita/nn/layer_norm.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "detail/team_comm.hpp"
#include "partita/nn/traffic.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

// The checks of a call and the sum of the parameters' gradients over the
// team of workers that differ along the chosen axes.
struct GradSum {
  std::string name, adjoint_name;
  mpi::Partition P_x, team;
  int64_t features = 0;
  struct Compiled {
    bool attach = false;  // some worker's weight or bias wants a gradient
  };
  PlanCache<Compiled> plans;

  // Every worker sees every worker's header, so every one raises alike and
  // every one attaches the gradient sum, or none does (its all-reduce needs
  // the whole team). `grad`: this worker's parameters want a gradient.
  bool check(const at::Tensor& x, bool grad) const {
    std::vector<Header> headers;
    Header mine = make_header(x);
    mine.requires_grad = grad_statement(grad);  // (x's own history is at::layer_norm's)
    if (auto hit = plans.lookup(P_x, mine, name, headers)) return hit->attach;
    check_inputs(name, P_x, P_x, headers);
    auto c = std::make_shared<Compiled>();
    for (size_t r = 0; r < headers.size(); ++r) {
      const Shape s = headers[r].shape();
      if (s.empty() || s.back() != features)
        throw ShapeError(name + ": worker " + std::to_string(r) + " of P_x holds x of shape " + shape_string(s) +
                             "; its last dimension must be the " + std::to_string(features) +
                             " normalised features",
                         rule_code::kTilingDims);
    }
    c->attach = agree_attach(name, P_x, headers);
    plans.insert(headers, c);
    return c->attach;
  }

  // The parameters as the forward uses them: the same values; the adjoint
  // sums their gradients over the team in one all-reduce (every worker then
  // holds the whole). `both`: the weight and the bias, concatenated (a
  // frozen one's part of the sum is dropped by autograd).
  at::Tensor summed(const at::Tensor& both) const {
    return with_adjoint(both.detach().clone(), both, true, adjoint_name,
                        [t = team, what = adjoint_name](const at::Tensor& g) {
                          count_model_parallel((t.size() - 1) * g.numel() * static_cast<int64_t>(g.element_size()));
                          return allreduce_team(t, g, what);
                        });
  }
};

}  // namespace detail

SequenceParallelLayerNormImpl::SequenceParallelLayerNormImpl(const mpi::Partition& P_x, int64_t features,
                                                             const LayerNormOptions& options)
    : P_x_(P_x), features_(features), options_(options) {
  const std::string name = "SequenceParallelLayerNorm(P_x " + P_x.describe() + ", " + std::to_string(features) + ")";
  if (P_x.is_null()) throw PartitionError(name + ": P_x is the null partition", rule_code::kNullPartition);
  if (features < 1) throw PartitionError(name + ": features must be at least 1", rule_code::kLinearLayout);
  const int dims = static_cast<int>(P_x.shape().size());
  if (P_x.shape().back() != 1)
    throw PartitionError(name + ": the normalised (last) dimension is split over " +
                             std::to_string(P_x.shape().back()) + " workers; it must be whole on every worker",
                         rule_code::kAxisRange);
  std::vector<int> axes = options.grad_sum_axes();
  if (axes.empty())
    for (int a = 1; a < dims; ++a) axes.push_back(a);
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] < 0 || axes[i] >= dims || std::count(axes.begin(), axes.end(), axes[i]) > 1)
      throw PartitionError(name + ": grad_sum_axes must be distinct axes of P_x (0.." + std::to_string(dims - 1) + ")",
                           rule_code::kAxisRange);
  auto sum = std::make_shared<detail::GradSum>();
  sum->name = name;
  sum->adjoint_name = name + " gradient sum";
  sum->P_x = P_x;
  sum->team = P_x.create_allreduction_partition(axes);
  sum->features = features;
  sum_ = sum;
  if (options.elementwise_affine()) {
    const auto o = at::TensorOptions().dtype(options.dtype());
    weight = register_parameter("weight", at::ones({features}, o));
    bias = register_parameter("bias", at::zeros({features}, o));
  }
}

const mpi::Partition& SequenceParallelLayerNormImpl::grad_sum_team() const { return sum_->team; }

torch::Tensor SequenceParallelLayerNormImpl::forward(const torch::Tensor& x) {
  if (!P_x_.active()) return x.clone();
  const bool grad = options_.elementwise_affine() && at::GradMode::is_enabled() &&
                    (weight.requires_grad() || bias.requires_grad());
  const bool attach = sum_->check(x, grad);
  at::Tensor w, b;
  if (options_.elementwise_affine() && attach && sum_->team.size() > 1) {
    const at::Tensor both = sum_->summed(at::cat({weight, bias}));
    w = both.narrow(0, 0, features_);
    b = both.narrow(0, features_, features_);
  } else if (options_.elementwise_affine()) {
    w = weight;
    b = bias;
  }
  return at::layer_norm(x, {features_}, w, b, options_.eps());
}

}  // namespace partita::nn
