// Internal: the data movement every broadcast-like and reduce-like primitive
// is made of, and the per-call metadata exchange that lets every rank of a
// layer check the inputs and agree on the outcome.
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <climits>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::mpi::detail {

// What one rank's input looks like, gathered from every rank of a layer.
struct Header {
  // kInPlaceLeaf: an in-place call (halo_exchange_) on a leaf that requires
  // grad, which autograd forbids.
  // kInPlaceInference: an inference tensor outside c10::InferenceMode;
  // kInPlaceView: a view autograd cannot rebase (one of several outputs, as
  // chunk makes, or one made under grad mode off).
  enum Status : int64_t {
    kOk = 0, kTooManyDims = 1, kBadDtype = 2, kInPlaceLeaf = 3, kInPlaceInference = 4, kInPlaceView = 5
  };
  int64_t status = kOk;
  int64_t dtype = 0;
  // kWantsGrad: the input requires grad and grad mode is on; kGradModeOff:
  // grad mode is off on this rank (torch::NoGradGuard, c10::InferenceMode),
  // which can then attach no adjoint, whatever its input.
  enum Grad : int64_t { kGradModeOff = -1, kNoGrad = 0, kWantsGrad = 1 };
  int64_t requires_grad = kNoGrad;
  // 1 on the ranks of a layer made with Shapes::kStatic (docs/static-shapes.md):
  // every rank must say the same.
  int64_t static_shapes = 0;
  int64_t ndim = 0;
  int64_t dims[kMaxTensorDims] = {0};

  Shape shape() const { return Shape(dims, dims + ndim); }
  int64_t numel() const { return volume(shape()); }
  at::ScalarType scalar_type() const { return static_cast<at::ScalarType>(dtype); }
};

Header make_header(const at::Tensor& x);
// A header's requires_grad for a rank that `wants` a gradient (its input or
// parameters require grad): kGradModeOff whenever grad mode is off.
int64_t grad_statement(bool wants);

// Allgather of every member's header over `P` (the union of a layer's
// partitions) into `all`, in P's rank order. Inactive ranks get nothing.
// Through shared memory when every member runs on one node
// (header_board.hpp), else MPI.
void exchange_headers(const Partition& P, const Header& mine, const char* what,
                      std::vector<Header>& all);

// Grad mode off for a forward's data movement, only where it could record
// anything: autograd records an operation when one of its inputs requires
// grad, and the only such tensor the data movement reads is the input `x`
// (its outputs, new or reused, never require grad). Otherwise no guard,
// whose two thread-local writes cost about 220 instructions per call.
class NoGradIfNeeded {
 public:
  explicit NoGradIfNeeded(const at::Tensor& x) {
    if (x.requires_grad()) guard_.emplace();
  }

 private:
  std::optional<at::NoGradGuard> guard_;
};

// bool (the communicator's logical reductions) is MPI_C_BOOL; the layers
// refuse bool before any movement (input.dtype_unsupported).
MPI_Datatype mpi_datatype(at::ScalarType t);

// MPI_Allgatherv / MPI_Alltoallv, run as MPI_Allgather / MPI_Alltoall when
// the blocks are equal and follow each other, each finished under the
// waiting policy (mpi::call: blocking or posted and waited for). MPICH
// 4.0.2 runs the "v" forms of equal blocks 1.5x (alltoall) to 4x
// (allgather, 256 KiB) slower than the regular ones at 2 ranks
// (docs/benchmarks.md). Every rank must choose alike: the gather's counts
// are the same list on every rank; for the all-to-all the caller says
// whether every rank's blocks are equal (`uniform`, from what every rank
// knows), and the counts must then be regular here. `abandon` keeps the
// buffers of an operation whose wait gave it up (mpi::call).
void allgather_blocks(const void* send, int count, MPI_Datatype type, void* recv,
                      const std::vector<int>& counts, const std::vector<int>& displs,
                      MPI_Comm comm, const char* what, const Abandon& abandon);
void alltoall_blocks(bool uniform, const void* send, const std::vector<int>& scounts,
                     const std::vector<int>& sdispls, void* recv, const std::vector<int>& rcounts,
                     const std::vector<int>& rdispls, MPI_Datatype type, MPI_Comm comm,
                     const char* what, const Abandon& abandon);
MPI_Op mpi_sum(at::ScalarType t);
// `numel` as MPI's int count; raises input.count_overflow above INT_MAX.
// Inline, and `what` (a std::string or a C string) is read only to raise:
// a call within the limit builds no name.
[[noreturn]] void raise_count_overflow(int64_t numel, const std::string& what);
template <class Name>
int mpi_count(int64_t numel, const Name& what) {
  if (numel > INT_MAX) raise_count_overflow(numel, what);
  return static_cast<int>(numel);
}

// A layer's last output, handed out again by its next call when nothing
// but this slot can reach it (issue 34 item 1; docs/output-reuse.md). At
// 4 KiB, allocating a fresh output and freeing the caller's dropped one was
// about 2,650 of a broadcast's 9,000 instructions. A kept tensor is reused
// only when this slot holds the only reference to it and to its storage
// (no view, no weak reference, no saved copy), it has no autograd metadata
// (nobody called requires_grad_ on it, set a grad or a hook), it still has
// the storage and memory it had when kept and fits the current limit, and
// it has the shape, dtype, dispatch keys and inference mode a fresh output
// would have; its old values are all overwritten. Otherwise it is released
// and a fresh tensor is allocated, as before.
class OutputSlot {
 public:
  // A contiguous CPU tensor of `sizes` and `options` (requires_grad false):
  // the kept one where it may be reused, else fresh. The slot is left empty.
  at::Tensor take(at::IntArrayRef sizes, const at::TensorOptions& options) const;
  // Keeps `y` for the next take: only a CPU output of at most
  // mpi::output_reuse_limit() bytes (buffer_cache.hpp) that has no autograd
  // metadata (a layer keeps the outputs it returns without an autograd node).
  void keep(const at::Tensor& y) const;

 private:
  mutable std::mutex mutex_;
  mutable at::Tensor spare_;
  // spare_'s dispatch keys, storage and memory when kept
  mutable c10::DispatchKeySet keys_;
  mutable const c10::StorageImpl* storage_ = nullptr;
  mutable const void* data_ = nullptr;
};
// A contiguous copy of x without history. A dense CPU tensor that is
// already contiguous is copied by one memcpy into storage allocated without
// the dispatcher (clone's dispatch and TensorIterator were about a quarter of
// the halo's 4 KiB forward, docs/benchmarks.md), or taken from `reuse`;
// anything else is cloned.
at::Tensor contiguous_copy(const at::Tensor& x, const OutputSlot* reuse = nullptr);

// Data flows from the root (rank 0) of each team to its members.
// `root_team`: the team this rank is the root of (or null); `member_team`:
// the team it receives in (or null; may equal root_team, then the rank copies
// its own data). Returns what this rank receives (undefined if no member_team).
// `reuse`: the layer's output slot (OutputSlot::take allocates the output);
// the same in the calls below.
at::Tensor bcast_teams(const Partition& root_team, const Partition& member_team,
                       const at::Tensor& src, const Shape& out_shape,
                       const at::TensorOptions& out_options, const std::string& what,
                       const OutputSlot* reuse = nullptr);

// Data flows from the members of each team to its root, summed. `contrib` is
// this rank's contribution in `member_team`; returns the sum at the root of
// `root_team` (including `contrib` when member_team == root_team), undefined
// elsewhere.
at::Tensor reduce_teams(const Partition& root_team, const Partition& member_team,
                        const at::Tensor& contrib, const Shape& out_shape,
                        const at::TensorOptions& out_options, const std::string& what,
                        const OutputSlot* reuse = nullptr);

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
// Whether owned_contiguous would return `g` itself.
bool owned(const at::Tensor& g);

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

// ---- The data movement of the layers and of the communicator (one
// implementation, issue 12 item 7) --------------------------------------------
// Each call runs one collective over `g` under the waiting policy
// (mpi::call: its blocking form, or the non-blocking one finished by
// mpi::wait); each returns new storage (never the input's). A tensor
// is seen as [outer, length, inner] along the moved dimension `dim`: a
// member's piece is a contiguous [outer, len, inner] block, moved as it is;
// only when outer > 1 does one copy put the rows in place (no transposes).

// The members of one communicator, as the caller knows them.
struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};
inline Group group_of(const Partition& P) { return {P.comm(), P.rank(), P.size()}; }

// op over the group of x (one shape everywhere), on every member.
at::Tensor allreduce(const Group& g, const at::Tensor& x, MPI_Op op, const std::string& what,
                     const OutputSlot* reuse = nullptr);
// In place on `buf` (contiguous), the root's values everywhere.
void bcast_inplace(const Group& g, at::Tensor& buf, int root, const std::string& what);
// In place on `buf` (contiguous): op over the group at the root; the other
// members' buf is left as it was.
void reduce_inplace(const Group& g, at::Tensor& buf, MPI_Op op, int root, const std::string& what);
// op over the group of x at the root (new storage); undefined elsewhere.
at::Tensor reduce_to(const Group& g, const at::Tensor& x, MPI_Op op, int root,
                     const std::string& what);
// Concatenation along `dim` of every member's x, in group order
// (`lengths[i]`: member i's extent along dim, the other extents agree): at
// the root (gather_dim; the others get extent 0 along dim) or everywhere.
at::Tensor gather_dim(const Group& g, const at::Tensor& x, int64_t dim,
                      const std::vector<int64_t>& lengths, int root, const std::string& what);
at::Tensor allgather_dim(const Group& g, const at::Tensor& x, int64_t dim,
                         const std::vector<int64_t>& lengths, const std::string& what,
                         const OutputSlot* reuse = nullptr);
// The sum over the group of x (one shape everywhere), split along `dim`:
// member i gets the slice of extent `lengths[i]` after those of members < i.
at::Tensor reduce_scatter_dim(const Group& g, const at::Tensor& x, int64_t dim,
                              const std::vector<int64_t>& lengths, const std::string& what,
                              const OutputSlot* reuse = nullptr);
// The root's x (shape root_shape; other members' x is not read) split along
// `dim` into `lengths`: member i's slice.
at::Tensor scatter_dim(const Group& g, const at::Tensor& x, int64_t dim,
                       const std::vector<int64_t>& lengths, int root, const Shape& root_shape,
                       const at::TensorOptions& options, const std::string& what);
// Member j's piece (`numelem[j]` along scatter_dim) of every member's x goes
// to member j, concatenated along gather_dim (`gextents[i]`: member i's
// extent along it; the other extents agree). gather_dim == scatter_dim: the
// concatenation of every member's x along it, re-split into `numelem`.
struct AlltoallCounts;  // below
// With `into`: the caller's output (contiguous, of the output's shape and
// x's dtype, not overlapping x; the caller checked), written and returned
// instead of new storage. With `known`: this member's counts, from
// alltoall_checked_counts (below) on the same arguments, held by
// `known_owner`, which an abandoned exchange keeps (MPI may still read the
// counts). With `reuse` (and no `into`): the output comes from that slot.
at::Tensor alltoall_dim(const Group& g, const at::Tensor& x, int64_t gather_dim,
                        int64_t scatter_dim, const std::vector<int64_t>& gextents,
                        const std::vector<int64_t>& numelem, const std::string& what,
                        const at::Tensor* into = nullptr, const AlltoallCounts* known = nullptr,
                        std::shared_ptr<const void> known_owner = nullptr,
                        const OutputSlot* reuse = nullptr);

// ---- Counts (issue 35 item 5) ----------------------------------------------
// MPI counts and displacements are ints. Each call above first computes
// every count and displacement it will hand MPI, from what every member of
// the group knows alike (the agreed shapes and lengths; alltoall_dim: every
// member's counts, not only its own), and raises a ShapeError (rule
// input.count_overflow) from mpi_count before it copies, allocates or
// posts anything: either every member raises or none does. These are pure
// functions: spec_bad_inputs tests them without MPI and without data.

// The elements of a tensor of `sizes` per index along `dim`.
int64_t row_volume(at::IntArrayRef sizes, int64_t dim);
// MPI counts and displacements of consecutive blocks of `lens[i] * row`
// elements (raises as above if one is not an int); returns the elements in
// all.
int64_t block_counts(const std::vector<int64_t>& lens, int64_t row, const std::string& what,
                     std::vector<int>& counts, std::vector<int>& displs);
// alltoall_dim's counts and displacements for member `member`, whose
// tensor has `sizes` (raises as above if one is not an int).
struct AlltoallCounts {
  std::vector<int64_t> send_at, send_rows, recv_rows;  // rows along scatter_dim
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  int64_t rtotal = 0;  // elements received in all (not an MPI count)
};
AlltoallCounts alltoall_counts(int member, at::IntArrayRef sizes, int64_t gather_dim,
                               int64_t scatter_dim, const std::vector<int64_t>& gextents,
                               const std::vector<int64_t>& numelem, const std::string& what);
// This member's (`me`'s, whose tensor has `sizes`) counts, after checking
// that every member's fit: alltoall_dim's first step. The check is
// O(members) when every member's input and output volumes fit an int (then
// so does every count), else every member's counts are worked out (and
// raise as above). `known` in alltoall_dim: this, computed before (a
// StaticShapes promise keeps it from the first call).
AlltoallCounts alltoall_checked_counts(int me, at::IntArrayRef sizes, int64_t gather_dim,
                                       int64_t scatter_dim, const std::vector<int64_t>& gextents,
                                       const std::vector<int64_t>& numelem,
                                       const std::string& what);

// The layers' names for them, on a team.
inline at::Tensor allreduce_team(const Partition& team, const at::Tensor& x,
                                 const std::string& what, const OutputSlot* reuse = nullptr) {
  return allreduce(group_of(team), x, mpi_sum(x.scalar_type()), what, reuse);
}
inline at::Tensor allgather_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                                const std::vector<int64_t>& lengths, const std::string& what,
                                const OutputSlot* reuse = nullptr) {
  return allgather_dim(group_of(team), x, dim, lengths, what, reuse);
}
inline at::Tensor reduce_scatter_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                                     const std::vector<int64_t>& lengths,
                                     const std::string& what, const OutputSlot* reuse = nullptr) {
  return reduce_scatter_dim(group_of(team), x, dim, lengths, what, reuse);
}

}  // namespace partita::mpi::detail
