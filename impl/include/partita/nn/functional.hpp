// partita::nn::functional — every primitive as a function (DistDL's
// backends.mpi.functional). The torch::nn modules in this
// folder are thin wrappers: each holds one plan and its forward calls the
// function below with it, so a module and the function on the same plan
// run the same code.
//
// A plan is what a primitive needs before it can move data: the teams and
// their communicators, built once. Every plan takes a `Shapes` choice
// (partita/options.hpp; Options::shapes for broadcast and sum-reduce):
// Shapes::kStatic promises that later calls repeat the first call's
// shapes, dtypes and requires_grad, and skips their per-call agreement
// (docs/static-shapes.md). Constructing one is collective exactly
// as constructing the module is (the module's header says over whom);
// calling the function is collective over the ranks the module's call is.
// Plans are cheap handles (copies share the communicators) and stay valid
// while any copy, module or autograd node holds them.
//
//   auto plan = functional::BroadcastPlan(P_x, P_y);     // every rank
//   at::Tensor y = functional::broadcast(x, plan);       // every rank, any number of calls
//   at::Tensor z = functional::BroadcastFunction::apply(x, plan);  // DistDL's name
//
// Forward and adjoint of each function: the module's header
// (broadcast.hpp, sum_reduce.hpp, all_sum_reduce.hpp, all_gather.hpp,
// repartition.hpp, halo_exchange.hpp) and docs/primitives.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/options.hpp"

namespace partita::nn {

namespace detail {
struct TeamLayer;
struct AllSumReduceLayer;
struct GatherLayer;
struct RepartitionLayer;
struct HaloLayer;
}  // namespace detail

enum class RepartitionExchange { kPointToPoint, kAlltoallw };

namespace functional {

// Broadcast from P_x to P_y (collective over the world).
class BroadcastPlan {
 public:
  BroadcastPlan(const mpi::Partition& P_x, const mpi::Partition& P_y, Options options = {});
  const mpi::Partition& P_send() const;
  const mpi::Partition& P_recv() const;
 private:
  friend at::Tensor broadcast(const at::Tensor& x, const BroadcastPlan& plan);
  std::shared_ptr<const detail::TeamLayer> layer_;
};
at::Tensor broadcast(const at::Tensor& x, const BroadcastPlan& plan);

// Sum-reduce from P_x to P_y (collective over the world).
class SumReducePlan {
 public:
  SumReducePlan(const mpi::Partition& P_x, const mpi::Partition& P_y, Options options = {});
  const mpi::Partition& P_send() const;
  const mpi::Partition& P_recv() const;
 private:
  friend at::Tensor sum_reduce(const at::Tensor& x, const SumReducePlan& plan);
  std::shared_ptr<const detail::TeamLayer> layer_;
};
at::Tensor sum_reduce(const at::Tensor& x, const SumReducePlan& plan);

// All-sum-reduce over partition dimensions `axes` of P_x (collective over
// P_x's active members).
class AllSumReducePlan {
 public:
  AllSumReducePlan(const mpi::Partition& P_x, std::vector<int> axes, Shapes shapes = Shapes::kPerCall);
  const mpi::Partition& team() const;
 private:
  friend at::Tensor all_sum_reduce(const at::Tensor& x, const AllSumReducePlan& plan);
  std::shared_ptr<const detail::AllSumReduceLayer> layer_;
};
at::Tensor all_sum_reduce(const at::Tensor& x, const AllSumReducePlan& plan);

// All-gather (collective over P_x's active members): partita's form (one
// partition dimension `axis`, tensor dimension `dim`) or DistDL's
// (axes_all_gather or axes_keep, scale_backward).
class AllGatherPlan {
 public:
  AllGatherPlan(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes = Shapes::kPerCall);
  AllGatherPlan(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes = Shapes::kPerCall);
  double scale_backward() const { return scale_backward_; }
 private:
  friend at::Tensor all_gather(const at::Tensor& x, const AllGatherPlan& plan);
  std::vector<std::shared_ptr<const detail::GatherLayer>> steps_;
  double scale_backward_ = 1;
};
at::Tensor all_gather(const at::Tensor& x, const AllGatherPlan& plan);

// Reduce-scatter (collective over P_x's active members), either form;
// scale_backward must be empty.
class ReduceScatterPlan {
 public:
  ReduceScatterPlan(const mpi::Partition& P_x, int axis, int64_t dim, Shapes shapes = Shapes::kPerCall);
  ReduceScatterPlan(const mpi::Partition& P_x, const GatherAxes& axes, Shapes shapes = Shapes::kPerCall);
 private:
  friend at::Tensor reduce_scatter(const at::Tensor& x, const ReduceScatterPlan& plan);
  std::vector<std::shared_ptr<const detail::GatherLayer>> steps_;
};
at::Tensor reduce_scatter(const at::Tensor& x, const ReduceScatterPlan& plan);

// Repartition (the seeds' transpose) from P_x to P_y (collective over the
// world). The global shape is learnt on every call, so one plan serves
// calls of any shapes.
class RepartitionPlan {
 public:
  RepartitionPlan(const mpi::Partition& P_x, const mpi::Partition& P_y,
                  RepartitionExchange how = RepartitionExchange::kPointToPoint,
                  Shapes shapes = Shapes::kPerCall);
 private:
  friend at::Tensor repartition(const at::Tensor& x, const RepartitionPlan& plan);
  std::shared_ptr<const detail::RepartitionLayer> layer_;
};
at::Tensor repartition(const at::Tensor& x, const RepartitionPlan& plan);
using TransposePlan = RepartitionPlan;
inline at::Tensor transpose(const at::Tensor& x, const TransposePlan& plan) {
  return repartition(x, plan);
}

// Halo exchange on P_x with ghost widths per tensor dimension (collective
// over P_x's active members; the widths must agree).
class HaloExchangePlan {
 public:
  HaloExchangePlan(const mpi::Partition& P_x, Shape left, Shape right, Shapes shapes = Shapes::kPerCall);
 private:
  friend at::Tensor halo_exchange(const at::Tensor& x, const HaloExchangePlan& plan);
  friend at::Tensor halo_exchange_(const at::Tensor& x, const HaloExchangePlan& plan);
  std::shared_ptr<const detail::HaloLayer> layer_;
};
at::Tensor halo_exchange(const at::Tensor& x, const HaloExchangePlan& plan);
// In place, as DistDL's HaloExchange (its mark_dirty): fills the ghosts of
// `x` itself and returns `x`, its history rebased onto the exchange so that
// backward runs the adjoint. No copy of the window is made (this
// is the form that runs at the speed of a hand-written exchange). `x` must
// not be a leaf that requires grad (a ShapeError on every rank of P_x, rule
// input.in_place_leaf); the adjoint reuses the incoming gradient's storage
// when nothing else references it. Workers outside P_x get `x` back.
at::Tensor halo_exchange_(const at::Tensor& x, const HaloExchangePlan& plan);

// DistDL's names for the same functions (seed 000 names the first four).
struct BroadcastFunction {
  static at::Tensor apply(const at::Tensor& x, const BroadcastPlan& p) { return broadcast(x, p); }
};
struct SumReduceFunction {
  static at::Tensor apply(const at::Tensor& x, const SumReducePlan& p) { return sum_reduce(x, p); }
};
struct AllSumReduceFunction {
  static at::Tensor apply(const at::Tensor& x, const AllSumReducePlan& p) {
    return all_sum_reduce(x, p);
  }
};
struct DistributedTransposeFunction {
  static at::Tensor apply(const at::Tensor& x, const RepartitionPlan& p) {
    return repartition(x, p);
  }
};
using RepartitionFunction = DistributedTransposeFunction;
struct AllGatherFunction {
  static at::Tensor apply(const at::Tensor& x, const AllGatherPlan& p) { return all_gather(x, p); }
};
struct ReduceScatterFunction {
  static at::Tensor apply(const at::Tensor& x, const ReduceScatterPlan& p) {
    return reduce_scatter(x, p);
  }
};
struct HaloExchangeFunction {
  static at::Tensor apply(const at::Tensor& x, const HaloExchangePlan& p) {
    return halo_exchange(x, p);
  }
};
struct HaloExchangeInPlaceFunction {
  static at::Tensor apply(const at::Tensor& x, const HaloExchangePlan& p) {
    return halo_exchange_(x, p);
  }
};

}  // namespace functional
}  // namespace partita::nn
