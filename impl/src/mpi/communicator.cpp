// The communicator itself (world, from a partition, dup), the per-call
// records every rank checks, and the autograd nodes every call uses.
#include "partita/mpi/communicator.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <charconv>
#include <climits>
#include <cstring>
#include <mutex>
#include <sstream>

#include "comm_internal.hpp"
#include "detail/header_board.hpp"
#include "detail/static_shapes.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi {

using detail::CommState;

namespace detail {

AdjointSlot::~AdjointSlot() {
  // A receive still posted (never waited on, or given up at a deadline):
  // MPI may still write into its memory.
  if (header_request != MPI_REQUEST_NULL || request != MPI_REQUEST_NULL)
    keep_forever(std::move(header), std::move(buffer));
}

namespace {
int g_order_keyval = MPI_KEYVAL_INVALID;
std::once_flag g_order_once;
int delete_order(MPI_Comm, int, void* value, void*) {
  delete static_cast<std::shared_ptr<PointToPointOrder>*>(value);
  return MPI_SUCCESS;
}
}  // namespace

at::Tensor alias_of(const at::Tensor& t) {
  at::Tensor a = t.variable_data();
  torch::autograd::impl::set_version_counter(a, torch::autograd::impl::version_counter(t));
  return a;
}

std::shared_ptr<PointToPointOrder> point_to_point_order(MPI_Comm comm) {
  std::call_once(g_order_once, [] {
    PARTITA_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_order, &g_order_keyval, nullptr));
  });
  void* value = nullptr;
  int flag = 0;
  PARTITA_MPI_CHECK(MPI_Comm_get_attr(comm, g_order_keyval, &value, &flag));
  if (flag) return *static_cast<std::shared_ptr<PointToPointOrder>*>(value);
  auto* kept = new std::shared_ptr<PointToPointOrder>(std::make_shared<PointToPointOrder>());
  PARTITA_MPI_CHECK(MPI_Comm_set_attr(comm, g_order_keyval, kept));
  return *kept;
}

}  // namespace detail

namespace {
std::shared_ptr<CommState> make_comm_state(MPI_Comm comm) {
  auto s = std::make_shared<CommState>();
  s->comm = comm;
  MPI_Comm_rank(comm, &s->rank);
  MPI_Comm_size(comm, &s->size);
  // Half of MPI's tag range is the user's, the other half carries the
  // adjoint messages of isend/irecv (tag + max_tag), so a backward message
  // never matches a forward one.
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag);
  s->max_tag = (flag && ub ? *ub : 32767) / 2;
  s->order = detail::point_to_point_order(comm);
  return s;
}
}  // namespace

Communicator Communicator::world() {
  Communicator c;
  c.s_ = make_comm_state(world_comm());
  return c;
}

Communicator Communicator::from(const Partition& P) {
  Communicator c;
  if (P.active()) {
    c.s_ = make_comm_state(P.comm());
    c.s_->keep = P;
  }
  return c;
}

Communicator Communicator::wrap(MPI_Comm comm) {
  Communicator c;
  if (comm != MPI_COMM_NULL) c.s_ = make_comm_state(comm);
  return c;
}

Communicator Communicator::dup() const {
  const CommState& s = detail::state_of(s_, "dup");
  auto owned = std::shared_ptr<MPI_Comm>(new MPI_Comm(MPI_COMM_NULL), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (*c != MPI_COMM_NULL && !finalized) MPI_Comm_free(c);
    delete c;
  });
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Comm_idup(s.comm, owned.get(), &req));
  mpi::wait(req, "Communicator::dup");
  MPI_Comm_set_errhandler(*owned, MPI_ERRORS_RETURN);
  Communicator c;
  c.s_ = make_comm_state(*owned);
  c.s_->owned = owned;
  return c;
}

StaticShapes StaticShapes::promise() {
  StaticShapes s;
  s.s_ = std::make_shared<detail::StaticSite>();
  return s;
}

bool Communicator::valid() const { return static_cast<bool>(s_); }
int Communicator::rank() const { return detail::state_of(s_, "rank").rank; }
int Communicator::size() const { return detail::state_of(s_, "size").size; }
MPI_Comm Communicator::comm() const { return s_ ? s_->comm : MPI_COMM_NULL; }
int Communicator::max_tag() const { return detail::state_of(s_, "max_tag").max_tag; }

}  // namespace partita::mpi

namespace partita::mpi::detail {

const CommState& state_of(const std::shared_ptr<CommState>& s, const char* what) {
  if (!s)
    throw Error(std::string("Communicator::") + what +
                ": this communicator is invalid (default-made, or made from a partition this "
                "rank is not a member of)");
  return *s;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Written by hand: snprintf cost about 2,200 instructions a call here,
// some 40% of what an isend or irecv added to MPI's own (callgrind).
void Pending::set_name(Kind kind, int peer, int tag) {
  char* at = name;
  char* const end = name + sizeof name - 1;  // at most 40 characters are written
  const auto put = [&](const char* text) {
    const size_t n = std::strlen(text);
    std::memcpy(at, text, n);
    at += n;
  };
  put(kind == kSend ? "isend to " : "irecv from ");
  at = std::to_chars(at, end, peer).ptr;
  put(" (tag ");
  at = std::to_chars(at, end, tag).ptr;
  put(")");
  *at = '\0';
}

namespace {
// Whether the contiguous `out` and `t` share memory: LibTorch's answer
// where it has one; where it has none ("too hard": t strided with gaps, or
// expanded), none on another storage, and on the same storage whether t's
// span of memory meets out's.
bool overlaps(const at::Tensor& out, const at::Tensor& t) {
  const auto status = at::get_overlap_status(out, t);
  if (status != at::MemOverlapStatus::TooHard) return status != at::MemOverlapStatus::No;
  if (!out.storage().is_alias_of(t.storage())) return false;
  int64_t span = 1;  // t's elements from its first to its last (strides are not negative)
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  const char* t_lo = static_cast<const char*>(t.data_ptr());
  const char* out_lo = static_cast<const char*>(out.data_ptr());
  return t_lo < out_lo + out.nbytes() && out_lo < t_lo + span * static_cast<int64_t>(t.element_size());
}
}  // namespace

Record make_record(const at::Tensor& t) {
  Record r;
  r.dtype = static_cast<int64_t>(t.scalar_type());
  r.ndim = t.dim();
  if (t.dim() > kMaxTensorDims) {
    r.status = Record::kTooManyDims;
    r.ndim = kMaxTensorDims;
  }
  for (int64_t d = 0; d < r.ndim; ++d) r.dims[d] = t.size(d);
  if (!dtype_supported(t.scalar_type()) && t.scalar_type() != at::kBool && !r.status)
    r.status = Record::kBadDtype;
  if ((t.layout() != at::kStrided || t.device().type() != at::kCPU) && !r.status) r.status = Record::kNotDense;
  return r;
}

void check_axis(Record& r, int64_t axis, int which) {
  if (!r.status && (axis < 0 || axis >= r.ndim)) {
    r.status = Record::kBadAxis;
    r.p[3] = axis;
    r.p[2] = which;
  }
}

void check_root(Record& r, int root, int size) {
  if (!r.status && (root < 0 || root >= size)) {
    r.status = Record::kBadRoot;
    r.p[2] = root;
    r.p[3] = size;
  }
}

void check_op(Record& r, ReduceOp op) {
  if (r.status) return;
  const auto t = static_cast<at::ScalarType>(r.dtype);
  const bool integral = at::isIntegralType(t, /*includeBool=*/false);
  const bool ok = t == at::kBool ? (op == ReduceOp::kLand || op == ReduceOp::kLor ||
                                    op == ReduceOp::kLxor)
                  : op_needs_integers(op) ? integral
                  : (t == at::kBFloat16 || t == at::kHalf) ? op == ReduceOp::kSum
                                                           : true;
  if (!ok) {
    r.status = Record::kBadOp;
    r.p[3] = static_cast<int64_t>(op);
  }
}

void check_out(Record& r, const at::Tensor& out, const at::Tensor& t) {
  r.out = 1;
  auto refuse = [&r](int64_t why) {
    if (r.status) return;
    r.status = Record::kBadOut;
    r.p[2] = why;
  };
  if (!out.defined()) return refuse(Record::kOutUndefined);
  if (out.dim() > kMaxTensorDims) return refuse(Record::kOutTooManyDims);
  r.out_ndim = out.dim();
  for (int64_t d = 0; d < r.out_ndim; ++d) r.out_dims[d] = out.size(d);
  if (at::GradMode::is_enabled() && (t.requires_grad() || out.requires_grad()))
    return refuse(Record::kOutGrad);
  if (out.scalar_type() != t.scalar_type()) return refuse(Record::kOutDtype);
  if (!out.is_contiguous()) return refuse(Record::kOutNotContiguous);
  if (out.numel() > 0 && t.numel() > 0 && overlaps(out, t)) return refuse(Record::kOutOverlaps);
}

void raise_record(const std::string& what, int rank, const Record& r) {
  const auto t = static_cast<at::ScalarType>(r.dtype);
  std::string why;
  switch (r.status) {
    case Record::kTooManyDims:
      why = "its tensor has more than " + std::to_string(kMaxTensorDims) + " dimensions";
      break;
    case Record::kBadDtype:
      why = "dtype " + dtype_name(t) + " is not supported";
      break;
    case Record::kBadAxis:
      why = std::string(r.p[2] == 1 ? "scatter " : r.p[2] == 2 ? "gather " : "") + "axis " +
            std::to_string(r.p[3]) + " is out of range for its tensor of shape " +
            shape_string(r.shape());
      break;
    case Record::kBadRoot:
      why = "root " + std::to_string(r.p[2]) + " is out of range for a communicator of " +
            std::to_string(r.p[3]) + " ranks";
      break;
    case Record::kBadNumelem:
      why = "numelem " + std::to_string(r.p[3]) + " is negative";
      break;
    case Record::kBadOp:
      why = std::string("operation ") + op_name(static_cast<ReduceOp>(r.p[3])) +
            " is not defined for dtype " + (t == at::kBool ? std::string("bool") : dtype_string(t)) +
            " (SUM, PROD, MAX, MIN on numbers; LAND, LOR, LXOR, BAND, BOR, BXOR on integers; "
            "LAND, LOR, LXOR on bool; 16-bit floats: SUM only)";
      break;
    case Record::kBadOut:
      switch (r.p[2]) {
        case Record::kOutUndefined: why = "its out tensor is undefined"; break;
        case Record::kOutTooManyDims:
          why = "its out tensor has more than " + std::to_string(kMaxTensorDims) + " dimensions";
          break;
        case Record::kOutGrad:
          why = "its tensor or its out tensor requires grad, and an out= call records no "
                "autograd history (as LibTorch's out= functions): call it under "
                "at::NoGradGuard, or use the call without out";
          break;
        case Record::kOutDtype:
          why = "its out tensor's dtype is not its tensor's, " +
                (t == at::kBool ? std::string("bool") : dtype_string(t));
          break;
        case Record::kOutNotContiguous: why = "its out tensor is not contiguous"; break;
        case Record::kOutOverlaps: why = "its out tensor overlaps its input"; break;
        default: why = "its out tensor is refused";
      }
      break;
    case Record::kNotDense:
      why = "its tensor is not a dense CPU tensor (a sparse one, or one on another device): the communicator "
            "moves strided CPU tensors only";
      break;
    case Record::kInPlaceRefused:
      why = r.p[2] == Record::kInPlaceInference
                ? "its tensor is an inference tensor, which may be changed in place only under c10::InferenceMode"
                : "its tensor is a view of a tensor that requires grad: the base's history would not see the "
                  "change (partita's in-place calls do not rebase a view's base as LibTorch's in-place ops do); "
                  "pass the base itself, or a clone of the view";
      break;
    default:
      why = "unknown problem";
  }
  throw ShapeError(what + ": rank " + std::to_string(rank) + ": " + why,
                   r.status == Record::kBadOut ? rule_code::kOutTensor : "");
}

std::vector<Record> exchange_records(const CommState& s, const Record& mine,
                                     const std::string& what) {
  std::vector<Record> all(s.size);
  constexpr int n = sizeof(Record) / sizeof(int64_t);
  // The exchange's name in messages: one string per thread, reused, so that
  // a call does not allocate it (nothing in the exchange makes another).
  static thread_local std::string shapes;
  shapes.assign(what).append(" (shapes)");
  static_assert(sizeof(Record) <= detail::kBoardBlockBytes, "a record fits a board's block");
  // Every rank on one node: through shared memory (detail/header_board.hpp),
  // else by MPI; which of the two is agreed once per communicator.
  if (!detail::board_allgather(s.comm, &mine, sizeof(Record), all.data(), shapes.c_str())) {
    // This thread's copy of the record, which MPI reads (kept, with `all`,
    // when the wait gives the exchange up).
    static thread_local std::unique_ptr<Record> sent;
    if (!sent) sent = std::make_unique<Record>();
    *sent = mine;
    auto abandon = [&] { keep_forever(std::move(sent), std::move(all)); };
    call(
        shapes.c_str(),
        [&] { PARTITA_MPI_CHECK(MPI_Allgather(sent.get(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, s.comm)); },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Iallgather(sent.get(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, s.comm, req));
        },
        abandon);
  }
  for (int i = 0; i < s.size; ++i)
    if (all[i].status != Record::kOk) raise_record(what, i, all[i]);
  for (int i = 1; i < s.size; ++i)
    if (all[i].static_shapes != all[0].static_shapes)
      throw ShapeError(what + ": rank " + std::to_string(all[0].static_shapes ? 0 : i) +
                       " passed a StaticShapes promise, rank " +
                       std::to_string(all[0].static_shapes ? i : 0) +
                       " did not (every rank must pass one, or none)");
  return all;
}

namespace {
std::string describe_record(const Record& r) {
  std::string s = r.status == Record::kOk
                      ? "a " + dtype_string(static_cast<at::ScalarType>(r.dtype)) +
                            " tensor of shape " + shape_string(r.shape())
                      : "arguments refused by the checks (status " + std::to_string(r.status) + ")";
  s += " with arguments (" + std::to_string(r.p[0]) + ", " + std::to_string(r.p[1]) + ", " +
       std::to_string(r.p[3]) + ")";
  if (!r.static_shapes) s += " without a promise";
  return s;
}
}  // namespace

std::vector<Record> exchange_records(const CommState& s, Record mine, const std::string& what,
                                     const char* call, const StaticShapes& shapes) {
  StaticSite* site = shapes.site();
  if (!site) return exchange_records(s, mine, what);
  mine.static_shapes = 1;
  std::vector<Record> first;
  {
    std::lock_guard<std::mutex> lock(site->mutex);
    if (site->call && (std::strcmp(site->call, call) != 0 || site->comm != s.comm))
      throw Error(what + ": this StaticShapes promise was made at a call of " + site->call +
                  (std::strcmp(site->call, call) == 0 ? " on another communicator" : "") +
                  "; give each call site its own");
    first = site->first;
  }
  if (!first.empty()) {
    if (!check_static_shapes()) {
      if (!same_statement(mine, first.at(s.rank)))
        raise_broken_promise(what, "rank " + std::to_string(s.rank), describe_record(first[s.rank]),
                             describe_record(mine));
      return first;
    }
    auto all = exchange_records(s, mine, what);
    check_promise(what, first, all, describe_record,
                  [](size_t i) { return "rank " + std::to_string(i); });
    return all;
  }
  return exchange_records(s, mine, what);
}

void keep_promise(const CommState& s, const char* call, const StaticShapes& shapes,
                  const std::vector<Record>& all) {
  StaticSite* site = shapes.site();
  if (!site) return;
  std::lock_guard<std::mutex> lock(site->mutex);
  if (!site->first.empty()) return;
  site->first = all;
  site->comm = s.comm;
  site->call = call;
}

std::shared_ptr<const void> static_derived(const CommState& s, Record mine,
                                           c10::function_ref<std::string()> what,
                                           const char* call, const StaticShapes& shapes) {
  StaticSite* site = shapes.site();
  if (!site || check_static_shapes()) return nullptr;
  mine.static_shapes = 1;
  Record first;
  {
    std::lock_guard<std::mutex> lock(site->mutex);
    if (!site->derived || site->comm != s.comm || !site->call || std::strcmp(site->call, call) != 0)
      return nullptr;
    first = site->first.at(s.rank);
    if (same_statement(mine, first)) return site->derived;
  }
  // A local problem of this call (an out refused, an axis out of range)
  // says so rather than only that the record changed.
  if (mine.status != Record::kOk) raise_record(what(), s.rank, mine);
  raise_broken_promise(what(), "rank " + std::to_string(s.rank), describe_record(first),
                       describe_record(mine));
}

void keep_derived(const StaticShapes& shapes, std::shared_ptr<const void> derived) {
  if (StaticSite* site = shapes.site()) {
    std::lock_guard<std::mutex> lock(site->mutex);
    site->derived = std::move(derived);
  }
}

MPI_Op comm_op(ReduceOp op, at::ScalarType t) {
  switch (op) {
    case ReduceOp::kSum: return mpi_sum(t);
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kLand: return MPI_LAND;
    case ReduceOp::kLor: return MPI_LOR;
    case ReduceOp::kLxor: return MPI_LXOR;
    case ReduceOp::kBand: return MPI_BAND;
    case ReduceOp::kBor: return MPI_BOR;
    case ReduceOp::kBxor: return MPI_BXOR;
  }
  throw Error("unknown reduction operation");
}

namespace {

struct RaiseNode : torch::autograd::Node {
  std::string label, message;
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    throw Error(message);
  }
  std::string name() const override { return label; }
};

}  // namespace

at::Tensor attach(at::Tensor out, const at::Tensor& input, const std::string& name,
                  Adjoint adjoint) {
  return with_adjoint(std::move(out), input, torch::autograd::compute_requires_grad(input), name,
                      std::move(adjoint));
}

at::Tensor attach_error(at::Tensor out, const at::Tensor& input, const std::string& name,
                        const std::string& message) {
  if (!torch::autograd::compute_requires_grad(input)) return out;
  auto node = std::shared_ptr<RaiseNode>(new RaiseNode(), torch::autograd::deleteNode);
  node->label = name;
  node->message = message;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
  return out;
}

void forbid_reuse(const at::Tensor& input, const std::string& what) {
  // Leaves cannot get a node (their gradient is accumulated), as in mpi4torch.
  if (!input.requires_grad() || !input.grad_fn()) return;
  auto node = std::shared_ptr<RaiseNode>(new RaiseNode(), torch::autograd::deleteNode);
  node->label = "NoReuseAfterInPlace";
  node->message = what +
                  ": its input was passed to an in-place communicator call and may not be used "
                  "again in a differentiated computation; use the returned tensor instead";
  auto& t = const_cast<at::Tensor&>(input);
  torch::autograd::set_history(t, node);
}

}  // namespace partita::mpi::detail
