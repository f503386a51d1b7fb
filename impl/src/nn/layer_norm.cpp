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
  struct Compiled {};
  PlanCache<Compiled> plans;

  // Every worker sees every worker's header, so every one raises alike.
  void check(const at::Tensor& x) const {
    std::vector<Header> headers;
    if (plans.lookup(P_x, make_header(x), name, headers)) return;
    check_inputs(name, P_x, P_x, headers);
    for (size_t r = 0; r < headers.size(); ++r) {
      const Shape s = headers[r].shape();
      if (s.empty() || s.back() != features)
        throw ShapeError(name + ": worker " + std::to_string(r) + " of P_x holds x of shape " + shape_string(s) +
                             "; its last dimension must be the " + std::to_string(features) +
                             " normalised features",
                         rule_code::kTilingDims);
    }
    plans.insert(headers, std::make_shared<Compiled>());
  }

  // The parameter as the forward uses it: the same values; its adjoint sums
  // the gradient over the team (every worker then holds the whole).
  at::Tensor summed(const at::Tensor& p) const {
    if (team.size() <= 1 || !p.requires_grad() || !at::GradMode::is_enabled()) return p;
    return with_adjoint(p.detach().clone(), p, true, adjoint_name,
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
  sum_->check(x);
  at::Tensor w, b;
  if (options_.elementwise_affine()) {
    w = sum_->summed(weight);
    b = sum_->summed(bias);
  }
  return at::layer_norm(x, {features_}, w, b, options_.eps());
}

}  // namespace partita::nn
