#include "partita/nn/repartition.hpp"

#include <ATen/core/grad_mode.h>

#include <memory>

#include "detail/layer_checks.hpp"
#include "detail/team_comm.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

// A box of a tensor: per dimension, start and length.
struct Box {
  Shape start, len;
  bool empty() const {
    for (auto l : len)
      if (l <= 0) return true;
    return false;
  }
  at::Tensor of(const at::Tensor& t) const {
    at::Tensor v = t;
    for (size_t k = 0; k < start.size(); ++k) v = v.narrow(static_cast<int64_t>(k), start[k], len[k]);
    return v;
  }
};

Box intersect(const Box& a, const Box& b) {
  Box c{Shape(a.start.size()), Shape(a.start.size())};
  for (size_t k = 0; k < a.start.size(); ++k) {
    c.start[k] = std::max(a.start[k], b.start[k]);
    c.len[k] = std::min(a.start[k] + a.len[k], b.start[k] + b.len[k]) - c.start[k];
  }
  return c;
}

Box relative(const Box& b, const Box& origin) {
  Box r = b;
  for (size_t k = 0; k < b.start.size(); ++k) r.start[k] -= origin.start[k];
  return r;
}

// One entry of a send or receive list: the slice of the local tensor, its
// partner's rank in the union communicator (-1: this rank itself).
struct Piece {
  Box slice;
  int partner;
  int64_t size() const { return volume(slice.len); }
};

struct Plan {
  std::vector<Piece> sends, recvs;  // slices of the input / of the output
  Shape out_shape;                  // this rank's output (if in P_y)
  Shape in_shape;
};

Shape padded(const Shape& s, size_t d) {
  Shape out(d - s.size(), 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

// The autograd node keeps the layer alive (shared_from_this): backward may
// run after the module that made the output is gone.
struct RepartitionLayer : std::enable_shared_from_this<RepartitionLayer> {
  std::string name;
  mpi::Partition P_x, P_y, P_union;

  int union_rank(int worker) const {
    const auto& w = P_union.workers();
    return static_cast<int>(std::find(w.begin(), w.end(), worker) - w.begin());
  }

  // The global shape from the inputs' headers, the boxes of every P_x input
  // and P_y output, and this rank's lists. The same on every rank (or the
  // same ShapeError everywhere).
  Plan plan(const std::vector<Header>& headers) const {
    const int me = mpi::world_rank();
    const Header& first = header_of(P_union, headers, P_x.workers()[0]);
    const size_t d = static_cast<size_t>(first.ndim);
    if (d < P_x.shape().size() || d < P_y.shape().size())
      throw ShapeError(name + ": a tensor of " + std::to_string(d) +
                       " dimensions cannot be split over these partitions");
    const Shape sx = padded(P_x.shape(), d), sy = padded(P_y.shape(), d);
    std::vector<std::vector<int64_t>> ext(d);
    for (size_t k = 0; k < d; ++k) ext[k].assign(sx[k], -1);
    for (int r = 0; r < P_x.size(); ++r) {
      const int w = P_x.workers()[r];
      const Header& h = header_of(P_union, headers, w);
      if (static_cast<size_t>(h.ndim) != d)
        throw ShapeError(name + ": worker " + std::to_string(w) + " passed " +
                         std::to_string(h.ndim) + " dimensions, worker " +
                         std::to_string(P_x.workers()[0]) + " " + std::to_string(d));
      const Index ix = unravel(r, sx);
      for (size_t k = 0; k < d; ++k) {
        int64_t& e = ext[k][ix[k]];
        if (e >= 0 && e != h.dims[k])
          throw ShapeError(name + ": the inputs do not tile a tensor: worker " + std::to_string(w) +
                           " has extent " + std::to_string(h.dims[k]) + " in dimension " +
                           std::to_string(k) + ", others in its slab " + std::to_string(e));
        e = h.dims[k];
      }
    }
    Shape n(d, 0);
    std::vector<std::vector<int64_t>> offset(d);
    for (size_t k = 0; k < d; ++k)
      for (auto e : ext[k]) {
        offset[k].push_back(n[k]);
        n[k] += e;
      }
    auto x_box = [&](int r) {
      const Index ix = unravel(r, sx);
      Box b{Shape(d), Shape(d)};
      for (size_t k = 0; k < d; ++k) {
        b.start[k] = offset[k][ix[k]];
        b.len[k] = ext[k][ix[k]];
      }
      return b;
    };
    auto y_box = [&](int r) {
      const Index iy = unravel(r, sy);
      Box b{Shape(d), Shape(d)};
      for (size_t k = 0; k < d; ++k) {
        b.start[k] = local_start(n[k], sy[k], iy[k]);
        b.len[k] = local_length(n[k], sy[k], iy[k]);
      }
      return b;
    };
    Plan p;
    if (P_x.active()) {
      const Box mine = x_box(P_x.rank());
      p.in_shape = mine.len;
      for (int j = 0; j < P_y.size(); ++j) {
        const Box c = intersect(mine, y_box(j));
        if (c.empty()) continue;
        const int w = P_y.workers()[j];
        p.sends.push_back({relative(c, mine), w == me ? -1 : union_rank(w)});
      }
    }
    if (P_y.active()) {
      const Box mine = y_box(P_y.rank());
      p.out_shape = mine.len;
      for (int i = 0; i < P_x.size(); ++i) {
        const Box c = intersect(mine, x_box(i));
        if (c.empty()) continue;
        const int w = P_x.workers()[i];
        p.recvs.push_back({relative(c, mine), w == me ? -1 : union_rank(w)});
      }
    }
    return p;
  }

  // Moves `sends` slices of `src` into `recvs` slices of `dst`: local pieces
  // by copy, the others as non-blocking messages on the union communicator.
  // Every (sender, receiver) pair exchanges one box, so one tag serves.
  void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& recvs,
                const at::Tensor& src, at::Tensor& dst, const std::string& what) const {
    std::vector<MPI_Request> reqs;
    std::vector<at::Tensor> in_flight, landing;
    std::vector<const Piece*> landing_pieces;
    const MPI_Datatype type = mpi_datatype(src.defined() && src.numel() ? src.scalar_type()
                                                                        : dst.scalar_type());
    for (const auto& r : recvs) {
      if (r.partner < 0) continue;
      landing.push_back(at::empty(r.slice.len, dst.options()));
      landing_pieces.push_back(&r);
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Irecv(landing.back().data_ptr(), mpi_count(r.size(), what), type,
                                  r.partner, 0, P_union.comm(), &reqs.back()));
    }
    for (const auto& s : sends) {
      if (s.partner < 0) continue;
      in_flight.push_back(s.slice.of(src).contiguous());
      reqs.emplace_back();
      PARTITA_MPI_CHECK(MPI_Isend(in_flight.back().data_ptr(), mpi_count(s.size(), what), type,
                                  s.partner, 0, P_union.comm(), &reqs.back()));
    }
    // What stays on this rank is copied while the messages travel.
    for (const auto& s : sends) {
      if (s.partner >= 0) continue;
      for (const auto& r : recvs)
        if (r.partner < 0) r.slice.of(dst).copy_(s.slice.of(src));
    }
    mpi::wait_all(reqs, what.c_str());
    for (size_t i = 0; i < landing.size(); ++i) landing_pieces[i]->slice.of(dst).copy_(landing[i]);
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (!P_union.active()) return x.clone();
    const auto headers = exchange_headers(P_union, make_header(x), name.c_str());
    check_inputs(name, P_union, P_x, headers);
    const Plan p = plan(headers);
    const at::ScalarType dtype = header_of(P_union, headers, P_x.workers()[0]).scalar_type();
    const auto out_options = x.options().dtype(dtype).requires_grad(false);
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = P_y.active() ? at::empty(p.out_shape, out_options) : at::empty({0}, out_options);
      exchange(p.sends, p.recvs, x, y, name);
    }
    const auto x_options = x.options().requires_grad(false);
    const Shape x_shape = shape_of(x);
    const std::string adjoint_name = name + " adjoint";
    auto self = shared_from_this();
    return with_adjoint(y, x, any_requires_grad(headers), name,
                        [self, p, x_shape, x_options, adjoint_name](const at::Tensor& gy) {
                          // The reverse repartition: the same pieces, directions swapped.
                          at::Tensor gx = at::zeros(x_shape, x_options);
                          self->exchange(p.recvs, p.sends, gy, gx, adjoint_name);
                          return gx;
                        });
  }
};

}  // namespace detail

RepartitionImpl::RepartitionImpl(const mpi::Partition& P_x, const mpi::Partition& P_y) {
  auto l = std::make_shared<detail::RepartitionLayer>();
  l->name = "Repartition(P_x " + P_x.describe() + " -> P_y " + P_y.describe() + ")";
  l->P_x = P_x;
  l->P_y = P_y;
  l->P_union = P_x.create_partition_union(P_y);
  layer_ = l;
}

torch::Tensor RepartitionImpl::forward(const torch::Tensor& x) { return layer_->forward(x); }

}  // namespace partita::nn
