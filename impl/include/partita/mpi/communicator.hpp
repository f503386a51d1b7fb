// partita::mpi::Communicator — MPI calls as nodes of LibTorch's autograd
// graph (seed 003; the names and semantics follow mpi4torch, in C++ style).
//
// Each call returns a tensor whose backward is the adjoint communication,
// run by the calling rank's own backward pass:
//
//   call                                   adjoint (backward)
//   allreduce(t, SUM)                      allreduce(g, SUM)
//   bcast_(t, root)                        reduce_(g, SUM, root)
//   reduce_(t, SUM, root)                  bcast_(g, root)
//   gather(t, axis, root)                  scatter(g, axis, t.size(axis), root)
//   allgather(t, axis)                     reduce-scatter of g along axis
//   scatter(t, axis, numelem, root)        gather(g, axis, root) (zeros off the root)
//   alltoall(t, gaxis, saxis, numelem)     alltoall(g, saxis, gaxis, t.size(gaxis))
//   wait(isend(t, dest, tag))              the gradient is received from dest
//   wait(irecv(t, source, tag))            the gradient is sent to source
//
// Each rank's graph knows nothing of the others (seed 003): the program must
// connect every communication to its loss, with join_dummies and
// join_dummies_handle where the data does not (docs/communicator.md).
// Backward through MAX, MIN, PROD or a logical/bitwise reduction raises
// partita::Error naming the operation. Calls with `_` work in place (the
// result shares the input's storage when it is contiguous); a non-leaf input
// that requires grad may not be used again after them (its backward raises,
// as in mpi4torch).
//
// Collectives are collective over the communicator: every rank calls them in
// the same order with the same arguments. Argument errors (a root out of
// range, an axis out of range, shapes or dtypes that do not fit together)
// raise partita::ShapeError on every rank: gather, allgather, scatter and
// alltoall exchange every rank's shape first anyway; allreduce, bcast_ and
// reduce_ do so in checked mode (PARTITA_CHECKED, on by default;
// docs/mpi-runtime.md). Every wait goes through mpi::wait (test + yield,
// deadline mode).
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/reduce_op.hpp"

namespace partita::mpi {

namespace detail {
struct CommState;
struct Pending;
struct StaticSite;
}  // namespace detail

// Static shapes (docs/static-shapes.md): a call site's promise that every
// call made with it passes, on every rank, a tensor of the dtype and shape
// and the same arguments (root, axes, numelem, op) as its first call. The
// first call exchanges and checks every rank's shape as without it; later
// calls skip that exchange. Each rank still compares its own call with its
// own first one (no communication): a broken promise raises ShapeError
// (rule input.static_shapes) on the ranks whose call changed, and the
// others are left waiting in the data's collective (deadline mode or the
// launcher's timeout ends it). With PARTITA_CHECK_STATIC_SHAPES=1 every
// call exchanges again and a broken promise raises on every rank.
//
//   auto site = mpi::StaticShapes::promise();   // once, before the loop
//   for (...) y = comm.alltoall(x, 0, 1, n, site);
//
// One object per call site: a site serves one kind of call on one
// communicator. Every rank must pass a promise to the same calls (the
// first call raises on every rank otherwise). A default-made StaticShapes
// promises nothing (every call agrees: the default).
class StaticShapes {
 public:
  StaticShapes() = default;
  static StaticShapes promise();
  bool promised() const { return static_cast<bool>(s_); }
  // Internal.
  detail::StaticSite* site() const { return s_.get(); }

 private:
  std::shared_ptr<detail::StaticSite> s_;
};

// What isend and irecv return: the pending request, and a dummy tensor that
// carries the call's place in the autograd graph (mpi4torch's
// WaitHandle.dummy). A handle is waited on once (a second wait raises).
class WaitHandle {
 public:
  WaitHandle() = default;
  // A scalar tensor to pass to join_dummies: it makes the receiver of the
  // join depend on this call in the backward graph.
  const at::Tensor& dummy() const { return dummy_; }
  bool valid() const { return static_cast<bool>(pending_); }

  // Internal (made by Communicator and join_dummies_handle).
  WaitHandle(std::shared_ptr<detail::Pending> p, at::Tensor dummy)
      : pending_(std::move(p)), dummy_(std::move(dummy)) {}
  const std::shared_ptr<detail::Pending>& pending() const { return pending_; }

 private:
  std::shared_ptr<detail::Pending> pending_;
  at::Tensor dummy_;
};

class Communicator {
 public:
  Communicator() = default;
  // partita's duplicate of MPI_COMM_WORLD (local: no communication).
  static Communicator world();
  // The communicator of a partition (a non-member gets an invalid
  // communicator: every call on it raises). Local.
  static Communicator from(const Partition& P);
  // Wraps a communicator the caller owns and keeps alive (e.g. smp's mp
  // group, partita/smp/communicators.hpp). Local.
  static Communicator wrap(MPI_Comm comm);
  // A fresh duplicate (MPI_Comm_idup, collective): its messages never match
  // those of this communicator.
  Communicator dup() const;

  bool valid() const;
  int rank() const;
  int size() const;
  MPI_Comm comm() const;

  // -- collectives -----------------------------------------------------------
  // (Each takes an optional StaticShapes promise, above.)
  at::Tensor allreduce(const at::Tensor& t, ReduceOp op, const StaticShapes& shapes = {}) const;
  // In place: the root's t is sent; every rank's result holds it.
  at::Tensor bcast_(const at::Tensor& t, int root, const StaticShapes& shapes = {}) const;
  // In place: the root's result holds the reduction; elsewhere zeros.
  at::Tensor reduce_(const at::Tensor& t, ReduceOp op, int root,
                     const StaticShapes& shapes = {}) const;
  // The root gets every rank's t concatenated along `axis` (extents along it
  // may differ per rank); elsewhere a tensor of extent 0 along `axis`.
  at::Tensor gather(const at::Tensor& t, int64_t axis, int root,
                    const StaticShapes& shapes = {}) const;
  at::Tensor allgather(const at::Tensor& t, int64_t axis, const StaticShapes& shapes = {}) const;
  // The root's t is split along `axis` into pieces of each rank's `numelem`
  // (they must add up to its extent); other ranks' t only gives the graph
  // edge (mpi4torch passes any tensor there).
  at::Tensor scatter(const at::Tensor& t, int64_t axis, int64_t numelem, int root,
                     const StaticShapes& shapes = {}) const;
  // Every rank splits t along `scatter_axis` into pieces of each rank's
  // `numelem` and sends piece j to rank j, which concatenates what it gets
  // along `gather_axis`. With equal axes: the concatenation of every rank's
  // t along that axis, re-split into pieces of `numelem`.
  at::Tensor alltoall(const at::Tensor& t, int64_t gather_axis, int64_t scatter_axis,
                      int64_t numelem, const StaticShapes& shapes = {}) const;
  // The same exchange into `out`, a tensor the caller keeps (LibTorch's
  // out= convention; not in mpi4torch): contiguous, of t's dtype and of the
  // shape alltoall would return, not overlapping t. As LibTorch's out=
  // functions it records no autograd history: under grad mode neither t nor
  // out may require grad. Every rank checks every rank's out before any data
  // moves (a bad one raises ShapeError on all of them). Returns out.
  // docs/communicator.md ("alltoall_out").
  at::Tensor& alltoall_out(at::Tensor& out, const at::Tensor& t, int64_t gather_axis,
                           int64_t scatter_axis, int64_t numelem,
                           const StaticShapes& shapes = {}) const;

  // -- point to point --------------------------------------------------------
  // 0 <= tag < max_tag(); the adjoint messages use tags above max_tag().
  WaitHandle isend(const at::Tensor& t, int dest, int tag) const;
  // `t` gives shape, dtype and the graph edge; the message is received into
  // new storage (t is not written).
  WaitHandle irecv(const at::Tensor& t, int source, int tag) const;
  // isend: returns the sent values (a dummy for the graph: its gradient is
  // replaced by the one received from dest in backward). irecv: returns
  // what was received.
  at::Tensor wait(const WaitHandle& handle) const;
  at::Tensor send(const at::Tensor& t, int dest, int tag) const;
  at::Tensor recv(const at::Tensor& t, int source, int tag) const;
  int max_tag() const;

 private:
  std::shared_ptr<detail::CommState> s_;
};

// Forward: `loopthrough` (sharing its storage). Backward: the gradient goes
// to loopthrough, and zeros to every dummy (as mpi4torch: a leaf dummy's
// .grad reads zeros after backward), so that the dummies' branches of the
// graph run in backward. Without a dummy that requires grad, returns
// loopthrough itself.
at::Tensor join_dummies(const at::Tensor& loopthrough, const std::vector<at::Tensor>& dummies);
// The same for a wait handle: the handle's dummy is joined.
WaitHandle join_dummies_handle(const WaitHandle& handle, const std::vector<at::Tensor>& dummies);

}  // namespace partita::mpi
