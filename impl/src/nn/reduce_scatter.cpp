// partita::nn::ReduceScatter and functional::reduce_scatter: the steps along
// the scattered dimensions, run by the team code ReduceScatter shares with
// AllGather, its adjoint (detail/gather_layer.{hpp,cpp}).
#include "partita/nn/reduce_scatter.hpp"

#include "detail/gather_layer.hpp"
#include "partita/errors.hpp"

namespace partita::nn {

namespace functional {

ReduceScatterPlan::ReduceScatterPlan(const mpi::Partition& P_x, int axis, int64_t dim,
                                     Shapes shapes)
    : steps_{detail::make(false, P_x, axis, dim, shapes)} {}
ReduceScatterPlan::ReduceScatterPlan(const mpi::Partition& P_x, const GatherAxes& axes,
                                     Shapes shapes) {
  if (!axes.scale_backward().empty())
    throw PartitionError("ReduceScatter(P_x " + P_x.describe() +
                         "): scale_backward is AllGather's parameter", rule_code::kScaleBackward);
  for (int d : detail::resolve("ReduceScatter", "axes_reduce_scatter", P_x, axes))
    steps_.push_back(detail::make(false, P_x, d, d, shapes));
}
at::Tensor reduce_scatter(const at::Tensor& x, const ReduceScatterPlan& plan) {
  return detail::run(plan.steps_, x);
}

}  // namespace functional

ReduceScatterImpl::ReduceScatterImpl(const mpi::Partition& P_x, int axis, int64_t dim,
                                     Shapes shapes)
    : plan_(P_x, axis, dim, shapes) {}
ReduceScatterImpl::ReduceScatterImpl(const mpi::Partition& P_x, const GatherAxes& axes,
                                     Shapes shapes)
    : plan_(P_x, axes, shapes) {}
torch::Tensor ReduceScatterImpl::forward(const torch::Tensor& x) {
  return functional::reduce_scatter(x, plan_);
}

}  // namespace partita::nn
