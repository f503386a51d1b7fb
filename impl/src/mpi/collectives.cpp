// The communicator's collectives: check the arguments on every rank, move
// the data (detail/team_comm.hpp's, the layers' movement), attach the
// adjoint (see communicator.hpp's table).
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>

#include "comm_internal.hpp"
#include "detail/plan_check.hpp"
#include "partita/errors.hpp"

namespace partita::mpi {

using namespace detail;

namespace {

// The call's name in messages, "Communicator::call(args)", built in one
// allocation (every call builds it: the waits and the adjoint carry it).
std::string call_name(const char* call, const std::string& args) {
  static constexpr char kPrefix[] = "Communicator::";
  std::string name;
  name.reserve(sizeof kPrefix + std::strlen(call) + args.size() + 1);
  name.append(kPrefix).append(call).append(1, '(').append(args).append(1, ')');
  return name;
}

// The name of a call whose arguments take few values (an operation, a
// root), made once per thread and key and then reused, so that the calls
// that move small messages (allreduce, bcast_, reduce_) build no string.
// Keys outside [0, 65536) (a bad root, say) get `spare` made afresh. A deque
// keeps its names where they are as it grows.
template <class Make>
const std::string& named(std::deque<std::string>& cache, int64_t key, std::string& spare,
                         const Make& make) {
  if (key < 0 || key >= (int64_t{1} << 16)) return spare = make();
  if (static_cast<size_t>(key) >= cache.size()) cache.resize(static_cast<size_t>(key) + 1);
  std::string& name = cache[static_cast<size_t>(key)];
  if (name.empty()) name = make();
  return name;
}

// Whether the call's output gets autograd history (LibTorch's rule: grad
// mode on and the input requires grad). Asked before the adjoint's closure
// is built, so that a call without history builds no closure, node or name.
bool records_history(const at::Tensor& t) {
  return at::GradMode::is_enabled() && t.defined() && t.requires_grad();
}

// Whether two records state the same shape (no vectors made: every call
// compares every rank's record with rank 0's).
bool same_shape(const Record& a, const Record& b) {
  return a.ndim == b.ndim && std::equal(a.dims, a.dims + a.ndim, b.dims);
}

// Rank i's dtype must be rank 0's (every check below starts with it).
void check_same_dtype(const Record& a, const Record& b, size_t i, const std::string& what) {
  if (b.dtype != a.dtype)
    throw ShapeError(what + ": rank " + std::to_string(i) + " passes dtype " +
                     dtype_string(static_cast<at::ScalarType>(b.dtype)) + ", rank 0 " +
                     dtype_string(static_cast<at::ScalarType>(a.dtype)));
}

// Raises on every rank unless every rank passed the same dtype and shape
// (and the same parameters p[0..1]); `what` names the call.
void check_same(const std::vector<Record>& all, const std::string& what, const char* params) {
  const Record& a = all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    const Record& b = all[i];
    check_same_dtype(a, b, i, what);
    if (!same_shape(a, b))
      throw ShapeError(what + ": rank " + std::to_string(i) + " passes a tensor of shape " +
                       shape_string(b.shape()) + ", rank 0 one of shape " +
                       shape_string(a.shape()) + " (every rank's must be the same)");
    if (b.p[0] != a.p[0] || b.p[1] != a.p[1])
      throw ShapeError(what + ": rank " + std::to_string(i) + " passes other " + params +
                       " than rank 0 (" + std::to_string(b.p[0]) + ", " + std::to_string(b.p[1]) +
                       " against " + std::to_string(a.p[0]) + ", " + std::to_string(a.p[1]) + ")");
  }
}

// Every rank's shape but along `free_axis` (-1: none) must agree with rank 0's.
void check_shapes_but(const std::vector<Record>& all, const std::string& what, int64_t free_axis,
                      int64_t free_axis2 = -1) {
  const Record& a = all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    const Record& b = all[i];
    check_same_dtype(a, b, i, what);
    bool same = b.ndim == a.ndim;
    for (int64_t d = 0; same && d < a.ndim; ++d)
      if (d != free_axis && d != free_axis2 && a.dims[d] != b.dims[d]) same = false;
    if (!same)
      throw ShapeError(what + ": rank " + std::to_string(i) + " passes a tensor of shape " +
                       shape_string(b.shape()) + ", rank 0 one of shape " +
                       shape_string(a.shape()) + " (they may differ only along axis " +
                       std::to_string(free_axis) +
                       (free_axis2 >= 0 && free_axis2 != free_axis
                            ? " and " + std::to_string(free_axis2)
                            : std::string()) +
                       ")");
    for (int k = 0; k < 4; ++k)
      if (b.p[k] != a.p[k] && k != 3)
        throw ShapeError(what + ": rank " + std::to_string(i) +
                         " passes other arguments (root or axes) than rank 0");
  }
}

std::string no_adjoint(const std::string& what, ReduceOp op) {
  return what + ": backward is not defined for operation " + op_name(op) +
         " (only SUM has an adjoint: MAX and MIN are not differentiable where ranks tie, "
         "PROD's adjoint needs the other ranks' factors)";
}

// bcast_ and reduce_ change their input in place: refused, on every rank
// (through the records), where that cannot be done right: an inference
// tensor outside c10::InferenceMode (LibTorch forbids the version bump),
// and a view that records history (its base's history would not see the
// change; LibTorch's own in-place ops on a view rebase the base's).
void check_in_place(Record& r, const at::Tensor& t) {
  if (r.status) return;
  if (t.is_inference() && !c10::InferenceMode::is_enabled()) {
    r.status = Record::kInPlaceRefused;
    r.p[2] = Record::kInPlaceInference;
  } else if (t.is_view() && records_history(t)) {
    r.status = Record::kInPlaceRefused;
    r.p[2] = Record::kInPlaceViewWithHistory;
  }
}

// The in-place calls' buffer: the input's own storage when it is contiguous
// (mpi4torch: the input is modified in place), without its history. An
// input that does not require grad is itself the buffer (and the result,
// as LibTorch's in-place ops return self): no new TensorImpl.
at::Tensor inplace_buffer(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  at::Tensor buf = t.requires_grad() ? alias_of(t.contiguous()) : t.contiguous();
  if (buf.data_ptr() == t.data_ptr() && t.numel() > 0) torch::autograd::impl::bump_version(t);
  return buf;
}

// mpi4torch's reduce_: in place, the root's buf holds the reduction, the
// others' zeros.
void raw_reduce(const CommState& s, at::Tensor& buf, ReduceOp op, int root,
                const std::string& what) {
  reduce_inplace(s.group(), buf, comm_op(op, buf.scalar_type()), root, what);
  if (s.rank != root) buf.zero_();
}

// bcast_'s adjoint, mpi4torch's reduce_(g, SUM, root): the sum at the root,
// zeros elsewhere. In place on the gradient when the autograd engine handed
// over the only reference to it, as a gradient made inside the graph is: a
// new output and a fresh zero tensor per call made this adjoint 1.21x
// MPI_Reduce at 256 KiB (docs/communicator.md). A gradient its caller still
// holds is only read (a copy to work in would cost more).
at::Tensor reduce_sum_to(const CommState& s, at::Tensor g, int root, const std::string& what) {
  if (owned(g)) {
    raw_reduce(s, g, ReduceOp::kSum, root, what);
    return g;
  }
  at::Tensor out = reduce_to(s.group(), g, mpi_sum(g.scalar_type()), root, what);
  return s.rank == root ? out : at::zeros(g.sizes(), g.options());
}

// reduce_'s adjoint: the root's x everywhere (the root only reads its
// tensor: it is returned as it is).
at::Tensor bcast_from(const CommState& s, const at::Tensor& x, int root, const std::string& what) {
  at::Tensor buf = s.rank == root ? x.contiguous() : at::empty(x.sizes(), x.options());
  bcast_inplace(s.group(), buf, root, what);
  return buf;
}

}  // namespace

at::Tensor Communicator::allreduce(const at::Tensor& t, ReduceOp op, const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "allreduce");
  thread_local std::deque<std::string> names;
  std::string spare;
  const std::string& what = named(names, static_cast<int64_t>(op), spare, [&] {
    return call_name("allreduce", std::string("op ") + op_name(op));
  });
  Record mine = make_record(t);
  mine.p[0] = static_cast<int64_t>(op);
  check_op(mine, op);
  if (checked_mode()) {
    const auto all = exchange_records(s, mine, what, "allreduce", shapes);
    check_same(all, what, "operations");
    keep_promise(s, "allreduce", shapes, all);
  } else if (mine.status) {
    raise_record(what, s.rank, mine);
  }
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = detail::allreduce(s.group(), t, comm_op(op, t.scalar_type()), what, &s.allreduce_out);
  }
  if (!records_history(t)) {
    s.allreduce_out.keep(out);
    return out;
  }
  if (!op_has_adjoint(op)) return attach_error(out, t, "AllreduceBackward", no_adjoint(what, op));
  auto state = s_;
  return attach(out, t, "AllreduceSumBackward", [state, what](const at::Tensor& g) {
    return detail::allreduce(state->group(), g, mpi_sum(g.scalar_type()), what + " adjoint");
  });
}

at::Tensor Communicator::bcast_(const at::Tensor& t, int root, const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "bcast_");
  thread_local std::deque<std::string> names;
  std::string spare;
  const std::string& what =
      named(names, root, spare, [&] { return call_name("bcast_", "root " + std::to_string(root)); });
  Record mine = make_record(t);
  mine.p[0] = root;
  check_root(mine, root, s.size);
  check_in_place(mine, t);
  if (checked_mode()) {
    const auto all = exchange_records(s, mine, what, "bcast_", shapes);
    check_same(all, what, "roots");
    keep_promise(s, "bcast_", shapes, all);
  } else if (mine.status) {
    raise_record(what, s.rank, mine);
  }
  if (s.size > 1) mpi_count(t.numel(), what);  // before the copy (issue 35 item 5)
  at::Tensor buf = inplace_buffer(t);
  bcast_inplace(s.group(), buf, root, what);
  if (!records_history(t)) {
    forbid_reuse(t, what);
    return buf;
  }
  auto state = s_;
  at::Tensor out = attach(buf, t, "BcastInPlaceBackward", [state, root, what](at::Tensor g) {
    return reduce_sum_to(*state, std::move(g), root, what + " adjoint");
  });
  forbid_reuse(t, what);
  return out;
}

at::Tensor Communicator::reduce_(const at::Tensor& t, ReduceOp op, int root,
                                 const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "reduce_");
  thread_local std::deque<std::string> names;
  std::string spare;
  const int64_t op_key = static_cast<int64_t>(op);
  const std::string& what =
      named(names, op_key >= 0 && op_key < 16 ? int64_t{root} * 16 + op_key : -1, spare, [&] {
        return call_name("reduce_",
                         std::string("op ") + op_name(op) + ", root " + std::to_string(root));
      });
  Record mine = make_record(t);
  mine.p[0] = root;
  mine.p[1] = static_cast<int64_t>(op);
  check_root(mine, root, s.size);
  check_op(mine, op);
  check_in_place(mine, t);
  if (checked_mode()) {
    const auto all = exchange_records(s, mine, what, "reduce_", shapes);
    check_same(all, what, "roots or operations");
    keep_promise(s, "reduce_", shapes, all);
  } else if (mine.status) {
    raise_record(what, s.rank, mine);
  }
  if (s.size > 1) mpi_count(t.numel(), what);  // before the copy (issue 35 item 5)
  at::Tensor buf = inplace_buffer(t);
  raw_reduce(s, buf, op, root, what);
  if (!records_history(t)) {
    forbid_reuse(t, what);
    return buf;
  }
  at::Tensor out;
  if (!op_has_adjoint(op)) {
    out = attach_error(buf, t, "ReduceInPlaceBackward", no_adjoint(what, op));
  } else {
    auto state = s_;
    out = attach(buf, t, "ReduceSumInPlaceBackward", [state, root, what](const at::Tensor& g) {
      return bcast_from(*state, g, root, what + " adjoint");
    });
  }
  forbid_reuse(t, what);
  return out;
}

at::Tensor Communicator::gather(const at::Tensor& t, int64_t axis, int root,
                                const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "gather");
  const std::string what =
      call_name("gather", "axis " + std::to_string(axis) + ", root " + std::to_string(root));
  Record mine = make_record(t);
  mine.p[0] = root;
  mine.p[1] = axis;
  check_axis(mine, axis, 2);
  check_root(mine, root, s.size);
  const auto all = exchange_records(s, mine, what, "gather", shapes);
  check_shapes_but(all, what, axis);
  keep_promise(s, "gather", shapes, all);
  std::vector<int64_t> extents;
  for (const auto& r : all) extents.push_back(r.dims[axis]);
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = gather_dim(s.group(), t, axis, extents, root, what);
  }
  if (!records_history(t)) return out;
  auto state = s_;
  const Shape root_shape = t.sizes().vec();
  return attach(out, t, "GatherBackward",
                [state, axis, extents, root, what](const at::Tensor& g) {
                  // The root's cotangent has the gathered shape; the others'
                  // (extent 0 along axis) are not read.
                  Shape shape = g.sizes().vec();
                  if (state->rank != root) shape[axis] = std::accumulate(
                      extents.begin(), extents.end(), int64_t{0});
                  return scatter_dim(state->group(), g, axis, extents, root, shape, g.options(),
                                     what + " adjoint");
                });
}

at::Tensor Communicator::allgather(const at::Tensor& t, int64_t axis,
                                   const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "allgather");
  const std::string what = call_name("allgather", "axis " + std::to_string(axis));
  Record mine = make_record(t);
  mine.p[1] = axis;
  check_axis(mine, axis, 2);
  const auto all = exchange_records(s, mine, what, "allgather", shapes);
  check_shapes_but(all, what, axis);
  keep_promise(s, "allgather", shapes, all);
  std::vector<int64_t> extents;
  for (const auto& r : all) extents.push_back(r.dims[axis]);
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = allgather_dim(s.group(), t, axis, extents, what, &s.allgather_out);
  }
  if (!records_history(t)) {
    s.allgather_out.keep(out);
    return out;
  }
  auto state = s_;
  return attach(out, t, "AllgatherBackward", [state, axis, extents, what](const at::Tensor& g) {
    return reduce_scatter_dim(state->group(), g, axis, extents, what + " adjoint");
  });
}

at::Tensor Communicator::scatter(const at::Tensor& t, int64_t axis, int64_t numelem, int root,
                                 const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "scatter");
  const std::string what = call_name("scatter", "axis " + std::to_string(axis) + ", numelem " +
                                                    std::to_string(numelem) + ", root " +
                                                    std::to_string(root));
  Record mine = make_record(t);
  mine.p[0] = root;
  mine.p[1] = axis;
  mine.p[3] = numelem;
  check_root(mine, root, s.size);
  if (!mine.status && numelem < 0) mine.status = Record::kBadNumelem;
  // Only the root's tensor is split: only its axis must exist.
  if (s.rank == root) check_axis(mine, axis, 1);
  const auto all = exchange_records(s, mine, what, "scatter", shapes);
  for (int i = 0; i < s.size; ++i)
    if (all[i].p[0] != root || all[i].p[1] != axis)
      throw ShapeError(what + ": rank " + std::to_string(i) +
                       " passes another root or axis than rank " + std::to_string(s.rank));
  std::vector<int64_t> numelems;
  for (const auto& r : all) numelems.push_back(r.p[3]);
  const Record& rr = all[root];
  const int64_t sum = std::accumulate(numelems.begin(), numelems.end(), int64_t{0});
  if (rr.dims[axis] != sum)
    throw ShapeError(what + ": the root's tensor has extent " + std::to_string(rr.dims[axis]) +
                     " along axis " + std::to_string(axis) +
                     ", but the ranks' numelem add up to " + std::to_string(sum) + " (" +
                     list_string(numelems) + ")");
  keep_promise(s, "scatter", shapes, all);
  const Shape root_shape = rr.shape();
  const auto options = t.options().dtype(static_cast<at::ScalarType>(rr.dtype));
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = scatter_dim(s.group(), t, axis, numelems, root, root_shape, options, what);
  }
  if (!records_history(t)) return out;
  auto state = s_;
  const std::vector<int64_t> in_sizes = t.sizes().vec();
  return attach(out, t, "ScatterBackward",
                [state, axis, numelems, root, in_sizes, what](const at::Tensor& g) {
                  at::Tensor full = gather_dim(state->group(), g, axis, numelems, root, what + " adjoint");
                  // Off the root the input was not read: its gradient is zero.
                  return state->rank == root ? full : at::zeros(in_sizes, g.options());
                });
}

namespace {

// What every rank of an alltoall (or alltoall_out, `out` given) agrees on
// after the records are exchanged and checked.
// (With a StaticShapes promise, the first call's is kept in the site and
// later calls reuse it: static_derived. Without one, the last call's is
// kept in the communicator, and the next call reuses it when the records
// every rank exchanged are the ones it was agreed from: everything below is
// a function of them and of this rank's number.)
struct AlltoallAgreed {
  std::string what;
  std::vector<int64_t> gextents, numelems;
  AlltoallCounts counts;  // this rank's (alltoall_checked_counts)
  std::vector<Record> all;  // the records it was agreed from
};

bool same_records(const Record* a, const Record* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(Record)) == 0;
}

// The rest of agree_alltoall: checks every rank's record and derives the
// counts, into `agreed` (its name set).
std::shared_ptr<const AlltoallAgreed> agree_alltoall_records(
    const CommState& s, const at::Tensor& t, int64_t gather_axis, int64_t scatter_axis,
    std::shared_ptr<AlltoallAgreed> agreed, std::vector<Record> all, const StaticShapes& shapes) {
  AlltoallAgreed& a = *agreed;
  const std::string& what = a.what;
  check_shapes_but(all, what, gather_axis, scatter_axis);
  int64_t sum_n = 0, sum_g = 0;
  for (const auto& r : all) {
    a.gextents.push_back(r.dims[gather_axis]);
    a.numelems.push_back(r.p[3]);
    sum_n += r.p[3];
    sum_g += r.dims[gather_axis];
  }
  if (gather_axis == scatter_axis) {
    if (sum_g != sum_n)
      throw ShapeError(what + ": the ranks' extents along axis " + std::to_string(gather_axis) +
                       " add up to " + std::to_string(sum_g) + " (" + list_string(a.gextents) +
                       "), their numelem to " + std::to_string(sum_n) + " (" +
                       list_string(a.numelems) + ")");
  } else {
    for (int i = 0; i < s.size; ++i)
      if (all[i].dims[scatter_axis] != sum_n)
        throw ShapeError(what + ": rank " + std::to_string(i) + "'s tensor has extent " +
                         std::to_string(all[i].dims[scatter_axis]) + " along scatter axis " +
                         std::to_string(scatter_axis) + ", but the ranks' numelem add up to " +
                         std::to_string(sum_n) + " (" + list_string(a.numelems) + ")");
  }
  // Every rank's out against the output every rank computes alike for it,
  // so that a wrong one raises on all of them before anything moves.
  for (int i = 0; i < s.size; ++i) {
    if (!all[i].out) continue;
    Shape expected = all[i].shape();
    expected[scatter_axis] = all[i].p[3];
    if (gather_axis != scatter_axis) expected[gather_axis] = sum_g;
    if (all[i].out_shape() != expected)
      throw ShapeError(what + ": rank " + std::to_string(i) + "'s out tensor has shape " +
                       shape_string(all[i].out_shape()) + ", its output's shape is " +
                       shape_string(expected),
                       rule_code::kOutTensor);
  }
  a.counts = alltoall_checked_counts(s.rank, t.sizes(), gather_axis, scatter_axis, a.gextents,
                                     a.numelems, what);
  keep_promise(s, "alltoall", shapes, all);
  if (shapes.site()) {
    keep_derived(shapes, agreed);
  } else {
    a.all = std::move(all);
    s.last_alltoall.set(agreed);
  }
  return agreed;
}

std::shared_ptr<const AlltoallAgreed> agree_alltoall(const CommState& s, const at::Tensor& t,
                                                     int64_t gather_axis, int64_t scatter_axis,
                                                     int64_t numelem, const at::Tensor* out,
                                                     const StaticShapes& shapes) {
  auto name = [&] {
    return call_name(out ? "alltoall_out" : "alltoall",
                     "gather_axis " + std::to_string(gather_axis) + ", scatter_axis " +
                         std::to_string(scatter_axis) + ", numelem " + std::to_string(numelem));
  };
  Record mine = make_record(t);
  mine.p[0] = gather_axis;
  mine.p[1] = scatter_axis;
  mine.p[3] = numelem;
  check_axis(mine, gather_axis, 2);
  check_axis(mine, scatter_axis, 1);
  if (!mine.status && numelem < 0) mine.status = Record::kBadNumelem;
  if (out) check_out(mine, *out, t);
  // (alltoall and alltoall_out are one call for a StaticShapes site: a rank
  // that switches between them breaks the promise, its record's out fields
  // having changed.)
  if (auto kept = static_derived(s, mine, name, "alltoall", shapes))
    return std::static_pointer_cast<const AlltoallAgreed>(kept);
  // The last call's agreement, if this rank's record is the one it was
  // agreed from (its name then is this call's too).
  std::shared_ptr<const AlltoallAgreed> last;
  if (!shapes.site()) {
    last = std::static_pointer_cast<const AlltoallAgreed>(s.last_alltoall.get());
    if (last && !same_records(&last->all.at(s.rank), &mine, 1)) last.reset();
  }
  std::string fresh;
  if (!last) fresh = name();
  const std::string& what = last ? last->what : fresh;
  auto all = exchange_records(s, mine, what, "alltoall", shapes);
  if (last && same_records(all.data(), last->all.data(), all.size())) return last;
  auto agreed = std::make_shared<AlltoallAgreed>();
  agreed->what = what;
  return agree_alltoall_records(s, t, gather_axis, scatter_axis, std::move(agreed), std::move(all),
                                shapes);
}

}  // namespace

at::Tensor Communicator::alltoall(const at::Tensor& t, int64_t gather_axis, int64_t scatter_axis,
                                  int64_t numelem, const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "alltoall");
  const auto agreed = agree_alltoall(s, t, gather_axis, scatter_axis, numelem, nullptr, shapes);
  const AlltoallAgreed& a = *agreed;
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = alltoall_dim(s.group(), t, gather_axis, scatter_axis, a.gextents, a.numelems, a.what,
                       nullptr, &a.counts, agreed, &s.alltoall_out);
  }
  if (!records_history(t)) {
    s.alltoall_out.keep(out);
    return out;
  }
  auto state = s_;
  return attach(out, t, "AlltoallBackward",
                [state, gather_axis, scatter_axis, agreed](const at::Tensor& g) {
                  // The reverse exchange: pieces of gextents along gather_axis
                  // go back, gathered along scatter_axis.
                  return alltoall_dim(state->group(), g, scatter_axis, gather_axis,
                                      agreed->numelems, agreed->gextents,
                                      agreed->what + " adjoint");
                });
}

at::Tensor& Communicator::alltoall_out(at::Tensor& out, const at::Tensor& t, int64_t gather_axis,
                                       int64_t scatter_axis, int64_t numelem,
                                       const StaticShapes& shapes) const {
  const CommState& s = state_of(s_, "alltoall_out");
  const auto agreed = agree_alltoall(s, t, gather_axis, scatter_axis, numelem, &out, shapes);
  const AlltoallAgreed& a = *agreed;
  at::NoGradGuard no_grad;
  alltoall_dim(s.group(), t, gather_axis, scatter_axis, a.gextents, a.numelems, a.what, &out,
               &a.counts, agreed);
  // As an in-place write: tensors saved for backward from out see the change.
  out.unsafeGetTensorImpl()->bump_version();
  return out;
}

}  // namespace partita::mpi
