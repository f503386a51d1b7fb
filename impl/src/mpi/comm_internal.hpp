// Internal to the differentiable communicator: its state, the per-call
// exchange of every rank's shape (the "records"), and its autograd nodes.
// Its data movement is the layers' (detail/team_comm.hpp), used by the
// forward calls and by their adjoints alike.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/FunctionRef.h>
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "detail/team_comm.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/shape.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::mpi::detail {

// What a call derived from every rank's records, kept for the next call of
// the same kind (any thread may read or replace it).
class LastAgreement {
 public:
  std::shared_ptr<const void> get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_;
  }
  void set(std::shared_ptr<const void> agreed) const {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_ = std::move(agreed);
  }

 private:
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const void> kept_;
};

struct Pending;

// The receive of one adjoint message (a header holding the index of the
// forward message it belongs to, then the gradient), posted by a send's
// wait's backward into a buffer of that send's shape and dtype.
struct AdjointSlot {
  std::shared_ptr<int64_t> header;
  MPI_Request header_request = MPI_REQUEST_NULL;
  at::Tensor buffer;
  MPI_Request request = MPI_REQUEST_NULL;
  ~AdjointSlot();
};

// The order of one (peer, tag)'s point-to-point messages on one MPI
// communicator, which pairs each adjoint message with its forward one
// (point_to_point.cpp; docs/communicator.md, "Adjoint messages"). The k-th
// isend to a peer with a tag is that peer's k-th irecv from this rank with
// it (MPI does not let them overtake each other); a receive's adjoint sends
// k as a header before the gradient, and the sending rank, which posts its
// adjoint receives in the order its own backward reaches them, hands each
// gradient to the send the header names.
struct AdjointRoute {
  uint64_t sent = 0, received = 0;  // forward messages so far, each way
  // This rank's sends whose wait recorded history, by index, until a
  // header names them.
  std::map<uint64_t, std::weak_ptr<Pending>> sends;
  size_t swept_at = 0;  // sends.size() after the last sweep of expired ones
  // Adjoint receives posted whose header has not been read, oldest first.
  std::deque<std::shared_ptr<AdjointSlot>> unread;
};

// Every (peer, tag)'s route of one MPI communicator, kept as an attribute
// of it: every Communicator made on that MPI communicator (world() makes a
// new one each call) shares them, and a freed communicator takes its own.
struct PointToPointOrder {
  std::mutex mutex;
  std::unordered_map<uint64_t, AdjointRoute> routes;  // key: peer << 32 | tag
  AdjointRoute& route(int peer, int tag) {
    return routes[static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32 | static_cast<uint32_t>(tag)];
  }
};
// The order kept on `comm` (made at its first use).
std::shared_ptr<PointToPointOrder> point_to_point_order(MPI_Comm comm);

struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = -1;
  int size = 0;
  int max_tag = 0;          // user tags are below it; adjoint tags = tag + max_tag
  Partition keep;           // keeps a partition's communicator alive
  std::shared_ptr<MPI_Comm> owned;  // a dup()'s communicator, freed with the state
  // The last output without history of the calls that return a new tensor,
  // handed out again when the caller dropped it (docs/output-reuse.md).
  OutputSlot allreduce_out, allgather_out, alltoall_out;
  // The same for isend/irecv: the last received tensor, and the last
  // dummy of a send's and of a receive's handle without history (a dummy
  // handed out again is written zero first).
  OutputSlot irecv_out, send_dummy, recv_dummy;
  // The agreement of the last alltoall without a StaticShapes promise
  // (collectives.cpp), reused by the next while every rank's record is the
  // one it was agreed from.
  LastAgreement last_alltoall;
  // isend/irecv's message order on `comm` (shared with every state of it).
  std::shared_ptr<PointToPointOrder> order;
  Group group() const { return {comm, rank, size}; }
};

// The state of an isend or irecv: the forward request and buffer, and, once
// the wait's backward has started it, the adjoint request and buffer.
struct Pending {
  enum Kind { kSend, kRecv } kind = kSend;
  std::shared_ptr<const CommState> comm;
  int peer = 0, tag = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  at::Tensor buffer;          // what is sent / received into
  at::DimVector sizes;        // the input's shape and options (for gradients)
  at::TensorOptions options;
  bool waited = false;
  bool adjoint_started = false;
  bool adjoint_waited = false;
  MPI_Request adjoint_request = MPI_REQUEST_NULL;
  at::Tensor adjoint_buffer;
  // This message's place among the forward messages of its (peer, tag)
  // each way (AdjointRoute); a receive's adjoint sends it as a header.
  uint64_t index = 0;
  MPI_Request adjoint_header_request = MPI_REQUEST_NULL;
  std::shared_ptr<int64_t> adjoint_header;
  // A send's: the adjoint receive whose header named it.
  std::shared_ptr<AdjointSlot> slot;
  // "isend to 1 (tag 0)", written once at start without allocating (the
  // waits name the operation by it).
  char name[64] = {0};
  // A receive whose tensor is above MPI's count limit: the error its wait
  // raises (after its receive of nothing finished); empty otherwise.
  std::string overflow;
  std::string what() const { return name; }
  void set_name(Kind kind, int peer, int tag);
  // A request still posted when the last handle and node let go (a handle
  // dropped before its wait, a wait or an adjoint's wait given up, an
  // adjoint send whose wait never ran): MPI may still read or write its
  // buffer, which is kept for the rest of the process (keep_forever); the
  // request leaks, as an unwaited MPI_Request does.
  ~Pending();
};

// One rank's statement about a call: its tensor's dtype and shape, a local
// error found before any communication (status), and the call's parameters
// (root, axes, numelem, op), so that every rank can check every other's.
struct Record {
  enum Status : int64_t {
    kOk = 0, kTooManyDims, kBadDtype, kBadAxis, kBadRoot, kBadNumelem, kBadOp, kBadOut,
    kNotDense,       // a sparse (or otherwise not strided CPU) tensor
    kInPlaceRefused  // bcast_/reduce_ on a tensor they cannot change in place (p[2]: why)
  };
  enum InPlaceProblem : int64_t { kInPlaceInference = 1, kInPlaceViewWithHistory };
  // Why an out= call's `out` was refused (kBadOut, in p[2]).
  enum OutProblem : int64_t {
    kOutUndefined = 1, kOutGrad, kOutDtype, kOutNotContiguous, kOutOverlaps, kOutTooManyDims
  };
  int64_t status = kOk;
  int64_t dtype = 0;
  int64_t static_shapes = 0;  // 1: the call passed a StaticShapes promise
  int64_t ndim = 0;
  int64_t dims[kMaxTensorDims] = {0};
  int64_t p[4] = {0, 0, 0, 0};  // per call: see each call
  // An out= call (Communicator::alltoall_out): 1, and out's shape, which
  // every rank checks against the output every rank computes alike.
  int64_t out = 0;
  int64_t out_ndim = 0;
  int64_t out_dims[kMaxTensorDims] = {0};

  Shape shape() const { return Shape(dims, dims + ndim); }
  Shape out_shape() const { return Shape(out_dims, out_dims + out_ndim); }
};

const CommState& state_of(const std::shared_ptr<CommState>& s, const char* what);

// `t`'s storage and version counter without its history (the result of an
// in-place call, an isend's wait, join_dummies' loopthrough): an in-place
// change through it is seen by every saved use of `t`, as through a view
// (variable_data() alone would give it a counter of its own).
at::Tensor alias_of(const at::Tensor& t);

// The record of `t` with status set by the local checks of dtype and rank.
Record make_record(const at::Tensor& t);
// Sets status unless already set: axis in [0, ndim) ...
void check_axis(Record& r, int64_t axis, int which);
void check_root(Record& r, int root, int size);
void check_op(Record& r, ReduceOp op);
// An out= call: records out's shape and sets status (unless already set) if
// out is undefined, requires grad or t does under grad mode (out= calls
// record no history, as LibTorch's), has another dtype than t, is not
// contiguous, or overlaps t.
void check_out(Record& r, const at::Tensor& out, const at::Tensor& t);

// Throws ShapeError for a record whose status is not kOk (local use, or
// on every rank after the exchange).
[[noreturn]] void raise_record(const std::string& what, int rank, const Record& r);

// Allgather of every rank's record; if any has a bad status, every rank
// raises ShapeError naming the lowest such rank and its problem.
std::vector<Record> exchange_records(const CommState& s, const Record& mine,
                                     const std::string& what);

// A call site's first records (StaticShapes, docs/static-shapes.md).
struct StaticSite {
  std::mutex mutex;
  std::vector<Record> first;  // every rank's, from the site's first call; empty before it
  MPI_Comm comm = MPI_COMM_NULL;
  const char* call = nullptr;  // which call (a site serves one call)
  // What the call worked out from the first records once they passed its
  // checks (alltoall: the counts), reused by later calls (static_derived).
  std::shared_ptr<const void> derived;
};
// exchange_records under the site's promise: until a call has kept the
// promise (keep_promise), a call exchanges (and raises on every rank unless
// every rank passed a promise, or none did); later calls compare this
// rank's record with the kept one and return the kept records without
// communication (or, with PARTITA_CHECK_STATIC_SHAPES=1, exchange and
// compare every rank's on every rank). A site used for another call or
// communicator raises Error.
std::vector<Record> exchange_records(const CommState& s, Record mine, const std::string& what,
                                     const char* call, const StaticShapes& shapes);
// After a call's checks passed on every rank: its records become the
// promise, unless one is kept already (no-op without a promise). A first
// call that raised in its checks is thus no promise: the next call is a
// first call again (docs/static-shapes.md).
void keep_promise(const CommState& s, const char* call, const StaticShapes& shapes,
                  const std::vector<Record>& all);
// The fast path of a later call under a promise (no debug setting): this
// rank's record is compared with its first one (raising as above; `what`
// makes the call's name only then) and the site's `derived` is returned.
// Null when the call must take the long way: no promise, no derived kept
// yet (the first call), the debug setting on, or a site of another call or
// communicator (exchange_records then raises).
std::shared_ptr<const void> static_derived(const CommState& s, Record mine,
                                           c10::function_ref<std::string()> what,
                                           const char* call, const StaticShapes& shapes);
// Keeps `derived` in the promise's site (no-op without one), after a long way.
void keep_derived(const StaticShapes& shapes, std::shared_ptr<const void> derived);

// The MPI op (the datatype is detail::mpi_datatype, bool included).
MPI_Op comm_op(ReduceOp op, at::ScalarType t);

// -- autograd -----------------------------------------------------------------
// Gives `out` (no history) a node whose backward is adjoint(grad_out) into
// `input`'s edge, when `input` requires grad (and grad mode is on): the
// layers' node (with_adjoint). An undefined incoming gradient is zeros: the
// adjoint communication still runs.
at::Tensor attach(at::Tensor out, const at::Tensor& input, const std::string& name,
                  Adjoint adjoint);
// A node that raises `message` in backward.
at::Tensor attach_error(at::Tensor out, const at::Tensor& input, const std::string& name,
                        const std::string& message);
// mpi4torch's safeguard for in-place calls: a non-leaf input that requires
// grad gets a node that raises if anything backpropagates into it.
void forbid_reuse(const at::Tensor& input, const std::string& what);

std::string shape_str(at::IntArrayRef s);

}  // namespace partita::mpi::detail
