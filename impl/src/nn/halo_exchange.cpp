#include "partita/nn/halo_exchange.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

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

// The exchange along one tensor dimension k, as this rank sees it. Boxes
// are in window coordinates. Along k: the ghosts [0, l) and [l+b, l+b+r),
// the bulk that fills the lower neighbour's right ghost [l, l+r) and the
// upper neighbour's left ghost [b, l+b). Along the dimensions exchanged
// before k: the bulk plus every ghost filled by then (those with a
// neighbour), which carries the corners; along the later ones: the bulk.
struct Step {
  int lo = -1, hi = -1;             // neighbours' ranks in P_x (-1: boundary)
  int tag_down = 0, tag_up = 0;     // messages travelling to lo / to hi
  Box ghost_lo, ghost_hi, for_lo, for_hi;
  // How each of the four boxes of this rank's window travels (box_view.hpp:
  // a contiguous run in place, a strided box packed), planned once; nothing
  // travels where the box is empty or has no partner.
  // The adjoint zeroes each ghost box and adds each arrived gradient (a
  // buffer of the box's shape) into its bulk box through the routes' unpack.
  BoxRoute r_ghost_lo, r_ghost_hi, r_for_lo, r_for_hi;
  // Staging bytes per call: the forward's strided boxes; the adjoint's
  // arrivals (always landed, since they are added) and strided ghosts.
  int64_t forward_staged = 0, adjoint_staged = 0;
};

// Everything a call needs once the headers are known (plans made once,
// detail/plan_cache.hpp).
struct HaloPlan {
  std::vector<Step> steps;
  bool attach = false;  // some rank's input requires grad
};

struct HaloLayer : std::enable_shared_from_this<HaloLayer> {
  std::string name, adjoint_name;
  mpi::Partition P_x;
  Shape left, right;
  PlanCache<HaloPlan> plans;

  // This rank's steps, in forward order.
  std::vector<Step> plan(const std::vector<Header>& headers) const {
    const size_t d = static_cast<size_t>(headers[0].ndim);
    if (d < P_x.shape().size())
      throw ShapeError(name + ": a tensor of " + std::to_string(d) +
                       " dimensions cannot be split over P_x " + P_x.describe(), rule_code::kTilingDims);
    const Shape grid = padded_shape(P_x.shape(), d);
    std::vector<Shape> windows;
    for (const auto& h : headers) windows.push_back(h.shape());
    const Tiling t = halo_tiling(name, grid, windows, P_x.workers(), left, right);
    const Index me = unravel(P_x.rank(), grid);
    const Shape bulk = t.length(me);
    const Shape window = headers[static_cast<size_t>(P_x.rank())].shape();
    const int64_t elsize = static_cast<int64_t>(c10::elementSize(headers[0].scalar_type()));
    std::vector<Step> steps;
    for (size_t k = 0; k < d; ++k) {
      const int64_t l = left[k], r = right[k], b = bulk[k];
      if (grid[k] == 1 || (l == 0 && r == 0)) continue;
      Step s;
      Index lo = me, hi = me;
      --lo[k];
      ++hi[k];
      if (me[k] > 0) s.lo = static_cast<int>(ravel(lo, grid));
      if (me[k] + 1 < grid[k]) s.hi = static_cast<int>(ravel(hi, grid));
      s.tag_down = 2 * static_cast<int>(k) + 1;
      s.tag_up = 2 * static_cast<int>(k);
      Box base{Shape(d), Shape(d)};
      for (size_t e = 0; e < d; ++e) {
        base.start[e] = left[e];
        base.len[e] = bulk[e];
        if (e < k) {
          if (me[e] > 0) {
            base.start[e] = 0;
            base.len[e] += left[e];
          }
          if (me[e] + 1 < grid[e]) base.len[e] += right[e];
        }
      }
      auto along_k = [&](int64_t start, int64_t len) {
        Box box = base;
        box.start[k] = start;
        box.len[k] = len;
        return box;
      };
      s.ghost_lo = along_k(0, l);
      s.ghost_hi = along_k(l + b, r);
      s.for_lo = along_k(l, r);
      s.for_hi = along_k(b, l);
      // Both partners see the same box extents (one slab, one boundary
      // status), so an empty box (a width or an extent of zero) is skipped
      // on both sides.
      auto route = [&](int partner, const Box& box) {
        return partner < 0 ? BoxRoute{} : box_route(window, box, elsize);
      };
      s.r_ghost_lo = route(s.lo, s.ghost_lo);
      s.r_ghost_hi = route(s.hi, s.ghost_hi);
      s.r_for_lo = route(s.lo, s.for_lo);
      s.r_for_hi = route(s.hi, s.for_hi);
      auto strided = [&](const BoxRoute& r) { return r.strided() ? r.elements * elsize : 0; };
      s.forward_staged = strided(s.r_ghost_lo) + strided(s.r_ghost_hi) + strided(s.r_for_lo) +
                         strided(s.r_for_hi);
      s.adjoint_staged = (s.r_for_lo.elements + s.r_for_hi.elements) * elsize +
                         strided(s.r_ghost_lo) + strided(s.r_ghost_hi);
      steps.push_back(std::move(s));
    }
    return steps;
  }

  // Checked mode: per neighbour, the boxes this rank sends and receives in
  // the forward (the adjoint swaps them).
  std::vector<PeerClaim> claims(const std::vector<Step>& steps, at::ScalarType dtype) const {
    std::vector<PeerClaim> c(P_x.size());
    auto add = [&](int partner, const Box& out, const Box& in) {
      if (partner < 0) return;
      auto& claim = c.at(partner);
      if (out.size() > 0) ++claim.messages;
      if (in.size() > 0) ++claim.messages;
      claim.send += out.size();
      claim.recv += in.size();
      claim.dtype = static_cast<int64_t>(dtype);
    };
    for (const auto& s : steps) {
      add(s.lo, s.for_lo, s.ghost_lo);
      add(s.hi, s.for_hi, s.ghost_hi);
    }
    return c;
  }

  // One step of the forward (fill the ghosts) or of the adjoint (send the
  // ghosts' gradients back, add them into the bulk, zero the ghosts), on `t`
  // (contiguous, of the window's shape, the plan's dtype) in place. Each box
  // travels as its route says; the adjoint's arrivals always land in a
  // buffer, since they are added rather than stored.
  void step(const Step& s, at::Tensor& t, bool adjoint, const std::string& what) const {
    const MPI_Datatype element = mpi_datatype(t.scalar_type());
    const int64_t elsize = static_cast<int64_t>(t.element_size());
    char* const data = static_cast<char*>(t.data_ptr());
    Staging staging(adjoint ? s.adjoint_staged : s.forward_staged);
    char* next = staging.data;
    MPI_Request reqs[4];
    int n = 0;
    // What arrived in the staging buffer: forward, a strided ghost to
    // unpack; adjoint, a gradient to add into its bulk box.
    std::pair<const char*, const BoxCopy*> landed[2];
    int n_landed = 0;
    auto post_recv = [&](int from, int tag, const BoxRoute& r) {
      if (!r.elements) return;
      char* at = next;  // a staging slot, or the contiguous run itself
      if (adjoint || r.strided()) {
        next += r.elements * elsize;
        landed[n_landed++] = {at, &r.unpack};
      } else {
        at = data + r.offset * elsize;
      }
      PARTITA_MPI_CHECK(MPI_Irecv(at, mpi_count(r.elements, what), element, from, tag,
                                  P_x.comm(), &reqs[n++]));
    };
    auto post_send = [&](int to, int tag, const BoxRoute& r) {
      if (!r.elements) return;
      char* at = next;
      if (r.strided()) {
        next += r.elements * elsize;
        r.pack(data, at);
      } else {
        at = data + r.offset * elsize;
      }
      PARTITA_MPI_CHECK(MPI_Isend(at, mpi_count(r.elements, what), element, to, tag, P_x.comm(),
                                  &reqs[n++]));
    };
    // Forward: bulk travels out, ghosts land. Adjoint: ghosts travel back
    // and are added into the bulk they came from.
    if (!adjoint) {
      post_recv(s.lo, s.tag_up, s.r_ghost_lo);
      post_recv(s.hi, s.tag_down, s.r_ghost_hi);
      post_send(s.lo, s.tag_down, s.r_for_lo);
      post_send(s.hi, s.tag_up, s.r_for_hi);
    } else {
      post_recv(s.lo, s.tag_up, s.r_for_lo);
      post_recv(s.hi, s.tag_down, s.r_for_hi);
      post_send(s.lo, s.tag_down, s.r_ghost_lo);
      post_send(s.hi, s.tag_up, s.r_ghost_hi);
    }
    // Given up, the messages may still arrive in (or leave from) the tensor
    // and the staging buffer: both are kept.
    auto keep = [&] { mpi::keep_forever(std::move(staging), t); };
    mpi::wait_all(n, reqs, what.c_str(), keep);
    if (!adjoint) {
      for (int i = 0; i < n_landed; ++i) (*landed[i].second)(landed[i].first, data);
      return;
    }
    // The ghosts' gradients went back: zero them, then add what arrived
    // into the bulk boxes it belongs to.
    if (s.r_ghost_lo.elements) box_zero(s.r_ghost_lo.unpack, data);
    if (s.r_ghost_hi.elements) box_zero(s.r_ghost_hi.unpack, data);
    for (int i = 0; i < n_landed; ++i)
      box_add(*landed[i].second, landed[i].first, data, t.scalar_type());
  }

  // The headers of this call and the plan made from them (made, checked and
  // cached on the first call with these headers).
  std::shared_ptr<const HaloPlan> prepare(const Header& mine) const {
    std::vector<Header> headers;
    if (auto hit = plans.lookup(P_x, mine, name, headers)) return hit;
    check_inputs(name, P_x, P_x, headers);
    auto p = std::make_shared<HaloPlan>();
    p->steps = plan(headers);
    p->attach = agree_attach(name, P_x, headers);
    // Every message's count, agreed before any is posted (issue 35 item 5);
    // the adjoint moves the same boxes the other way.
    int64_t largest = 0;
    for (const auto& s : p->steps)
      for (const BoxRoute* r : {&s.r_ghost_lo, &s.r_ghost_hi, &s.r_for_lo, &s.r_for_hi})
        largest = std::max(largest, r->elements);
    check_counts(P_x, name, largest);
    check_plan(P_x, name, claims(p->steps, headers[0].scalar_type()));
    plans.insert(headers, p);
    return p;
  }

  // The adjoint, on a gradient of the window's shape: the steps in reverse,
  // in place on `g` when the autograd engine handed over the only
  // reference to a contiguous gradient, otherwise on a copy.
  Adjoint adjoint(const std::shared_ptr<const HaloPlan>& p) const {
    auto self = shared_from_this();
    return [self, p](at::Tensor gy) {
      at::Tensor g = owned_contiguous(std::move(gy));
      for (auto s = p->steps.rbegin(); s != p->steps.rend(); ++s)
        self->step(*s, g, true, self->adjoint_name);
      return g;
    };
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (!P_x.active()) return x.clone();
    const auto p = prepare(make_header(x));
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = contiguous_copy(x);
      for (const auto& s : p->steps) step(s, y, false, name);
    }
    // The adjoint's closure is only built when a node is attached.
    if (!p->attach) return y;
    return with_adjoint(y, x, true, name, adjoint(p));
  }

  // DistDL's form: the ghosts of `x` itself are filled, and `x` (its
  // version bumped, its history rebased onto the exchange) is returned.
  at::Tensor forward_in_place(const at::Tensor& x) const {
    if (!P_x.active()) return x;
    Header mine = make_header(x);
    // As autograd's own in-place rules, on every rank before anything
    // moves: with grad mode on, neither a leaf that requires grad nor a
    // view of one may change in place, nor a view autograd cannot rebase
    // (the node is attached to x's history); an inference tensor changes
    // in place only under InferenceMode.
    if (mine.status == Header::kOk) {
      const bool grad = at::GradMode::is_enabled();
      const bool leaf = grad && x.requires_grad() && (x.is_leaf() || (x.is_view() && x._base().is_leaf()));
      const auto* view = x.is_view() ? torch::autograd::impl::get_view_autograd_meta(x) : nullptr;
      const bool unrebasable = grad && view && view->has_bw_view() &&
                               view->get_creation_meta() != torch::autograd::CreationMeta::DEFAULT;
      if (leaf) mine.status = Header::kInPlaceLeaf;
      else if (x.is_inference() && !c10::InferenceMode::is_enabled()) mine.status = Header::kInPlaceInference;
      else if (unrebasable) mine.status = Header::kInPlaceView;
    }
    const auto p = prepare(mine);
    {
      at::NoGradGuard no_grad;
      if (x.is_contiguous()) {
        at::Tensor t = x.detach();
        for (const auto& s : p->steps) step(s, t, false, name);
      } else {
        at::Tensor t = x.detach().contiguous();
        for (const auto& s : p->steps) step(s, t, false, name);
        x.detach().copy_(t);
      }
    }
    // (The adjoint's closure is only built when a node is attached.)
    return with_adjoint_in_place(x, p->attach, name, p->attach ? adjoint(p) : Adjoint());
  }
};

}  // namespace detail

using mpi::detail::checked;
using mpi::detail::Fingerprint;

namespace functional {

HaloExchangePlan::HaloExchangePlan(const mpi::Partition& P_x, Shape left, Shape right,
                                   Shapes shapes) {
  auto l = std::make_shared<detail::HaloLayer>();
  l->plans.set_static_shapes(shapes == Shapes::kStatic);
  l->name = "HaloExchange(P_x " + P_x.describe() + ", left [" + list_string(left) + "], right [" +
            list_string(right) + "])";
  l->adjoint_name = l->name + " adjoint";
  l->P_x = P_x;
  l->left = std::move(left);
  l->right = std::move(right);
  // The widths must be valid and the same on every rank of P_x.
  if (P_x.active()) {
    Fingerprint f;
    f.add(l->left);
    f.add(l->right);
    checked(P_x.comm(), l->name.c_str(), f, [&] {
      if (l->left.size() != l->right.size())
        throw PartitionError(l->name + ": left and right widths differ in length",
                             rule_code::kHaloWidths);
      for (size_t k = 0; k < l->left.size(); ++k)
        if (l->left[k] < 0 || l->right[k] < 0) throw PartitionError(l->name + ": negative ghost width", rule_code::kHaloWidths);
    }, "ghost widths");
  }
  layer_ = l;
}

at::Tensor halo_exchange(const at::Tensor& x, const HaloExchangePlan& plan) {
  return plan.layer_->forward(x);
}
at::Tensor halo_exchange_(const at::Tensor& x, const HaloExchangePlan& plan) {
  return plan.layer_->forward_in_place(x);
}

}  // namespace functional

HaloExchangeImpl::HaloExchangeImpl(const mpi::Partition& P_x, Shape left, Shape right,
                                   Storage storage, Shapes shapes)
    : plan_(P_x, std::move(left), std::move(right), shapes), storage_(storage) {}
torch::Tensor HaloExchangeImpl::forward(const torch::Tensor& x) {
  return storage_ == Storage::kInPlace ? functional::halo_exchange_(x, plan_)
                                       : functional::halo_exchange(x, plan_);
}

}  // namespace partita::nn
