#include "detail/team_comm.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <cstring>

#include "detail/header_board.hpp"
#include "partita/mpi/buffer_cache.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

Header make_header(const at::Tensor& x) {
  Header h;
  h.dtype = static_cast<int64_t>(x.scalar_type());
  // Under NoGradGuard or InferenceMode no graph is recorded, as for
  // LibTorch's own ops: the call then attaches no adjoint (docs/output-reuse.md).
  h.requires_grad = grad_statement(x.requires_grad());
  if (!dtype_supported(x.scalar_type())) h.status = Header::kBadDtype;
  if (x.dim() > kMaxTensorDims) {
    h.status = Header::kTooManyDims;
    return h;
  }
  h.ndim = x.dim();
  for (int d = 0; d < x.dim(); ++d) h.dims[d] = x.size(d);
  return h;
}

int64_t grad_statement(bool wants) {
  if (!at::GradMode::is_enabled()) return Header::kGradModeOff;
  return wants ? Header::kWantsGrad : Header::kNoGrad;
}

namespace {
// Every count equals counts[0] and block i starts at i * counts[0].
bool regular_blocks(const std::vector<int>& counts, const std::vector<int>& displs) {
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] != counts[0] || displs[i] != static_cast<int>(i) * counts[0]) return false;
  return true;
}
}  // namespace

void allgather_blocks(const void* send, int count, MPI_Datatype type, void* recv,
                      const std::vector<int>& counts, const std::vector<int>& displs,
                      MPI_Comm comm, const char* what, const Abandon& abandon) {
  if (!counts.empty() && regular_blocks(counts, displs))
    call(
        what, [&] { PARTITA_MPI_CHECK(MPI_Allgather(send, count, type, recv, counts[0], type, comm)); },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Iallgather(send, count, type, recv, counts[0], type, comm, req));
        },
        abandon);
  else
    call(
        what,
        [&] {
          PARTITA_MPI_CHECK(MPI_Allgatherv(send, count, type, recv, counts.data(), displs.data(),
                                           type, comm));
        },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Iallgatherv(send, count, type, recv, counts.data(), displs.data(),
                                            type, comm, req));
        },
        abandon);
}

void alltoall_blocks(bool uniform, const void* send, const std::vector<int>& scounts,
                     const std::vector<int>& sdispls, void* recv, const std::vector<int>& rcounts,
                     const std::vector<int>& rdispls, MPI_Datatype type, MPI_Comm comm,
                     const char* what, const Abandon& abandon) {
  if (uniform) {
    if (scounts.empty() || !regular_blocks(scounts, sdispls) || !regular_blocks(rcounts, rdispls) ||
        scounts[0] != rcounts[0])
      throw std::logic_error("alltoall_blocks: blocks said to be uniform are not");
    call(
        what, [&] { PARTITA_MPI_CHECK(MPI_Alltoall(send, scounts[0], type, recv, rcounts[0], type, comm)); },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Ialltoall(send, scounts[0], type, recv, rcounts[0], type, comm, req));
        },
        abandon);
  } else {
    call(
        what,
        [&] {
          PARTITA_MPI_CHECK(MPI_Alltoallv(send, scounts.data(), sdispls.data(), type, recv,
                                          rcounts.data(), rdispls.data(), type, comm));
        },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Ialltoallv(send, scounts.data(), sdispls.data(), type, recv,
                                           rcounts.data(), rdispls.data(), type, comm, req));
        },
        abandon);
  }
}

void exchange_headers(const Partition& P, const Header& mine, const char* what,
                      std::vector<Header>& all) {
  all.clear();
  if (!P.active()) return;
  // Alone, a rank agrees with itself: the collective on a one-rank
  // communicator was 4,500 of a 1-rank broadcast's 9,900 instructions.
  if (P.size() == 1) {
    all.push_back(mine);
    return;
  }
  constexpr int n = sizeof(Header) / sizeof(int64_t);
  all.resize(static_cast<size_t>(P.size()));
  static_assert(sizeof(Header) <= kBoardBlockBytes, "a header fits a board's block");
  // Every rank on one node: through shared memory (header_board.hpp).
  if (board_allgather(P.comm(), &mine, sizeof(Header), all.data(), what)) return;
  // This thread's copy of the header, which MPI reads: the caller's may be
  // gone by the time a late peer joins an abandoned exchange.
  static thread_local std::unique_ptr<Header> sent;
  if (!sent) sent = std::make_unique<Header>();
  *sent = mine;
  auto abandon = [&] { keep_forever(std::move(sent), std::move(all)); };
  call(
      what,
      [&] { PARTITA_MPI_CHECK(MPI_Allgather(sent.get(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, P.comm())); },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Iallgather(sent.get(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T,
                                         P.comm(), req));
      },
      abandon);
}

namespace {

// bfloat16 and float16 have no MPI type with MPI_SUM: sum them as 16-bit
// payloads with a user operation that adds in float and rounds back.
template <typename T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

MPI_Op make_op(MPI_User_function* f) {
  MPI_Op op;
  PARTITA_MPI_CHECK(MPI_Op_create(f, 1, &op));
  return op;
}

}  // namespace

MPI_Datatype mpi_datatype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kBFloat16: case at::kHalf: return MPI_UINT16_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kChar: return MPI_INT8_T;
    case at::kShort: return MPI_INT16_T;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kBool: return MPI_C_BOOL;
    default: throw ShapeError("partita: dtype " + dtype_name(t) + " is not supported",
                              rule_code::kDtypeUnsupported);
  }
}

MPI_Op mpi_sum(at::ScalarType t) {
  // Created on first use, after MPI_Init, and never freed (MPI frees user
  // operations at finalize).
  static MPI_Op bf16 = make_op(&sum16<c10::BFloat16>);
  static MPI_Op f16 = make_op(&sum16<c10::Half>);
  if (t == at::kBFloat16) return bf16;
  if (t == at::kHalf) return f16;
  return MPI_SUM;
}

void raise_count_overflow(int64_t numel, const std::string& what) {
  throw ShapeError(what + ": a count of " + std::to_string(numel) +
                   " elements, above the MPI count limit (INT_MAX = 2147483647); nothing was sent",
                   rule_code::kCountOverflow);
}

namespace {

// at::empty of a dense CPU tensor without the dispatcher: at::empty's CPU
// kernel calls the same at::detail::empty_cpu, and the dispatch around it
// was about 30% of at::empty's samples in a 4 KiB forward (docs/benchmarks.md).
// Any other options go through at::empty as before.
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu() && options.layout() == at::kStrided &&
      !options.requires_grad() && !options.pinned_memory())
    return at::detail::empty_cpu(sizes, options);
  return at::empty(sizes, options);
}
// The same, or the output `reuse` keeps.
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options, const OutputSlot* reuse) {
  return reuse ? reuse->take(sizes, options) : fresh(sizes, options);
}

// Nothing but `t` reaches its TensorImpl or its storage: no other Tensor,
// view or Storage handle, and no weak reference to either. The strong
// counts are read again last: a thread that held a weak reference may have
// locked it (a strong one) and dropped the weak one between the reads.
bool only_reference(const at::Tensor& t) {
  const c10::Storage& s = t.storage();
  if (t.use_count() != 1 || s.use_count() != 1) return false;
  // (A weak count is the weak references plus one while strong ones exist;
  // the storage's look adds one.)
  if (t.weak_use_count() != 1 || s.getWeakStorageImpl().weak_use_count() != 2) return false;
  return t.use_count() == 1 && s.use_count() == 1;
}

}  // namespace

at::Tensor OutputSlot::take(at::IntArrayRef sizes, const at::TensorOptions& options) const {
  at::Tensor t;
  c10::DispatchKeySet keys;
  const c10::StorageImpl* storage = nullptr;
  const void* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    t = std::move(spare_);
    keys = keys_;
    storage = storage_;
    data = data_;
  }
  // (The same storage and memory as when kept: `set_`, `set_data` or a
  // swapped data pointer could have pointed it at the caller's memory.)
  if (t.defined() && options.device().is_cpu() && options.layout() == at::kStrided &&
      !options.requires_grad() && !options.pinned_memory() &&
      t.storage().unsafeGetStorageImpl() == storage && t.storage().data() == data &&
      static_cast<size_t>(t.nbytes()) <= output_reuse_limit() &&
      t.scalar_type() == options.dtype().toScalarType() && t.key_set() == keys &&
      t.is_inference() == c10::InferenceMode::is_enabled() &&
      t.unsafeGetTensorImpl()->autograd_meta() == nullptr && !t.has_names() &&
      t.sizes().equals(sizes) && t.is_contiguous() && t.storage_offset() == 0 &&
      t.storage().nbytes() >= t.nbytes() && only_reference(t))
    return t;
  return fresh(sizes, options);  // (t, if any, is released here)
}

void OutputSlot::keep(const at::Tensor& y) const {
  if (!y.defined() || y.nbytes() == 0 || y.nbytes() > output_reuse_limit() ||
      !y.device().is_cpu() || y.layout() != at::kStrided ||
      y.unsafeGetTensorImpl()->autograd_meta() != nullptr)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  spare_ = y;
  keys_ = y.key_set();
  storage_ = y.storage().unsafeGetStorageImpl();
  data_ = y.storage().data();
}

at::Tensor contiguous_copy(const at::Tensor& x, const OutputSlot* reuse) {
  if (x.is_contiguous() && x.device().is_cpu() && x.layout() == at::kStrided && !x.is_conj() &&
      !x.is_neg()) {
    at::Tensor out = fresh(x.sizes(), x.options().requires_grad(false), reuse);
    if (x.numel() > 0) std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
    return out;
  }
  return x.detach().clone(at::MemoryFormat::Contiguous);
}

namespace {
// The team operations of bcast_teams / reduce_teams, one per team this
// rank is in (root of one, member of another, or both): `op(nullptr)` runs
// one's blocking form, `op(&request)` posts its non-blocking one. Those
// with `has_...` false are skipped; `meanwhile()` runs while they are in
// flight (posted) or after them (blocking).
//
// Every rank of a team must use the same form (MPI matches no blocking
// collective with a non-blocking one), and a rank in two teams must not
// block in one while a peer blocks in the other first. So where
// blocking_waits() holds, every rank runs its blocking operations in the
// order of their teams' roots' world ranks (`first_root`, `second_root`):
// one order over all teams, in which the team of the lowest root can
// always finish, then the next, and so on, whatever roles each rank has.
// Otherwise both are posted, then waited for together.
// The world rank of a team's root (its rank 0), -1 where this rank is
// not in the team.
int team_root(const Partition& team) { return team.active() ? team.workers().at(0) : -1; }

// `keep` runs where the wait gives the posted operations up: it keeps their
// buffers (keep_forever).
template <typename First, typename Second, typename Meanwhile, typename Keep>
void both_or_one(bool has_first, int first_root, First&& first, bool has_second, int second_root,
                 Second&& second, Meanwhile&& meanwhile, Keep& keep, const std::string& what) {
  if (blocking_waits()) {
    const WatchedCall watched(what.c_str());
    const bool second_first = has_first && has_second && second_root < first_root;
    if (second_first) second(nullptr);
    if (has_first) first(nullptr);
    if (has_second && !second_first) second(nullptr);
    meanwhile();
    return;
  }
  MPI_Request reqs[2];
  int n = 0;
  if (has_first) first(&reqs[n++]);
  if (has_second) second(&reqs[n++]);
  meanwhile();
  wait_all(n, reqs, what.c_str(), keep);
}
}  // namespace

// Both teams' counts are checked before anything is copied, allocated or
// posted (issue 35 item 5): a rank that is the root of one team and a
// member of another used to post the first broadcast (or reduction) and
// then throw on the second, leaving a request in flight on a buffer it
// freed. (The layers agree on every team's count before they get here,
// check_volumes_fit; this keeps the function safe on its own.)
at::Tensor bcast_teams(const Partition& root_team, const Partition& member_team,
                       const at::Tensor& src, const Shape& out_shape,
                       const at::TensorOptions& out_options, const std::string& what,
                       const OutputSlot* reuse) {
  const bool self = member_team.active() && root_team.active() &&
                    member_team.comm() == root_team.comm();
  const int root_count = root_team.active() ? mpi_count(src.numel(), what) : 0;
  const int member_count = member_team.active() && !self ? mpi_count(volume(out_shape), what) : 0;
  at::Tensor send, out;
  if (root_team.active()) send = src.contiguous();
  if (member_team.active() && !self) out = fresh(out_shape, out_options, reuse);
  // The root is its own receiver: its output is a copy, not its input.
  // One memcpy of the contiguous input when the output has its shape and
  // dtype (always, for the layers), else a clone.
  auto copy_for_self = [&] {
    if (!self) return;
    out = send.scalar_type() == out_options.dtype().toScalarType() &&
                  send.sizes().equals(out_shape)
              ? contiguous_copy(send, reuse)
              : src.clone();
  };
  const auto as_root = [&](MPI_Request* req) {
    const MPI_Datatype type = mpi_datatype(send.scalar_type());
    if (!req) return PARTITA_MPI_CHECK(MPI_Bcast(send.data_ptr(), root_count, type, 0, root_team.comm()));
    PARTITA_MPI_CHECK(MPI_Ibcast(send.data_ptr(), root_count, type, 0, root_team.comm(), req));
  };
  const auto as_member = [&](MPI_Request* req) {
    const MPI_Datatype type = mpi_datatype(out.scalar_type());
    if (!req) return PARTITA_MPI_CHECK(MPI_Bcast(out.data_ptr(), member_count, type, 0, member_team.comm()));
    PARTITA_MPI_CHECK(MPI_Ibcast(out.data_ptr(), member_count, type, 0, member_team.comm(), req));
  };
  auto keep = [&] { keep_forever(send, out); };
  both_or_one(root_count > 0, team_root(root_team), as_root, member_count > 0,
              team_root(member_team), as_member, copy_for_self, keep, what);
  return out;
}

at::Tensor reduce_teams(const Partition& root_team, const Partition& member_team,
                        const at::Tensor& contrib, const Shape& out_shape,
                        const at::TensorOptions& out_options, const std::string& what,
                        const OutputSlot* reuse) {
  const bool self = member_team.active() && root_team.active() &&
                    member_team.comm() == root_team.comm();
  const int member_count = member_team.active() && !self ? mpi_count(contrib.numel(), what) : 0;
  const int root_count = root_team.active() ? mpi_count(volume(out_shape), what) : 0;
  at::Tensor send, out;
  if (member_team.active()) send = contrib.contiguous();
  // A root that contributes to its own team sends from its input into a
  // fresh output; one that does not reduces in place into zeros.
  if (root_team.active()) out = self ? fresh(out_shape, out_options, reuse) : at::zeros(out_shape, out_options);
  const auto as_member = [&](MPI_Request* req) {
    const at::ScalarType t = send.scalar_type();
    if (!req)
      return PARTITA_MPI_CHECK(MPI_Reduce(send.data_ptr(), nullptr, member_count, mpi_datatype(t),
                                          mpi_sum(t), 0, member_team.comm()));
    PARTITA_MPI_CHECK(MPI_Ireduce(send.data_ptr(), nullptr, member_count, mpi_datatype(t),
                                  mpi_sum(t), 0, member_team.comm(), req));
  };
  const auto as_root = [&](MPI_Request* req) {
    const at::ScalarType t = out.scalar_type();
    const void* in = self ? send.data_ptr() : MPI_IN_PLACE;
    if (!req)
      return PARTITA_MPI_CHECK(MPI_Reduce(in, out.data_ptr(), root_count, mpi_datatype(t),
                                          mpi_sum(t), 0, root_team.comm()));
    PARTITA_MPI_CHECK(MPI_Ireduce(in, out.data_ptr(), root_count, mpi_datatype(t), mpi_sum(t), 0,
                                  root_team.comm(), req));
  };
  auto keep = [&] { keep_forever(send, out); };
  both_or_one(member_count > 0, team_root(member_team), as_member, root_count > 0,
              team_root(root_team), as_root, [] {}, keep, what);
  return out;
}

namespace {

struct AdjointNode : torch::autograd::Node {
  std::string label;
  Adjoint adjoint;
  std::vector<int64_t> out_sizes;
  at::TensorOptions out_options;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // An unused output has no gradient: its adjoint input is zero, and the
    // collective still runs so that the other ranks are not left waiting.
    // A backward with create_graph (a double backward, a gradient penalty)
    // runs its nodes under grad mode on; the adjoint's result would carry
    // no history, so every second-order term through it would be zero,
    // silently. Refused, on every rank that reaches the node, before any
    // message. (Only inside the autograd engine: a node applied by hand,
    // as the benchmarks time the adjoint alone, runs under the caller's
    // grad mode.)
    if (at::GradMode::is_enabled() && torch::autograd::get_current_graph_task_exec_info() != nullptr)
      throw Error(label + ": a backward with create_graph (a double backward) reaches partita's data movement, "
                          "whose adjoints record no history of their own: not supported");
    at::Tensor g = grads.empty() || !grads[0].defined() ? at::zeros(out_sizes, out_options)
                                                         : std::move(grads[0]);
    grads.clear();
    at::Tensor gx;
    {
      at::NoGradGuard no_grad;
      gx = adjoint(std::move(g));
    }
    return {gx};
  }
  std::string name() const override { return label; }
};

}  // namespace

namespace {
// The node of an output shaped like `like`, whose inputs are x's history.
std::shared_ptr<AdjointNode> make_node(const at::Tensor& like, const at::Tensor& x,
                                       const std::string& name, Adjoint adjoint) {
  auto node = std::shared_ptr<AdjointNode>(new AdjointNode(), torch::autograd::deleteNode);
  node->label = name;
  node->adjoint = std::move(adjoint);
  node->out_sizes = like.sizes().vec();
  node->out_options = like.options();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  return node;
}
}  // namespace

at::Tensor with_adjoint(at::Tensor out, const at::Tensor& x, bool attach,
                        const std::string& name, Adjoint adjoint) {
  if (!attach || !at::isFloatingType(out.scalar_type()) || !at::GradMode::is_enabled()) return out;
  torch::autograd::set_history(out, make_node(out, x, name, std::move(adjoint)));
  return out;
}

at::Tensor with_adjoint_in_place(const at::Tensor& x, bool attach, const std::string& name,
                                 Adjoint adjoint) {
  torch::autograd::impl::bump_version(x);
  if (!attach || !at::isFloatingType(x.scalar_type()) || !at::GradMode::is_enabled()) return x;
  auto node = make_node(x, x, name, std::move(adjoint));
  const auto input_nr = node->add_input_metadata(x);
  torch::autograd::impl::rebase_history(x, {node, input_nr});
  return x;
}

bool owned(const at::Tensor& g) {
  return g.use_count() == 1 && g.is_contiguous() && !g.is_view() && g.storage_offset() == 0 &&
         g.storage().use_count() == 1 &&
         static_cast<int64_t>(g.storage().nbytes()) == g.numel() * g.element_size();
}

at::Tensor owned_contiguous(at::Tensor g) {
  return owned(g) ? g : g.clone(at::MemoryFormat::Contiguous);
}

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

namespace {

// The volumes of the dimensions before and after `dim`: a tensor seen as
// [outer, length, inner].
int64_t outer_volume(at::IntArrayRef sizes, int64_t dim) {
  int64_t v = 1;
  for (int64_t d = 0; d < dim; ++d) v *= sizes[d];
  return v;
}
int64_t inner_volume(at::IntArrayRef sizes, int64_t dim) {
  int64_t v = 1;
  for (int64_t d = dim + 1; d < static_cast<int64_t>(sizes.size()); ++d) v *= sizes[d];
  return v;
}

}  // namespace

int64_t row_volume(at::IntArrayRef sizes, int64_t dim) {
  return outer_volume(sizes, dim) * inner_volume(sizes, dim);
}

// Only the counts and displacements must fit an int, not the total: a
// check of the total would raise on the ranks that take this path and not
// on those whose blocks go by send_blocks' single-block branch, which would
// then wait forever.
int64_t block_counts(const std::vector<int64_t>& lens, int64_t row, const std::string& what,
                     std::vector<int>& counts, std::vector<int>& displs) {
  counts.clear();
  displs.clear();
  counts.reserve(lens.size());
  displs.reserve(lens.size());
  int64_t at = 0;
  for (int64_t len : lens) {
    displs.push_back(mpi_count(at, what));
    counts.push_back(mpi_count(len * row, what));
    at += len * row;
  }
  return at;
}

namespace {

// The rows [starts[j], starts[j] + lens[j]) along `dim` of the contiguous c
// as the consecutive blocks that `counts` and `displs` describe (the caller
// computed them, block_counts of lens, before anything else): c itself when
// outer is 1 (the blocks follow each other there already), else one copy
// that puts them one after the other in order.
at::Tensor send_blocks(const at::Tensor& c, int64_t dim, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& lens, const std::vector<int>& counts,
                       const std::vector<int>& displs) {
  const int64_t outer = outer_volume(c.sizes(), dim), inner = inner_volume(c.sizes(), dim);
  if (outer == 1) return c;
  const int64_t n = counts.empty() ? 0 : int64_t{displs.back()} + counts.back();
  at::Tensor staged = fresh({n}, c.options());
  const at::Tensor v = c.view({outer, c.size(dim), inner});
  for (size_t j = 0; j < lens.size(); ++j)
    if (lens[j] > 0)
      staged.narrow(0, displs[j], counts[j])
          .view({outer, lens[j], inner})
          .copy_(v.narrow(1, starts[j], lens[j]));
  return staged;
}

// The tensor of `out_sizes` made of the received blocks in `flat`, block i
// [outer, lens[i], inner] along `dim` (outer and inner of out_sizes): flat
// itself when outer is 1 (a view of it unless it already has out_sizes,
// see blocks_buffer), else one copy.
// With `into` (the caller's output, of out_sizes), the copy goes there;
// else into a tensor from `reuse` or a fresh one.
at::Tensor from_blocks(const at::Tensor& flat, int64_t dim, const std::vector<int64_t>& lens,
                       at::IntArrayRef out_sizes, const at::Tensor* into = nullptr,
                       const OutputSlot* reuse = nullptr) {
  const int64_t outer = outer_volume(out_sizes, dim), inner = inner_volume(out_sizes, dim);
  if (outer == 1) return flat.sizes() == out_sizes ? flat : flat.view(out_sizes);
  at::Tensor out = into ? *into : fresh(out_sizes, flat.options(), reuse);
  const at::Tensor v = out.view({outer, out_sizes[dim], inner});
  int64_t at = 0, row = 0;
  for (int64_t len : lens) {
    if (len > 0)
      v.narrow(1, row, len).copy_(flat.narrow(0, at, outer * len * inner).view({outer, len, inner}));
    at += outer * len * inner;
    row += len;
  }
  return out;
}

// The buffer that receives `n` elements of blocks for from_blocks: when
// outer is 1 the blocks arrive in place, so it is allocated with out_sizes
// (n is then its volume) and from_blocks returns it as it is, not a view
// through the dispatcher, so it may come from `reuse`; else n flat elements.
at::Tensor blocks_buffer(at::IntArrayRef out_sizes, int64_t dim, int64_t n,
                         const at::TensorOptions& options, const OutputSlot* reuse = nullptr) {
  if (outer_volume(out_sizes, dim) == 1) return fresh(out_sizes, options, reuse);
  return fresh({n}, options);
}

std::vector<int64_t> starts_of(const std::vector<int64_t>& lens) {
  std::vector<int64_t> starts(lens.size());
  int64_t at = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    starts[i] = at;
    at += lens[i];
  }
  return starts;
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

}  // namespace

at::Tensor allreduce(const Group& g, const at::Tensor& x, MPI_Op op, const std::string& what,
                     const OutputSlot* reuse) {
  if (g.size == 1 || x.numel() == 0) return contiguous_copy(x, reuse);
  const int count = mpi_count(x.numel(), what);
  // MPI reads the input and writes a fresh output: no copy of our own.
  const at::Tensor in = x.contiguous();
  at::Tensor out = fresh(in.sizes(), in.options(), reuse);
  const MPI_Datatype type = mpi_datatype(in.scalar_type());
  auto keep = [&] { keep_forever(in, out); };
  call(
      what.c_str(),
      [&] { PARTITA_MPI_CHECK(MPI_Allreduce(in.data_ptr(), out.data_ptr(), count, type, op, g.comm)); },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Iallreduce(in.data_ptr(), out.data_ptr(), count, type, op, g.comm, req));
      },
      keep);
  return out;
}

void bcast_inplace(const Group& g, at::Tensor& buf, int root, const std::string& what) {
  if (g.size == 1 || buf.numel() == 0) return;
  const int count = mpi_count(buf.numel(), what);
  const MPI_Datatype type = mpi_datatype(buf.scalar_type());
  auto keep = [&] { keep_forever(buf); };
  call(
      what.c_str(), [&] { PARTITA_MPI_CHECK(MPI_Bcast(buf.data_ptr(), count, type, root, g.comm)); },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Ibcast(buf.data_ptr(), count, type, root, g.comm, req));
      },
      keep);
}

void reduce_inplace(const Group& g, at::Tensor& buf, MPI_Op op, int root,
                    const std::string& what) {
  if (g.size == 1 || buf.numel() == 0) return;
  const bool me = g.rank == root;
  const void* send = me ? MPI_IN_PLACE : buf.data_ptr();
  void* recv = me ? buf.data_ptr() : nullptr;
  const int count = mpi_count(buf.numel(), what);
  const MPI_Datatype type = mpi_datatype(buf.scalar_type());
  auto keep = [&] { keep_forever(buf); };
  call(
      what.c_str(), [&] { PARTITA_MPI_CHECK(MPI_Reduce(send, recv, count, type, op, root, g.comm)); },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Ireduce(send, recv, count, type, op, root, g.comm, req));
      },
      keep);
}

at::Tensor reduce_to(const Group& g, const at::Tensor& x, MPI_Op op, int root,
                     const std::string& what) {
  if (g.size == 1) return contiguous_copy(x);
  const int count = mpi_count(x.numel(), what);
  const at::Tensor in = x.contiguous();
  const bool me = g.rank == root;
  at::Tensor out = me ? at::empty(in.sizes(), in.options()) : at::Tensor();
  if (count > 0) {
    void* recv = me ? out.data_ptr() : nullptr;
    const MPI_Datatype type = mpi_datatype(in.scalar_type());
    auto keep = [&] { keep_forever(in, out); };
    call(
        what.c_str(),
        [&] { PARTITA_MPI_CHECK(MPI_Reduce(in.data_ptr(), recv, count, type, op, root, g.comm)); },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Ireduce(in.data_ptr(), recv, count, type, op, root, g.comm, req));
        },
        keep);
  }
  return out;
}

at::Tensor gather_dim(const Group& g, const at::Tensor& x, int64_t dim,
                      const std::vector<int64_t>& lengths, int root, const std::string& what) {
  if (g.size == 1) return contiguous_copy(x);
  std::vector<int> counts, displs;
  const int64_t n = block_counts(lengths, row_volume(x.sizes(), dim), what, counts, displs);
  const at::Tensor c = x.contiguous();
  at::DimVector out_sizes(c.sizes().begin(), c.sizes().end());
  out_sizes[dim] = g.rank == root ? total(lengths) : 0;
  at::Tensor staged = blocks_buffer(out_sizes, dim, g.rank == root ? n : 0, c.options());
  const MPI_Datatype type = mpi_datatype(c.scalar_type());
  auto keep = [&] { keep_forever(std::move(counts), std::move(displs), c, staged); };
  call(
      what.c_str(),
      [&] {
        PARTITA_MPI_CHECK(MPI_Gatherv(c.data_ptr(), counts.at(g.rank), type, staged.data_ptr(),
                                      counts.data(), displs.data(), type, root, g.comm));
      },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Igatherv(c.data_ptr(), counts.at(g.rank), type, staged.data_ptr(),
                                       counts.data(), displs.data(), type, root, g.comm, req));
      },
      keep);
  return from_blocks(staged, dim, g.rank == root ? lengths : std::vector<int64_t>(), out_sizes);
}

at::Tensor allgather_dim(const Group& g, const at::Tensor& x, int64_t dim,
                         const std::vector<int64_t>& lengths, const std::string& what,
                         const OutputSlot* reuse) {
  if (g.size == 1) return contiguous_copy(x, reuse);
  // (This thread's, so that a call allocates none: malloc and free of the
  // two were 250 of a 4 KiB all-gather's instructions.)
  static thread_local std::vector<int> counts, displs;
  const int64_t n = block_counts(lengths, row_volume(x.sizes(), dim), what, counts, displs);
  const at::Tensor c = x.contiguous();
  at::DimVector out_sizes(c.sizes().begin(), c.sizes().end());
  out_sizes[dim] = total(lengths);
  at::Tensor staged = blocks_buffer(out_sizes, dim, n, c.options(), reuse);
  // An abandoned all-gather keeps this thread's counts and displacements
  // (the next call allocates its own) and both tensors.
  auto keep = [&] { keep_forever(std::move(counts), std::move(displs), c, staged); };
  if (n > 0)
    allgather_blocks(c.data_ptr(), counts.at(g.rank), mpi_datatype(c.scalar_type()),
                     staged.data_ptr(), counts, displs, g.comm, what.c_str(), keep);
  return from_blocks(staged, dim, lengths, out_sizes, nullptr, reuse);
}

at::Tensor reduce_scatter_dim(const Group& g, const at::Tensor& x, int64_t dim,
                              const std::vector<int64_t>& lengths, const std::string& what,
                              const OutputSlot* reuse) {
  if (g.size == 1) return contiguous_copy(x, reuse);
  static thread_local std::vector<int> counts, displs;  // (as in allgather_dim)
  // (send_blocks hands MPI these counts, and displacements of no more.)
  block_counts(lengths, row_volume(x.sizes(), dim), what, counts, displs);
  const at::Tensor c = x.contiguous();
  at::DimVector out_sizes(c.sizes().begin(), c.sizes().end());
  out_sizes[dim] = lengths.at(g.rank);
  const at::Tensor staged = send_blocks(c, dim, starts_of(lengths), lengths, counts, displs);
  at::Tensor out = fresh(out_sizes, c.options(), reuse);
  if (c.numel() > 0) {
    const MPI_Datatype type = mpi_datatype(c.scalar_type());
    const MPI_Op op = mpi_sum(c.scalar_type());
    auto keep = [&] { keep_forever(std::move(counts), std::move(displs), staged, out); };  // (as in allgather_dim)
    call(
        what.c_str(),
        [&] {
          PARTITA_MPI_CHECK(MPI_Reduce_scatter(staged.data_ptr(), out.data_ptr(), counts.data(),
                                               type, op, g.comm));
        },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Ireduce_scatter(staged.data_ptr(), out.data_ptr(), counts.data(),
                                                type, op, g.comm, req));
        },
        keep);
  }
  return out;
}

at::Tensor scatter_dim(const Group& g, const at::Tensor& x, int64_t dim,
                       const std::vector<int64_t>& lengths, int root, const Shape& root_shape,
                       const at::TensorOptions& options, const std::string& what) {
  std::vector<int> counts, displs;
  block_counts(lengths, row_volume(root_shape, dim), what, counts, displs);
  Shape out_shape = root_shape;
  out_shape[dim] = lengths.at(g.rank);
  at::Tensor out = at::empty(out_shape, options);
  at::Tensor staged;
  if (g.rank == root)
    staged = send_blocks(x.contiguous(), dim, starts_of(lengths), lengths, counts, displs);
  if (g.size == 1) {
    out.view({-1}).copy_(staged.view({-1}).narrow(0, displs[0], counts[0]));
    return out;
  }
  const MPI_Datatype type = mpi_datatype(options.dtype().toScalarType());
  const void* send = g.rank == root ? staged.data_ptr() : nullptr;
  auto keep = [&] { keep_forever(std::move(counts), std::move(displs), staged, out); };
  call(
      what.c_str(),
      [&] {
        PARTITA_MPI_CHECK(MPI_Scatterv(send, counts.data(), displs.data(), type, out.data_ptr(),
                                       counts.at(g.rank), type, root, g.comm));
      },
      [&](MPI_Request* req) {
        PARTITA_MPI_CHECK(MPI_Iscatterv(send, counts.data(), displs.data(), type, out.data_ptr(),
                                        counts.at(g.rank), type, root, g.comm, req));
      },
      keep);
  return out;
}

AlltoallCounts alltoall_counts(int member, at::IntArrayRef sizes, int64_t gather_dim,
                               int64_t scatter_dim, const std::vector<int64_t>& gextents,
                               const std::vector<int64_t>& numelem, const std::string& what) {
  const int p = static_cast<int>(numelem.size()), me = member;
  AlltoallCounts k;
  k.send_at.assign(p, 0);
  k.send_rows.assign(p, 0);
  k.recv_rows.assign(p, 0);
  if (gather_dim != scatter_dim) {
    // Piece j of every member is rows [N_j, N_j + numelem_j).
    k.send_at = starts_of(numelem);
    k.send_rows = numelem;
    k.recv_rows.assign(p, numelem[me]);
  } else {
    // The concatenation of every member's x along the axis, re-split:
    // member i's rows [C_i, C_i + g_i) overlap member j's [N_j, N_j + n_j).
    const std::vector<int64_t> C = starts_of(gextents), N = starts_of(numelem);
    auto overlap = [&](int i, int j, int64_t* start) {
      const int64_t lo = std::max(C[i], N[j]);
      const int64_t hi = std::min(C[i] + gextents[i], N[j] + numelem[j]);
      if (start) *start = std::max<int64_t>(0, lo - C[i]);
      return std::max<int64_t>(0, hi - lo);
    };
    for (int j = 0; j < p; ++j) {
      k.send_rows[j] = overlap(me, j, &k.send_at[j]);
      k.recv_rows[j] = overlap(j, me, nullptr);
    }
  }
  // What send_blocks hands MPI: offsets into x itself when outer is 1, else
  // consecutive blocks of a staged copy.
  const int64_t outer = outer_volume(sizes, scatter_dim), inner = inner_volume(sizes, scatter_dim);
  if (outer == 1) {
    for (int j = 0; j < p; ++j) {
      k.sdispls.push_back(mpi_count(k.send_at[j] * inner, what));
      k.scounts.push_back(mpi_count(k.send_rows[j] * inner, what));
    }
  } else {
    block_counts(k.send_rows, outer * inner, what, k.scounts, k.sdispls);
  }
  // Member i's block to this member is its x's rows along scatter_dim, of
  // member i's extent along gather_dim.
  for (int i = 0; i < p; ++i) {
    std::vector<int64_t> sizes_i = sizes.vec();
    if (gather_dim != scatter_dim) sizes_i[gather_dim] = gextents[i];
    sizes_i[scatter_dim] = k.recv_rows[i];
    k.rdispls.push_back(mpi_count(k.rtotal, what));
    k.rcounts.push_back(mpi_count(volume(sizes_i), what));
    k.rtotal += k.rcounts.back();
  }
  return k;
}

AlltoallCounts alltoall_checked_counts(int me, at::IntArrayRef sizes, int64_t gather_dim,
                                       int64_t scatter_dim, const std::vector<int64_t>& gextents,
                                       const std::vector<int64_t>& numelem,
                                       const std::string& what) {
  const int p = static_cast<int>(numelem.size());
  // Member m's counts and displacements are at most the volume of its input
  // (what it sends) or of its output (what it receives): when every member's
  // two volumes fit an int, so does every count, and only this rank's are
  // worked out. Else every member's, so that all raise or none does.
  // (Products that overflow do not fit either.)
  int64_t gathered = 0;
  bool fit = true;
  for (int64_t e : gextents) fit = fit && !__builtin_add_overflow(gathered, e, &gathered);
  for (int m = 0; m < p && fit; ++m) {
    int64_t in = 1, out = 1;
    for (size_t d = 0; d < sizes.size() && fit; ++d) {
      const int64_t dim = static_cast<int64_t>(d);
      const int64_t e = dim == gather_dim ? gextents[m] : sizes[d];
      const int64_t o = dim == scatter_dim                                ? numelem[m]
                        : dim == gather_dim && gather_dim != scatter_dim ? gathered
                                                                         : e;
      fit = !__builtin_mul_overflow(in, e, &in) && !__builtin_mul_overflow(out, o, &out);
    }
    fit = fit && in <= INT_MAX && out <= INT_MAX;
  }
  if (fit) return alltoall_counts(me, sizes, gather_dim, scatter_dim, gextents, numelem, what);
  AlltoallCounts k;
  for (int m = 0; m < p; ++m) {
    std::vector<int64_t> sizes_m = sizes.vec();
    sizes_m[gather_dim] = gextents[m];
    AlltoallCounts km =
        alltoall_counts(m, sizes_m, gather_dim, scatter_dim, gextents, numelem, what);
    if (m == me) k = std::move(km);
  }
  return k;
}

at::Tensor alltoall_dim(const Group& g, const at::Tensor& x, int64_t gather_dim,
                        int64_t scatter_dim, const std::vector<int64_t>& gextents,
                        const std::vector<int64_t>& numelem, const std::string& what,
                        const at::Tensor* into, const AlltoallCounts* known,
                        std::shared_ptr<const void> known_owner, const OutputSlot* reuse) {
  const int p = g.size, me = g.rank;
  AlltoallCounts computed;
  if (!known)
    computed = alltoall_checked_counts(me, x.sizes(), gather_dim, scatter_dim, gextents, numelem,
                                       what);
  const AlltoallCounts& k = known ? *known : computed;
  const at::Tensor c = x.contiguous();
  const at::Tensor send = send_blocks(c, scatter_dim, k.send_at, k.send_rows, k.scounts, k.sdispls);
  std::vector<int64_t> out_sizes = c.sizes().vec();
  out_sizes[scatter_dim] = numelem[me];
  // (The total is not an MPI count: checking it would raise on the one rank
  // whose receipts add up to more than an int while the others post.)
  if (gather_dim != scatter_dim) out_sizes[gather_dim] = total(gextents);
  // The caller's output receives the blocks in place when they follow each
  // other in it (outer 1), else from_blocks copies them there.
  at::Tensor recv = into && outer_volume(out_sizes, gather_dim) == 1
                        ? *into
                        : blocks_buffer(out_sizes, gather_dim, k.rtotal, c.options(), reuse);
  if (p == 1) {
    recv.view({-1}).copy_(send.view({-1}).narrow(0, k.sdispls[0], k.scounts[0]));
  } else {
    // Equal blocks everywhere: every member sends every other the same
    // number of rows of the same extents (numelem and gextents are agreed).
    const bool uniform =
        gather_dim != scatter_dim &&
        std::all_of(numelem.begin(), numelem.end(), [&](int64_t n) { return n == numelem[0]; }) &&
        std::all_of(gextents.begin(), gextents.end(), [&](int64_t e) { return e == gextents[0]; });
    // (Known counts are kept with their owner, computed ones as they are.)
    auto keep = [&] { keep_forever(std::move(computed), std::move(known_owner), c, send, recv); };
    alltoall_blocks(uniform, send.data_ptr(), k.scounts, k.sdispls, recv.data_ptr(), k.rcounts,
                    k.rdispls, mpi_datatype(c.scalar_type()), g.comm, what.c_str(), keep);
  }
  // The received blocks follow each other along gather_dim (equal axes:
  // along the axis, member i's rows being recv_rows[i]).
  return from_blocks(recv, gather_dim,
                     gather_dim != scatter_dim ? gextents : k.recv_rows, out_sizes, into, reuse);
}

}  // namespace partita::mpi::detail
