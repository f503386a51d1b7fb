#include "partita/nn/repartition.hpp"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "detail/agreement.hpp"
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
  std::string name, adjoint_name;
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

  // How one piece travels, fixed once per plan. Point-to-point: as its
  // BoxRoute says (a contiguous run at its offset, or packed by partita's
  // own memcpy loops; at 4 KiB MPICH's datatype engine plus a torch view and
  // copy for the rank's own piece were most of the call, docs/benchmarks.md).
  // Alltoallw: every piece is addressed by a subarray datatype.
  struct Piece : BoxRoute {
    std::shared_ptr<const BoxType> type;  // alltoallw only
  };
  static Piece piece(const Shape& full, const Box& box, MPI_Datatype element, int64_t elsize,
                     bool alltoallw, const std::string& what) {
    Piece p;
    if (alltoallw)
      p.type = std::make_shared<const BoxType>(full, box, element, what);
    else
      static_cast<BoxRoute&>(p) = box_route(full, box, elsize);
    return p;
  }
  using Pieces = std::vector<Piece>;

  // One direction of the exchange: `sends` slices of the source into
  // `recvs` slices of the destination, each as its Piece says, and the
  // rank's own piece copied while the messages travel (point-to-point) or
  // moved by MPI itself (alltoallw).
  struct Direction {
    const std::vector<Transfer>* sends = nullptr;
    const Pieces* sp = nullptr;
    const std::vector<Transfer>* recvs = nullptr;
    const Pieces* rp = nullptr;
    const BoxCopy* self = nullptr;  // the own piece, source box to destination box
    int64_t packed_bytes = 0, landing_bytes = 0;  // strided sends / receives, in all
  };

  void exchange(const Direction& dir, const at::Tensor& src, at::Tensor& dst,
                const std::string& what) const {
    const auto& sends = *dir.sends;
    const auto& recvs = *dir.recvs;
    const auto& sp = *dir.sp;
    const auto& rp = *dir.rp;
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
      auto keep = [&] {
        mpi::keep_forever(std::move(scounts), std::move(rcounts), std::move(displs), std::move(st),
                          std::move(rt), src, dst);
      };
      mpi::call(
          what.c_str(),
          [&] {
            PARTITA_MPI_CHECK(MPI_Alltoallw(src.data_ptr(), scounts.data(), displs.data(), st.data(),
                                            dst.data_ptr(), rcounts.data(), displs.data(), rt.data(),
                                            P_union.comm()));
          },
          [&](MPI_Request* req) {
            PARTITA_MPI_CHECK(MPI_Ialltoallw(src.data_ptr(), scounts.data(), displs.data(), st.data(),
                                             dst.data_ptr(), rcounts.data(), displs.data(), rt.data(),
                                             P_union.comm(), req));
          },
          keep);
      return;
    }
    const int64_t elsize = static_cast<int64_t>(src.numel() ? src.element_size() : dst.element_size());
    char* const src_data = static_cast<char*>(src.data_ptr());
    char* const dst_data = static_cast<char*>(dst.data_ptr());
    Staging packed(dir.packed_bytes), landing(dir.landing_bytes);
    std::vector<MPI_Request> reqs;
    reqs.reserve(sends.size() + recvs.size());
    std::vector<std::pair<size_t, char*>> landed;  // strided receives, unpacked after
    char* next = landing.data;
    for (size_t i = 0; i < recvs.size(); ++i) {
      const int64_t n = recvs[i].slice.size();
      if (recvs[i].partner == me || n == 0) continue;
      const int from = union_rank.at(recvs[i].partner);
      char* at = next;
      if (!rp[i].strided()) {
        at = dst_data + rp[i].offset * elsize;
      } else {
        next += n * elsize;
        landed.emplace_back(i, at);
      }
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Irecv(at, mpi_count(n, what), element, from, 0, P_union.comm(),
                                  &reqs.back()));
    }
    next = packed.data;
    for (size_t i = 0; i < sends.size(); ++i) {
      const int64_t n = sends[i].slice.size();
      if (sends[i].partner == me || n == 0) continue;
      const int to = union_rank.at(sends[i].partner);
      char* at = next;
      if (!sp[i].strided()) {
        at = src_data + sp[i].offset * elsize;
      } else {
        next += n * elsize;
        sp[i].pack(src_data, at);
      }
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Isend(at, mpi_count(n, what), element, to, 0, P_union.comm(),
                                  &reqs.back()));
    }
    if (dir.self) (*dir.self)(src_data, dst_data);
    // Given up, the messages may still arrive in (or leave from) the
    // tensors and the staging buffers: they are kept.
    auto keep = [&] { mpi::keep_forever(std::move(packed), std::move(landing), src, dst); };
    mpi::wait_all(reqs, what.c_str(), keep);
    for (const auto& [i, buffer] : landed) rp[i].unpack(buffer, dst_data);
  }

  // A call's plan (plans made once, detail/plan_cache.hpp): the pieces, the
  // datatypes that address them in x's and y's shapes (the adjoint moves
  // the same pieces back with the same datatypes), the output's dtype.
  struct Compiled {
    RepartitionPlan p;
    Pieces send_pieces, recv_pieces;  // per p.sends (in x) / p.recvs (in y)
    BoxCopy self_x_to_y, self_y_to_x;  // the rank's own piece (point-to-point)
    bool has_self = false;
    int64_t strided_send_bytes = 0, strided_recv_bytes = 0;  // staged, in x / in y
    at::ScalarType dtype = at::kFloat;
    Shape x_shape;
    bool covers_x = false;  // the pieces sent cover all of x (they tile it)
    bool attach = false;
    Direction forward() const {
      return {&p.sends, &send_pieces, &p.recvs, &recv_pieces, has_self ? &self_x_to_y : nullptr,
              strided_send_bytes, strided_recv_bytes};
    }
    Direction adjoint() const {  // the same pieces, directions swapped
      return {&p.recvs, &recv_pieces, &p.sends, &send_pieces, has_self ? &self_y_to_x : nullptr,
              strided_recv_bytes, strided_send_bytes};
    }
  };
  PlanCache<Compiled> plans;

  std::shared_ptr<const Compiled> prepare(const at::Tensor& x) const {
    std::vector<Header> headers;
    if (auto hit = plans.lookup(P_union, make_header(x), name, headers)) return hit;
    check_inputs(name, P_union, P_x, headers);
    auto c = std::make_shared<Compiled>();
    c->p = plan(headers);
    c->dtype = header_of(P_union, headers, P_x.workers()[0]).scalar_type();
    c->x_shape = shape_of(x);
    c->attach = agree_attach(name, P_union, headers);
    int64_t sent = 0;
    for (const auto& s : c->p.sends) sent += s.slice.size();
    c->covers_x = sent == volume(c->x_shape);
    const Shape y_shape = P_y.active() ? c->p.out_shape : Shape{0};
    const int me = mpi::world_rank();
    const bool all = how == RepartitionExchange::kAlltoallw;
    // Every count this plan hands MPI, agreed before any message is posted
    // (issue 35 item 5): point-to-point, each message's elements;
    // alltoallw, every extent of the subarray datatypes, which address
    // every piece, the rank's own included.
    int64_t largest = 0;
    for (const auto* list : {&c->p.sends, &c->p.recvs})
      for (const auto& t : *list)
        if (t.partner != me && !all) largest = std::max(largest, t.slice.size());
    if (all)
      for (const Shape& s : {std::cref(c->x_shape), std::cref(y_shape)})
        for (int64_t extent : s) largest = std::max(largest, extent);
    check_counts(P_union, name, largest);
    check_plan(P_union, name, claims(c->p, c->dtype));
    const MPI_Datatype element = mpi_datatype(c->dtype);
    // Self-transfers are copied, not sent: nothing to plan but the copy,
    // except that alltoallw moves them too.
    const int64_t elsize = static_cast<int64_t>(c10::elementSize(c->dtype));
    const Box* self_send = nullptr;
    const Box* self_recv = nullptr;
    for (const auto& s : c->p.sends) {
      if (s.partner == me && !all) self_send = &s.slice;
      c->send_pieces.push_back(s.partner != me || all
                                   ? piece(c->x_shape, s.slice, element, elsize, all, name)
                                   : Piece{});
      if (s.partner != me && c->send_pieces.back().strided())
        c->strided_send_bytes += s.slice.size() * elsize;
    }
    for (const auto& r : c->p.recvs) {
      if (r.partner == me && !all) self_recv = &r.slice;
      c->recv_pieces.push_back(r.partner != me || all
                                   ? piece(y_shape, r.slice, element, elsize, all, name)
                                   : Piece{});
      if (r.partner != me && c->recv_pieces.back().strided())
        c->strided_recv_bytes += r.slice.size() * elsize;
    }
    if (self_send && self_recv && self_send->size() > 0) {
      c->has_self = true;
      c->self_x_to_y = box_copy(c->x_shape, *self_send, y_shape, *self_recv, elsize);
      c->self_y_to_x = box_copy(y_shape, *self_recv, c->x_shape, *self_send, elsize);
    }
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
      exchange(c->forward(), x.contiguous(), y, name);
    }
    const auto x_options = x.options().requires_grad(false);
    auto self = shared_from_this();
    return with_adjoint(y, x, c->attach, name, [self, c, x_options](at::Tensor gy) {
      // The reverse repartition: the same pieces, directions swapped.
      at::Tensor gx = c->covers_x ? at::empty(c->x_shape, x_options) : at::zeros(c->x_shape, x_options);
      self->exchange(c->adjoint(), gy.contiguous(), gx, self->adjoint_name);
      return gx;
    });
  }
};

}  // namespace detail

namespace functional {

RepartitionPlan::RepartitionPlan(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 RepartitionExchange how, Shapes shapes) {
  auto l = std::make_shared<detail::RepartitionLayer>();
  l->plans.set_static_shapes(shapes == Shapes::kStatic);
  l->how = how;
  l->name = "Repartition(P_x " + P_x.describe() + " -> P_y " + P_y.describe() + ")";
  l->adjoint_name = l->name + " adjoint";
  l->P_x = P_x;
  l->P_y = P_y;
  l->P_union = P_x.create_partition_union(P_y);
  l->union_rank.assign(mpi::world_size(), -1);
  for (int u = 0; u < l->P_union.size(); ++u) l->union_rank[l->P_union.workers()[u]] = u;
  // Every worker must move the data the same way (a collective on some and
  // point-to-point messages on others wait for each other for ever).
  if (l->P_union.active()) {
    mpi::detail::Fingerprint f;
    f.add(static_cast<int64_t>(how));
    mpi::detail::checked(l->P_union.comm(), l->name.c_str(), f, [] {}, "exchanges (RepartitionExchange)");
  }
  layer_ = l;
}

at::Tensor repartition(const at::Tensor& x, const RepartitionPlan& plan) {
  return plan.layer_->forward(x);
}

}  // namespace functional

RepartitionImpl::RepartitionImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 RepartitionExchange how, Shapes shapes)
    : plan_(P_x, P_y, how, shapes) {}
torch::Tensor RepartitionImpl::forward(const torch::Tensor& x) {
  return functional::repartition(x, plan_);
}

}  // namespace partita::nn
