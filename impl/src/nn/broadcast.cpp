// partita::nn::Broadcast and functional::broadcast: a plan over the
// broadcast teams, run by the team code it shares with SumReduce (the two
// are each other's adjoint: detail/team_layer.{hpp,cpp}).
#include "partita/nn/broadcast.hpp"

#include "detail/team_layer.hpp"

namespace partita::nn {

namespace functional {

BroadcastPlan::BroadcastPlan(const mpi::Partition& P_x, const mpi::Partition& P_y,
                             Options options)
    : layer_(std::make_shared<detail::TeamLayer>(detail::TeamLayer::Kind::Broadcast, P_x, P_y,
                                                 options)) {}
const mpi::Partition& BroadcastPlan::P_send() const { return layer_->P_send; }
const mpi::Partition& BroadcastPlan::P_recv() const { return layer_->P_recv; }
at::Tensor broadcast(const at::Tensor& x, const BroadcastPlan& plan) {
  return plan.layer_->forward(x);
}

}  // namespace functional

BroadcastImpl::BroadcastImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                             Options options)
    : plan_(P_x, P_y, options) {}
torch::Tensor BroadcastImpl::forward(const torch::Tensor& x) {
  return functional::broadcast(x, plan_);
}

}  // namespace partita::nn
