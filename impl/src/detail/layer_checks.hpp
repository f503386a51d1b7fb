// Internal: checks every rank of a layer makes on the gathered headers.
// They are pure functions of data every rank has, so either every rank of
// the layer throws the same ShapeError or none does.
#pragma once

#include <string>
#include <vector>

#include "detail/team_comm.hpp"

namespace partita::mpi::detail {

// Workers outside P_x hold zero-volume tensors; P_x's inputs have a supported
// dtype, the same on every P_x worker, and at most kMaxTensorDims dimensions.
void check_inputs(const std::string& layer, const Partition& P_union, const Partition& P_x,
                  const std::vector<Header>& headers);

// The workers of each group (world ranks) hold tensors of one shape.
void check_same_shapes(const std::string& layer, const Partition& P_union,
                       const std::vector<Ranks>& groups, const std::vector<Header>& headers,
                       const char* group_kind);

// Issue 35 item 5, for layers whose teams move each member's tensor whole
// as one MPI count (Broadcast, SumReduce, AllSumReduce): unless every
// worker's tensor has at most INT_MAX elements, every rank of the layer
// raises the same ShapeError (rule input.count_overflow), naming the
// worker, before anything is posted, even where its own team's count fits
// (its team would finish while another's members raised, and the layer's
// ranks would go separate ways).
void check_volumes_fit(const std::string& layer, const Partition& P_union,
                       const std::vector<Header>& headers);

// The same for AllGather and ReduceScatter: for every team (world ranks)
// its blocks along `dim` (each member's extent, or the balanced split of
// the team's extent when `split`) and their displacements fit an int.
void check_blocks_fit(const std::string& layer, const Partition& P_x,
                      const std::vector<Ranks>& teams, const std::vector<Header>& headers,
                      int64_t dim, bool split);

// Whether a call attaches its adjoint on every member: some member's input
// requires grad (the same answer on every rank). Raises ShapeError
// (input.grad_mode) on every rank when one member wants a gradient and
// another runs with grad mode off: that one would record no backward, and
// the others' backward would wait for it. `members` (world ranks) limits
// the question to one team; empty: every worker of P_union.
bool agree_attach(const std::string& layer, const Partition& P_union,
                  const std::vector<Header>& headers, const Ranks& members = {});
// For a plan that attaches its adjoint (static shapes): ShapeError
// (input.grad_mode) on every rank unless every member's grad mode is on or
// every one's is off.
void check_grad_modes_alike(const std::string& layer, const Partition& P_union,
                            const std::vector<Header>& headers);

// Every team of workers of P_x that differ only along `axes` (world ranks,
// in P_x rank order): what each rank must know to check the others' inputs.
// Empty on ranks outside P_x.
std::vector<Ranks> teams_along(const Partition& P_x, const std::vector<int>& axes);

// The header of world rank `worker` (which must be in P_union).
const Header& header_of(const Partition& P_union, const std::vector<Header>& headers, int worker);

}  // namespace partita::mpi::detail
