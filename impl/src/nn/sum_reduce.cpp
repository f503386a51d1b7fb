// partita::nn::SumReduce and functional::sum_reduce: a plan over the
// reduction teams, run by the team code it shares with Broadcast (the two
// are each other's adjoint: detail/team_layer.{hpp,cpp}).
#include "partita/nn/sum_reduce.hpp"

#include "detail/team_layer.hpp"

namespace partita::nn {

namespace functional {

SumReducePlan::SumReducePlan(const mpi::Partition& P_x, const mpi::Partition& P_y,
                             Options options)
    : layer_(std::make_shared<detail::TeamLayer>(detail::TeamLayer::Kind::SumReduce, P_x, P_y,
                                                 options)) {}
const mpi::Partition& SumReducePlan::P_send() const { return layer_->P_send; }
const mpi::Partition& SumReducePlan::P_recv() const { return layer_->P_recv; }
at::Tensor sum_reduce(const at::Tensor& x, const SumReducePlan& plan) {
  return plan.layer_->forward(x);
}

}  // namespace functional

SumReduceImpl::SumReduceImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                             Options options)
    : plan_(P_x, P_y, options) {}
torch::Tensor SumReduceImpl::forward(const torch::Tensor& x) {
  return functional::sum_reduce(x, plan_);
}

}  // namespace partita::nn
