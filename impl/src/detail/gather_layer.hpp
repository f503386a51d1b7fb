// Internal: what AllGather and ReduceScatter share. Both move data within
// the teams along one partition dimension, one concatenating, the other
// summing and splitting (nn/all_gather.cpp and nn/reduce_scatter.cpp hold
// the public plans and modules).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "detail/plan_cache.hpp"
#include "detail/plan_check.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/options.hpp"

namespace partita::nn::detail {

// What AllGather and ReduceScatter share: the teams along `axis` and the
// checks. Each one's forward is the other's adjoint.
struct GatherLayer {
  bool gather = true;  // AllGather; else ReduceScatter
  std::string name, adjoint_name;  // both made once, not per call
  mpi::Partition P_x, team;
  int axis = 0;
  int64_t dim = 0;
  std::vector<Ranks> groups;  // every team, world ranks in order along `axis`
  // The last output returned without an autograd node, for the next call
  // (detail/team_comm.hpp, docs/output-reuse.md).
  mpi::detail::OutputSlot out_slot;

  // Checked mode: a gather sends its piece to every member and receives
  // theirs; a reduce-scatter sends each member its piece of the split.
  std::vector<mpi::detail::PeerClaim> claims(const at::Tensor& x,
                                             const std::vector<int64_t>& lengths) const;

  // A call's plan (plans made once, detail/plan_cache.hpp): the extents
  // along `dim`, after the checks.
  struct Compiled {
    std::vector<int64_t> lengths;
    bool attach = false;
  };
  mpi::detail::PlanCache<Compiled> plans;

  std::shared_ptr<const Compiled> prepare(const at::Tensor& x) const;

  at::Tensor forward(const at::Tensor& x) const;
};

// One step along partition dimension `axis`, gathering or scattering tensor
// dimension `dim`.
std::shared_ptr<GatherLayer> make(bool gather, const mpi::Partition& P_x, int axis, int64_t dim,
                                  Shapes shapes);

// DistDL's axes: the partition dimensions acted on, ascending, checked.
std::vector<int> resolve(const char* layer, const char* axes_name, const mpi::Partition& P_x,
                         const GatherAxes& a);

// The steps one after the other (a clone when there are none).
at::Tensor run(const std::vector<std::shared_ptr<const GatherLayer>>& layers, const at::Tensor& x);

}  // namespace partita::nn::detail
