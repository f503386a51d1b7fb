// partita::nn::AllGather and functional::all_gather: the steps along the
// gathered dimensions, run by the team code AllGather shares with
// ReduceScatter, its adjoint (detail/gather_layer.{hpp,cpp}).
#include "partita/nn/all_gather.hpp"

#include "detail/gather_layer.hpp"

namespace partita::nn {

namespace functional {

AllGatherPlan::AllGatherPlan(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes)
    : steps_{detail::make(true, P_x, axis, dim, shapes)} {}
AllGatherPlan::AllGatherPlan(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes) {
  for (int d : detail::resolve("AllGather", "axes_all_gather", P_x, axes))
    steps_.push_back(detail::make(true, P_x, d, d, shapes));
  for (int d : axes.scale_backward()) scale_backward_ *= static_cast<double>(P_x.shape()[d]);
}
at::Tensor all_gather(const at::Tensor& x, const AllGatherPlan& plan) {
  const auto y = detail::run(plan.steps_, x);
  if (plan.scale_backward_ == 1 || !y.requires_grad()) return y;
  // Backward divides the gradient arriving at y (a new tensor: the caller's
  // gradient is not modified) before the adjoint reduce-scatter sees it.
  const double factor = plan.scale_backward_;
  // (On a rank whose output does not reach the loss the gradient is
  // undefined: it passes on as it is, and the adjoint still runs.)
  y.register_hook([factor](const at::Tensor& g) { return g.defined() ? g / factor : g; });
  return y;
}

}  // namespace functional

AllGatherImpl::AllGatherImpl(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes)
    : plan_(P_x, axis, dim, shapes) {}
AllGatherImpl::AllGatherImpl(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes)
    : plan_(P_x, axes, shapes) {}
torch::Tensor AllGatherImpl::forward(const torch::Tensor& x) {
  return functional::all_gather(x, plan_);
}

}  // namespace partita::nn
