// Internal: what Broadcast and SumReduce share. Both move data within the
// same kind of teams, one from roots to members, the other from members to
// roots, and each one's adjoint is the other's forward.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "detail/plan_cache.hpp"
#include "detail/plan_check.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/options.hpp"

namespace partita::nn::detail {

struct TeamLayer {
  enum class Kind { Broadcast, SumReduce };
  TeamLayer(Kind kind, const mpi::Partition& P_x, const mpi::Partition& P_y, Options options);

  Kind kind;
  std::string name;  // "Broadcast(P_x ... -> P_y ...)" for messages
  std::string adjoint_name;  // name + " adjoint", made once
  mpi::Partition P_x, P_y, P_union;
  mpi::Partition P_send, P_recv;  // where this rank's input goes, where its output comes from
  std::vector<mpi::Team> teams;
  std::vector<Ranks> contributors;  // per team, the paired workers (checked per call)
  int y_source = -1;  // a worker whose input has the shape of this rank's output
  Options options;
  // The last output returned without an autograd node, for the next call
  // (detail/team_comm.hpp, docs/output-reuse.md).
  mpi::detail::OutputSlot out_slot;

  at::Tensor forward(const at::Tensor& x) const;

 private:
  // A call's plan (plans made once, detail/plan_cache.hpp): the output's
  // shape and dtype, after the checks.
  struct Compiled {
    Shape out_shape;
    at::ScalarType out_dtype = at::kFloat;
    bool attach = false;
  };
  mpi::detail::PlanCache<Compiled> plans;
  std::shared_ptr<const Compiled> prepare(const at::Tensor& x) const;

  std::vector<mpi::detail::PeerClaim> claims(const at::Tensor& x, const Shape& out_shape,
                                             at::ScalarType out_dtype) const;
};

}  // namespace partita::nn::detail
