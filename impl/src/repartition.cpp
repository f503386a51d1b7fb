#include "partita/nn/repartition.hpp"

#include <ATen/core/grad_mode.h>

#include <memory>

#include "detail/box_view.hpp"
#include "detail/layer_checks.hpp"
#include "detail/plan_check.hpp"
#include "detail/team_comm.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/tiling.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

// The autograd node keeps the layer alive (shared_from_this): backward may
// run after the module that made the output is gone.
struct RepartitionLayer : std::enable_shared_from_this<RepartitionLayer> {
  std::string name;
  mpi::Partition P_x, P_y, P_union;
  std::vector<int> union_rank;  // world rank -> rank in P_union (-1: not in it)
  RepartitionExchange how = RepartitionExchange::kPointToPoint;

  // This rank's (slice, size, partner) lists, from the global shape the
  // inputs' headers tile: the same arithmetic on every rank, so either every
  // rank plans or every rank throws the same ShapeError.
  RepartitionPlan plan(const std::vector<Header>& headers) const {
    const size_t d = static_cast<size_t>(header_of(P_union, headers, P_x.workers()[0]).ndim);
    if (d < P_x.shape().size() || d < P_y.shape().size())
      throw ShapeError(name + ": a tensor of " + std::to_string(d) +
                       " dimensions cannot be split over these partitions", rule_code::kTilingDims);
    std::vector<Shape> pieces;
    for (int w : P_x.workers()) pieces.push_back(header_of(P_union, headers, w).shape());
    const Tiling t = tile(name, padded_shape(P_x.shape(), d), pieces, P_x.workers());
    return plan_repartition(t, P_x.workers(), padded_shape(P_y.shape(), d), P_y.workers(),
                            mpi::world_rank());
  }

  // Checked mode: per partner, the pieces this rank sends and receives.
  std::vector<PeerClaim> claims(const RepartitionPlan& p, at::ScalarType dtype) const {
    std::vector<PeerClaim> c(P_union.size());
    const int me = mpi::world_rank();
    for (const auto& s : p.sends) {
      if (s.partner == me) continue;
      auto& claim = c.at(union_rank.at(s.partner));
      claim.send += s.slice.size();
      claim.messages += 1;
      claim.dtype = static_cast<int64_t>(dtype);
    }
    for (const auto& r : p.recvs) {
      if (r.partner == me) continue;
      auto& claim = c.at(union_rank.at(r.partner));
      claim.recv += r.slice.size();
      claim.messages += 1;
      claim.dtype = static_cast<int64_t>(dtype);
    }
    return c;
  }

  // Moves `sends` slices of `src` into `recvs` slices of `dst` (both
  // contiguous). Messages address the slices in place through subarray
  // datatypes: nothing is packed or unpacked by partita. What stays on this
  // rank is copied while the messages travel (point-to-point) or by MPI
  // itself (alltoallw).
  void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                const at::Tensor& src, at::Tensor& dst, const std::string& what) const {
    const int me = mpi::world_rank();
    const MPI_Datatype element = mpi_datatype(src.numel() ? src.scalar_type() : dst.scalar_type());
    const Shape src_shape = shape_of(src), dst_shape = shape_of(dst);
    std::vector<BoxType> types;
    types.reserve(sends.size() + recvs.size());
    if (how == RepartitionExchange::kAlltoallw) {
      const int n = P_union.size();
      std::vector<int> scounts(n, 0), rcounts(n, 0), displs(n, 0);
      std::vector<MPI_Datatype> stypes(n, element), rtypes(n, element);
      for (const auto& s : sends) {
        types.emplace_back(src_shape, s.slice, element, what);
        scounts[union_rank.at(s.partner)] = 1;
        stypes[union_rank.at(s.partner)] = types.back().get();
      }
      for (const auto& r : recvs) {
        types.emplace_back(dst_shape, r.slice, element, what);
        rcounts[union_rank.at(r.partner)] = 1;
        rtypes[union_rank.at(r.partner)] = types.back().get();
      }
      MPI_Request req;
      PARTITA_MPI_CHECK(MPI_Ialltoallw(src.data_ptr(), scounts.data(), displs.data(), stypes.data(),
                                       dst.data_ptr(), rcounts.data(), displs.data(),
                                       rtypes.data(), P_union.comm(), &req));
      mpi::wait(req, what.c_str());
      return;
    }
    std::vector<MPI_Request> reqs;
    for (const auto& r : recvs) {
      if (r.partner == me) continue;
      types.emplace_back(dst_shape, r.slice, element, what);
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Irecv(dst.data_ptr(), 1, types.back().get(), union_rank.at(r.partner),
                                  0, P_union.comm(), &reqs.back()));
    }
    for (const auto& s : sends) {
      if (s.partner == me) continue;
      types.emplace_back(src_shape, s.slice, element, what);
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Isend(src.data_ptr(), 1, types.back().get(), union_rank.at(s.partner),
                                  0, P_union.comm(), &reqs.back()));
    }
    for (const auto& s : sends) {
      if (s.partner != me) continue;
      for (const auto& r : recvs)
        if (r.partner == me) narrow_to(dst, r.slice).copy_(narrow_to(src, s.slice));
    }
    mpi::wait_all(reqs, what.c_str());
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (!P_union.active()) return x.clone();
    const auto headers = exchange_headers(P_union, make_header(x), name.c_str());
    check_inputs(name, P_union, P_x, headers);
    const RepartitionPlan p = plan(headers);
    const at::ScalarType dtype = header_of(P_union, headers, P_x.workers()[0]).scalar_type();
    check_plan(P_union, name, claims(p, dtype));
    const auto out_options = x.options().dtype(dtype).requires_grad(false);
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = P_y.active() ? at::empty(p.out_shape, out_options) : at::empty({0}, out_options);
      exchange(p.sends, p.recvs, x.contiguous(), y, name);
    }
    const auto x_options = x.options().requires_grad(false);
    const Shape x_shape = shape_of(x);
    const std::string adjoint_name = name + " adjoint";
    auto self = shared_from_this();
    return with_adjoint(y, x, any_requires_grad(headers), name,
                        [self, p, x_shape, x_options, adjoint_name](const at::Tensor& gy) {
                          // The reverse repartition: the same pieces, directions swapped.
                          at::Tensor gx = at::zeros(x_shape, x_options);
                          self->exchange(p.recvs, p.sends, gy.contiguous(), gx, adjoint_name);
                          return gx;
                        });
  }
};

}  // namespace detail

namespace functional {

RepartitionPlan::RepartitionPlan(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 RepartitionExchange how) {
  auto l = std::make_shared<detail::RepartitionLayer>();
  l->how = how;
  l->name = "Repartition(P_x " + P_x.describe() + " -> P_y " + P_y.describe() + ")";
  l->P_x = P_x;
  l->P_y = P_y;
  l->P_union = P_x.create_partition_union(P_y);
  l->union_rank.assign(mpi::world_size(), -1);
  for (int u = 0; u < l->P_union.size(); ++u) l->union_rank[l->P_union.workers()[u]] = u;
  layer_ = l;
}

at::Tensor repartition(const at::Tensor& x, const RepartitionPlan& plan) {
  return plan.layer_->forward(x);
}

}  // namespace functional

RepartitionImpl::RepartitionImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 RepartitionExchange how)
    : plan_(P_x, P_y, how) {}
torch::Tensor RepartitionImpl::forward(const torch::Tensor& x) {
  return functional::repartition(x, plan_);
}

}  // namespace partita::nn
