#include "partita/nn/repartition.hpp"

#include <ATen/core/grad_mode.h>

#include <memory>

#include "detail/box_view.hpp"
#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
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

  // How one piece travels, fixed once per plan: a contiguous run of its
  // tensor goes as plain elements at its offset (MPI's single-copy path);
  // a strided piece is addressed by a subarray datatype when small, and
  // packed into (or unpacked from) a contiguous buffer by partita when
  // large, as a hand-written exchange would: MPICH moves a large strided
  // datatype through its two-copy path, measured 1.4x slower than packing
  // plus a contiguous message at 16 MiB (docs/benchmarks.md).
  struct Piece {
    std::shared_ptr<const BoxType> type;  // null: contiguous, or staged
    int64_t offset = -1;                  // >= 0: a contiguous run at this offset
    bool staged = false;                  // packed / unpacked by partita
  };
  static constexpr int64_t kStageBytes = 64 << 10;
  static Piece piece(const Shape& full, const Box& box, MPI_Datatype element, size_t elsize,
                     bool alltoallw, const std::string& what) {
    Piece p;
    if (!alltoallw && box.size() > 0) {
      p.offset = contiguous_offset(full, box);
      if (p.offset >= 0) return p;
      if (box.size() * static_cast<int64_t>(elsize) >= kStageBytes) {
        p.staged = true;
        return p;
      }
    }
    p.type = std::make_shared<const BoxType>(full, box, element, what);
    return p;
  }
  using Pieces = std::vector<Piece>;

  // Moves `sends` slices of `src` into `recvs` slices of `dst` (both
  // contiguous), each as its Piece says. What stays on this rank is copied
  // while the messages travel (point-to-point) or by MPI itself
  // (alltoallw).
  void exchange(const std::vector<Transfer>& sends, const Pieces& sp,
                const std::vector<Transfer>& recvs, const Pieces& rp, const at::Tensor& src,
                at::Tensor& dst, const std::string& what) const {
    const int me = mpi::world_rank();
    const MPI_Datatype element = mpi_datatype(src.numel() ? src.scalar_type() : dst.scalar_type());
    if (how == RepartitionExchange::kAlltoallw) {
      const int n = P_union.size();
      std::vector<int> scounts(n, 0), rcounts(n, 0), displs(n, 0);
      std::vector<MPI_Datatype> st(n, element), rt(n, element);
      for (size_t i = 0; i < sends.size(); ++i) {
        scounts[union_rank.at(sends[i].partner)] = 1;
        st[union_rank.at(sends[i].partner)] = sp[i].type->get();
      }
      for (size_t i = 0; i < recvs.size(); ++i) {
        rcounts[union_rank.at(recvs[i].partner)] = 1;
        rt[union_rank.at(recvs[i].partner)] = rp[i].type->get();
      }
      MPI_Request req;
      PARTITA_MPI_CHECK(MPI_Ialltoallw(src.data_ptr(), scounts.data(), displs.data(), st.data(),
                                       dst.data_ptr(), rcounts.data(), displs.data(), rt.data(),
                                       P_union.comm(), &req));
      mpi::wait(req, what.c_str());
      return;
    }
    const int64_t elsize = static_cast<int64_t>(src.numel() ? src.element_size() : dst.element_size());
    auto at_offset = [&](const at::Tensor& t, int64_t offset) {
      return static_cast<char*>(t.data_ptr()) + offset * elsize;
    };
    std::vector<MPI_Request> reqs;
    reqs.reserve(sends.size() + recvs.size());
    std::vector<std::pair<size_t, at::Tensor>> landing;  // staged receives, unpacked after
    std::vector<at::Tensor> packed;                      // staged sends, alive until sent
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (recvs[i].partner == me || recvs[i].slice.size() == 0) continue;
      const int from = union_rank.at(recvs[i].partner);
      reqs.emplace_back();
      if (rp[i].staged) {
        landing.emplace_back(i, at::empty(recvs[i].slice.len, dst.options()));
        PARTITA_MPI_CHECK(MPI_Irecv(landing.back().second.data_ptr(),
                                    mpi_count(recvs[i].slice.size(), what), element, from, 0,
                                    P_union.comm(), &reqs.back()));
      } else if (rp[i].offset >= 0) {
        PARTITA_MPI_CHECK(MPI_Irecv(at_offset(dst, rp[i].offset),
                                    mpi_count(recvs[i].slice.size(), what), element, from, 0,
                                    P_union.comm(), &reqs.back()));
      } else {
        PARTITA_MPI_CHECK(MPI_Irecv(dst.data_ptr(), 1, rp[i].type->get(), from, 0, P_union.comm(),
                                    &reqs.back()));
      }
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i].partner == me || sends[i].slice.size() == 0) continue;
      const int to = union_rank.at(sends[i].partner);
      reqs.emplace_back();
      if (sp[i].staged) {
        packed.push_back(narrow_to(src, sends[i].slice).contiguous());
        PARTITA_MPI_CHECK(MPI_Isend(packed.back().data_ptr(), mpi_count(sends[i].slice.size(), what),
                                    element, to, 0, P_union.comm(), &reqs.back()));
      } else if (sp[i].offset >= 0) {
        PARTITA_MPI_CHECK(MPI_Isend(at_offset(src, sp[i].offset),
                                    mpi_count(sends[i].slice.size(), what), element, to, 0,
                                    P_union.comm(), &reqs.back()));
      } else {
        PARTITA_MPI_CHECK(MPI_Isend(src.data_ptr(), 1, sp[i].type->get(), to, 0, P_union.comm(),
                                    &reqs.back()));
      }
    }
    for (const auto& s : sends) {
      if (s.partner != me) continue;
      for (const auto& r : recvs)
        if (r.partner == me) narrow_to(dst, r.slice).copy_(narrow_to(src, s.slice));
    }
    mpi::wait_all(reqs, what.c_str());
    for (const auto& [i, buffer] : landing) narrow_to(dst, recvs[i].slice).copy_(buffer);
  }

  // A call's plan (plans made once, detail/plan_cache.hpp): the pieces, the
  // datatypes that address them in x's and y's shapes (the adjoint moves
  // the same pieces back with the same datatypes), the output's dtype.
  struct Compiled {
    RepartitionPlan p;
    Pieces send_pieces, recv_pieces;  // per p.sends (in x) / p.recvs (in y)
    at::ScalarType dtype = at::kFloat;
    Shape x_shape;
    bool covers_x = false;  // the pieces sent cover all of x (they tile it)
    bool attach = false;
  };
  PlanCache<Compiled> plans;

  std::shared_ptr<const Compiled> prepare(const at::Tensor& x) const {
    const auto headers = exchange_headers(P_union, make_header(x), name.c_str());
    if (auto hit = plans.find(headers)) return hit;
    check_inputs(name, P_union, P_x, headers);
    auto c = std::make_shared<Compiled>();
    c->p = plan(headers);
    c->dtype = header_of(P_union, headers, P_x.workers()[0]).scalar_type();
    c->x_shape = shape_of(x);
    c->attach = any_requires_grad(headers);
    int64_t sent = 0;
    for (const auto& s : c->p.sends) sent += s.slice.size();
    c->covers_x = sent == volume(c->x_shape);
    check_plan(P_union, name, claims(c->p, c->dtype));
    const MPI_Datatype element = mpi_datatype(c->dtype);
    const Shape y_shape = P_y.active() ? c->p.out_shape : Shape{0};
    const int me = mpi::world_rank();
    // Self-transfers are copied, not sent: nothing to plan, except that
    // alltoallw moves them too.
    const bool all = how == RepartitionExchange::kAlltoallw;
    const size_t elsize = c10::elementSize(c->dtype);
    for (const auto& s : c->p.sends)
      c->send_pieces.push_back(s.partner != me || all
                                   ? piece(c->x_shape, s.slice, element, elsize, all, name)
                                   : Piece{});
    for (const auto& r : c->p.recvs)
      c->recv_pieces.push_back(r.partner != me || all
                                   ? piece(y_shape, r.slice, element, elsize, all, name)
                                   : Piece{});
    plans.insert(headers, c);
    return c;
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (!P_union.active()) return x.clone();
    const auto c = prepare(x);
    const auto out_options = x.options().dtype(c->dtype).requires_grad(false);
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = P_y.active() ? at::empty(c->p.out_shape, out_options) : at::empty({0}, out_options);
      exchange(c->p.sends, c->send_pieces, c->p.recvs, c->recv_pieces, x.contiguous(), y, name);
    }
    const auto x_options = x.options().requires_grad(false);
    const std::string adjoint_name = name + " adjoint";
    auto self = shared_from_this();
    return with_adjoint(y, x, c->attach, name, [self, c, x_options, adjoint_name](at::Tensor gy) {
      // The reverse repartition: the same pieces, directions swapped.
      at::Tensor gx = c->covers_x ? at::empty(c->x_shape, x_options) : at::zeros(c->x_shape, x_options);
      self->exchange(c->p.recvs, c->recv_pieces, c->p.sends, c->send_pieces, gy.contiguous(), gx,
                     adjoint_name);
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
