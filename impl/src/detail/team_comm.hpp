// Internal: the data movement every broadcast-like and reduce-like primitive
// is made of, and the per-call metadata exchange that lets every rank of a
// layer check the inputs and agree on the outcome.
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::mpi::detail {

// What one rank's input looks like, gathered from every rank of a layer.
struct Header {
  // kInPlaceLeaf: an in-place call (halo_exchange_) on a leaf that requires
  // grad, which autograd forbids.
  enum Status : int64_t { kOk = 0, kTooManyDims = 1, kBadDtype = 2, kInPlaceLeaf = 3 };
  int64_t status = kOk;
  int64_t dtype = 0;
  int64_t requires_grad = 0;
  int64_t ndim = 0;
  int64_t dims[kMaxTensorDims] = {0};

  Shape shape() const { return Shape(dims, dims + ndim); }
  int64_t numel() const { return volume(shape()); }
  at::ScalarType scalar_type() const { return static_cast<at::ScalarType>(dtype); }
};

Header make_header(const at::Tensor& x);

// Allgather of every member's header over `P` (the union of a layer's
// partitions), in P's rank order. Inactive ranks get nothing.
std::vector<Header> exchange_headers(const Partition& P, const Header& mine, const char* what);

MPI_Datatype mpi_datatype(at::ScalarType t);

// MPI_Iallgatherv / MPI_Ialltoallv, posted as MPI_Iallgather / MPI_Ialltoall
// when the blocks are equal and follow each other. MPICH 4.0.2 runs the "v"
// forms of equal blocks 1.5x (alltoall) to 4x (allgather, 256 KiB) slower
// than the regular ones at 2 ranks (docs/benchmarks.md). Every rank must
// choose alike: the gather's counts are the same list on every rank; for
// the all-to-all the caller says whether every rank's blocks are equal
// (`uniform`, from what every rank knows), and the counts must then be
// regular here.
void iallgather_blocks(const void* send, int count, MPI_Datatype type, void* recv,
                       const std::vector<int>& counts, const std::vector<int>& displs,
                       MPI_Comm comm, MPI_Request* req);
void ialltoall_blocks(bool uniform, const void* send, const std::vector<int>& scounts,
                      const std::vector<int>& sdispls, void* recv, const std::vector<int>& rcounts,
                      const std::vector<int>& rdispls, MPI_Datatype type, MPI_Comm comm,
                      MPI_Request* req);
MPI_Op mpi_sum(at::ScalarType t);
int mpi_count(int64_t numel, const std::string& what);

// Data flows from the root (rank 0) of each team to its members.
// `root_team`: the team this rank is the root of (or null); `member_team`:
// the team it receives in (or null; may equal root_team, then the rank copies
// its own data). Returns what this rank receives (undefined if no member_team).
at::Tensor bcast_teams(const Partition& root_team, const Partition& member_team,
                       const at::Tensor& src, const Shape& out_shape,
                       const at::TensorOptions& out_options, const std::string& what);

// Data flows from the members of each team to its root, summed. `contrib` is
// this rank's contribution in `member_team`; returns the sum at the root of
// `root_team` (including `contrib` when member_team == root_team), undefined
// elsewhere.
at::Tensor reduce_teams(const Partition& root_team, const Partition& member_team,
                        const at::Tensor& contrib, const Shape& out_shape,
                        const at::TensorOptions& out_options, const std::string& what);

// Sum over `team`, result on every member.
at::Tensor allreduce_team(const Partition& team, const at::Tensor& x, const std::string& what);

// Gives `out` (a fresh tensor without history) an autograd node whose
// backward is `adjoint(grad_out)`. `attach` must be the same on every rank
// of the layer (an input anywhere requires grad) so that backward runs on
// all of them: the node is attached even where this rank's input does not
// require grad, and its result is then dropped.
// The adjoint receives the gradient by value: when the autograd engine holds
// no other reference to it, the adjoint may reuse its storage
// (owned_contiguous).
using Adjoint = std::function<at::Tensor(at::Tensor grad_out)>;
at::Tensor with_adjoint(at::Tensor out, const at::Tensor& x, bool attach,
                        const std::string& name, Adjoint adjoint);

// The in-place form (DistDL's mark_dirty): `x`'s data has just been
// changed in place; bumps its version and, when `attach`, rebases its
// history onto a node whose backward is `adjoint(grad_x)` and whose input
// is x's previous history. Returns x. (A leaf that requires grad must have
// been refused before its data changed.)
at::Tensor with_adjoint_in_place(const at::Tensor& x, bool attach, const std::string& name,
                                 Adjoint adjoint);

// `g` itself when nothing else references its storage and it is a
// contiguous tensor that owns all of it (so changing it in place is
// invisible to anyone), otherwise a contiguous copy.
at::Tensor owned_contiguous(at::Tensor g);

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

// Concatenation along tensor dimension `dim` of every team member's `x`, in
// team rank order; `lengths[i]` is member i's extent along `dim` (the other
// extents agree). Every member gets the result.
at::Tensor allgather_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                         const std::vector<int64_t>& lengths, const std::string& what);

// The sum over the team of `x` (one shape everywhere), split along `dim`:
// member i gets the slice of extent `lengths[i]` after those of members < i.
at::Tensor reduce_scatter_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                              const std::vector<int64_t>& lengths, const std::string& what);

}  // namespace partita::mpi::detail
