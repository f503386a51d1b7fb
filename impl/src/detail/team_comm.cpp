#include "detail/team_comm.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <climits>
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
    default: throw ShapeError("partita: dtype " + dtype_name(t) + " is not supported");
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
                     " elements exceed the MPI count limit (INT_MAX)");
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
                                                         : grads[0];
    at::Tensor gx;
    {
      at::NoGradGuard no_grad;
      gx = adjoint(g);
    }
    return {gx};
  }
  std::string name() const override { return label; }
};

}  // namespace

at::Tensor with_adjoint(at::Tensor out, const at::Tensor& x, bool attach,
                        const std::string& name, Adjoint adjoint) {
  if (!attach || !at::isFloatingType(out.scalar_type())) return out;
  auto node = std::shared_ptr<AdjointNode>(new AdjointNode(), torch::autograd::deleteNode);
  node->label = name;
  node->adjoint = std::move(adjoint);
  node->out_sizes = out.sizes().vec();
  node->out_options = out.options();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

namespace {
// Elements of one unit of length along `dim` (the product of the others).
int64_t row_volume(at::IntArrayRef sizes, int64_t dim) {
  int64_t v = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d)
    if (d != dim) v *= sizes[d];
  return v;
}
}  // namespace

// Both move the gathered/scattered dimension to the front so that every
// member's piece is one contiguous block, then move it back.
at::Tensor allgather_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                         const std::vector<int64_t>& lengths, const std::string& what) {
  const at::Tensor front = x.movedim(dim, 0).contiguous();
  const int64_t row = row_volume(x.sizes(), dim);
  int64_t total = 0;
  std::vector<int> counts, displs;
  for (int64_t len : lengths) {
    displs.push_back(mpi_count(total * row, what));
    counts.push_back(mpi_count(len * row, what));
    total += len;
  }
  std::vector<int64_t> out_sizes = front.sizes().vec();
  out_sizes[0] = total;
  at::Tensor out = at::empty(out_sizes, front.options());
  if (team.size() == 1) {
    out.copy_(front);
  } else if (out.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Iallgatherv(front.data_ptr(), mpi_count(front.numel(), what),
                                      mpi_datatype(front.scalar_type()), out.data_ptr(),
                                      counts.data(), displs.data(),
                                      mpi_datatype(out.scalar_type()), team.comm(), &req));
    wait(req, what.c_str());
  }
  return out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter_dim(const Partition& team, const at::Tensor& x, int64_t dim,
                              const std::vector<int64_t>& lengths, const std::string& what) {
  const at::Tensor front = x.movedim(dim, 0).contiguous();
  const int64_t row = row_volume(x.sizes(), dim);
  std::vector<int> counts;
  for (int64_t len : lengths) counts.push_back(mpi_count(len * row, what));
  std::vector<int64_t> out_sizes = front.sizes().vec();
  out_sizes[0] = lengths.at(team.rank());
  at::Tensor out = at::empty(out_sizes, front.options());
  if (team.size() == 1) {
    out.copy_(front);
  } else if (front.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Ireduce_scatter(front.data_ptr(), out.data_ptr(), counts.data(),
                                          mpi_datatype(front.scalar_type()),
                                          mpi_sum(front.scalar_type()), team.comm(), &req));
    wait(req, what.c_str());
  }
  return out.movedim(0, dim).contiguous();
}

}  // namespace partita::mpi::detail
