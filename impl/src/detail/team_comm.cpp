#include "detail/team_comm.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <climits>
#include <stdexcept>
#include <cstring>

#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

Header make_header(const at::Tensor& x) {
  Header h;
  h.dtype = static_cast<int64_t>(x.scalar_type());
  h.requires_grad = x.requires_grad() ? 1 : 0;
  if (!dtype_supported(x.scalar_type())) h.status = Header::kBadDtype;
  if (x.dim() > kMaxTensorDims) {
    h.status = Header::kTooManyDims;
    return h;
  }
  h.ndim = x.dim();
  for (int d = 0; d < x.dim(); ++d) h.dims[d] = x.size(d);
  return h;
}

namespace {
// Every count equals counts[0] and block i starts at i * counts[0].
bool regular_blocks(const std::vector<int>& counts, const std::vector<int>& displs) {
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] != counts[0] || displs[i] != static_cast<int>(i) * counts[0]) return false;
  return true;
}
}  // namespace

void iallgather_blocks(const void* send, int count, MPI_Datatype type, void* recv,
                       const std::vector<int>& counts, const std::vector<int>& displs,
                       MPI_Comm comm, MPI_Request* req) {
  if (!counts.empty() && regular_blocks(counts, displs))
    PARTITA_MPI_CHECK(MPI_Iallgather(send, count, type, recv, counts[0], type, comm, req));
  else
    PARTITA_MPI_CHECK(MPI_Iallgatherv(send, count, type, recv, counts.data(), displs.data(), type,
                                      comm, req));
}

void ialltoall_blocks(bool uniform, const void* send, const std::vector<int>& scounts,
                      const std::vector<int>& sdispls, void* recv, const std::vector<int>& rcounts,
                      const std::vector<int>& rdispls, MPI_Datatype type, MPI_Comm comm,
                      MPI_Request* req) {
  if (uniform) {
    if (scounts.empty() || !regular_blocks(scounts, sdispls) || !regular_blocks(rcounts, rdispls) ||
        scounts[0] != rcounts[0])
      throw std::logic_error("ialltoall_blocks: blocks said to be uniform are not");
    PARTITA_MPI_CHECK(MPI_Ialltoall(send, scounts[0], type, recv, rcounts[0], type, comm, req));
  } else {
    PARTITA_MPI_CHECK(MPI_Ialltoallv(send, scounts.data(), sdispls.data(), type, recv,
                                     rcounts.data(), rdispls.data(), type, comm, req));
  }
}

std::vector<Header> exchange_headers(const Partition& P, const Header& mine, const char* what) {
  if (!P.active()) return {};
  constexpr int n = sizeof(Header) / sizeof(int64_t);
  std::vector<Header> all(P.size());
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallgather(&mine, n, MPI_INT64_T, all.data(), n, MPI_INT64_T,
                                   P.comm(), &req));
  wait(req, what);
  return all;
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

int mpi_count(int64_t numel, const std::string& what) {
  if (numel > INT_MAX)
    throw ShapeError(what + ": " + std::to_string(numel) +
                     " elements exceed the MPI count limit (INT_MAX)", rule_code::kCountOverflow);
  return static_cast<int>(numel);
}

at::Tensor bcast_teams(const Partition& root_team, const Partition& member_team,
                       const at::Tensor& src, const Shape& out_shape,
                       const at::TensorOptions& out_options, const std::string& what) {
  std::vector<MPI_Request> reqs;
  at::Tensor send, out;
  if (root_team.active()) {
    send = src.contiguous();
    if (send.numel() > 0) {
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Ibcast(send.data_ptr(), mpi_count(send.numel(), what),
                                   mpi_datatype(send.scalar_type()), 0, root_team.comm(),
                                   &reqs.back()));
    }
  }
  const bool self = member_team.active() && root_team.active() &&
                    member_team.comm() == root_team.comm();
  if (member_team.active() && !self) {
    out = at::empty(out_shape, out_options);
    if (out.numel() > 0) {
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Ibcast(out.data_ptr(), mpi_count(out.numel(), what),
                                   mpi_datatype(out.scalar_type()), 0, member_team.comm(),
                                   &reqs.back()));
    }
  }
  if (self) out = src.clone();  // the root is its own receiver: not in place
  wait_all(reqs, what.c_str());
  return out;
}

at::Tensor reduce_teams(const Partition& root_team, const Partition& member_team,
                        const at::Tensor& contrib, const Shape& out_shape,
                        const at::TensorOptions& out_options, const std::string& what) {
  std::vector<MPI_Request> reqs;
  const bool self = member_team.active() && root_team.active() &&
                    member_team.comm() == root_team.comm();
  at::Tensor send, out;
  if (member_team.active()) send = contrib.contiguous();
  if (member_team.active() && !self && send.numel() > 0) {
    reqs.emplace_back();
    PARTITA_MPI_CHECK(MPI_Ireduce(send.data_ptr(), nullptr, mpi_count(send.numel(), what),
                                  mpi_datatype(send.scalar_type()), mpi_sum(send.scalar_type()),
                                  0, member_team.comm(), &reqs.back()));
  }
  if (root_team.active()) {
    // A root that contributes to its own team sends from its input into a
    // fresh output; one that does not reduces in place into zeros.
    out = self ? at::empty(out_shape, out_options) : at::zeros(out_shape, out_options);
    if (out.numel() > 0) {
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Ireduce(self ? send.data_ptr() : MPI_IN_PLACE, out.data_ptr(),
                                    mpi_count(out.numel(), what), mpi_datatype(out.scalar_type()),
                                    mpi_sum(out.scalar_type()), 0, root_team.comm(),
                                    &reqs.back()));
    }
  }
  wait_all(reqs, what.c_str());
  return out;
}

at::Tensor allreduce_team(const Partition& team, const at::Tensor& x, const std::string& what) {
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  if (team.size() > 1 && out.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, out.data_ptr(), mpi_count(out.numel(), what),
                                     mpi_datatype(out.scalar_type()), mpi_sum(out.scalar_type()),
                                     team.comm(), &req));
    wait(req, what.c_str());
  }
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
  if (!attach || !at::isFloatingType(out.scalar_type())) return out;
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

at::Tensor owned_contiguous(at::Tensor g) {
  const bool owned = g.use_count() == 1 && g.is_contiguous() && !g.is_view() &&
                     g.storage_offset() == 0 && g.storage().use_count() == 1 &&
                     static_cast<int64_t>(g.storage().nbytes()) == g.numel() * g.element_size();
  return owned ? g : g.clone(at::MemoryFormat::Contiguous);
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

// A contiguous tensor seen as [outer, length, inner] along `dim`: member r's
// piece of a gathered tensor is a contiguous [outer, len_r, inner] block of
// its own input, so the collective moves the pieces as they are, one after
// the other in team order. Only when outer > 1 (dim is not the first
// dimension) does a piece land in strided rows: then one copy (at::cat of
// the received pieces, or of the slices before a reduce-scatter) puts the
// rows in place. (An earlier version moved `dim` to the front and back, two
// transposing copies of the whole tensor: profiled as the cost of the
// ZeRO-3 Linear layers' weight gathers, docs/benchmarks.md.)
at::Tensor allgather_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                         const std::vector<int64_t>& lengths, const std::string& what) {
  const at::Tensor c = x.contiguous();
  const int64_t inner = inner_volume(c.sizes(), dim);
  const int64_t outer = outer_volume(c.sizes(), dim);
  int64_t total = 0;
  std::vector<int> counts, displs;
  for (int64_t len : lengths) {
    displs.push_back(mpi_count(total * outer * inner, what));
    counts.push_back(mpi_count(len * outer * inner, what));
    total += len;
  }
  std::vector<int64_t> out_sizes = c.sizes().vec();
  out_sizes[dim] = total;
  if (team.size() == 1) return c.clone();
  // Pieces in team order, each [outer, len_r, inner]: the output itself
  // when outer is 1.
  at::Tensor staged = at::empty({outer * total * inner}, c.options());
  if (staged.numel() > 0) {
    MPI_Request req;
    iallgather_blocks(c.data_ptr(), mpi_count(c.numel(), what), mpi_datatype(c.scalar_type()),
                      staged.data_ptr(), counts, displs, team.comm(), &req);
    wait(req, what.c_str());
  }
  if (outer == 1) return staged.view(out_sizes);
  std::vector<at::Tensor> pieces;
  for (size_t r = 0; r < lengths.size(); ++r)
    pieces.push_back(staged.narrow(0, displs[r], counts[r]).view({outer, lengths[r], inner}));
  return at::cat(pieces, 1).view(out_sizes);
}

at::Tensor reduce_scatter_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                              const std::vector<int64_t>& lengths, const std::string& what) {
  const at::Tensor c = x.contiguous();
  const int64_t inner = inner_volume(c.sizes(), dim);
  const int64_t outer = outer_volume(c.sizes(), dim);
  std::vector<int> counts;
  for (int64_t len : lengths) counts.push_back(mpi_count(len * outer * inner, what));
  std::vector<int64_t> out_sizes = c.sizes().vec();
  out_sizes[dim] = lengths.at(team.rank());
  if (team.size() == 1) return c.clone();
  // Each member's slice as one contiguous block, in team order.
  at::Tensor staged = c;
  if (outer > 1) {
    std::vector<at::Tensor> slices;
    int64_t start = 0;
    for (int64_t len : lengths) {
      slices.push_back(c.view({outer, c.size(dim), inner}).narrow(1, start, len).reshape({-1}));
      start += len;
    }
    staged = at::cat(slices);
  }
  at::Tensor out = at::empty(out_sizes, c.options());
  if (c.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Ireduce_scatter(staged.data_ptr(), out.data_ptr(), counts.data(),
                                          mpi_datatype(c.scalar_type()),
                                          mpi_sum(c.scalar_type()), team.comm(), &req));
    wait(req, what.c_str());
  }
  return out;
}

}  // namespace partita::mpi::detail
