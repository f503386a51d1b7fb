// The serial twins of seed 002's layers, written for obviousness: the
// global y = x W^T + b, and the tables of docs/linear.md counted out per
// worker. Nothing here composes primitives: that is the MPI layers' business.
#include "partita/reference/linear.hpp"

#include "layout.hpp"
#include "partita/errors.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::reference {

namespace {

constexpr std::pair<const char*, LinearKind> kNames[] = {
    {"linear", LinearKind::General},
    {"linear_all_gather", LinearKind::AllGather},
    {"linear_reduce_scatter", LinearKind::ReduceScatter},
    {"linear_all_gather_zero", LinearKind::AllGatherZero},
    {"linear_reduce_scatter_zero", LinearKind::ReduceScatterZero},
};

bool gathers(LinearKind k) { return k == LinearKind::AllGather || k == LinearKind::AllGatherZero; }
bool zero3(LinearKind k) {
  return k == LinearKind::AllGatherZero || k == LinearKind::ReduceScatterZero;
}

// The partition the layer's parameters are laid out on: P_W, or the one
// whose last axis (M) splits the features: P_y when gathering x, P_x when
// scattering y.
const Partition& layer_partition(const LinearLayer& l) {
  if (l.kind == LinearKind::General) return l.P_W;
  return gathers(l.kind) ? l.P_y : l.P_x;
}

// Every data-parallel coordinate (all but the last two) is 0.
bool first_copy(const Index& i) {
  for (size_t k = 0; k + 2 < i.size(); ++k)
    if (i[k] != 0) return false;
  return true;
}

Shape swap_last_two(Shape s) {
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

}  // namespace

LinearKind linear_kind(const std::string& primitive) {
  for (const auto& [name, kind] : kNames)
    if (primitive == name) return kind;
  throw Error("reference::linear_kind: no layer called " + primitive);
}

void check_layer(const std::string& what, const LinearLayer& l) {
  auto fail = [&](const std::string& why) { throw PartitionError(what + ": " + why, rule_code::kLinearLayout); };
  auto say = [](const Partition& P) { return P.is_null() ? std::string("none") : P.describe(); };
  if (l.kind == LinearKind::General) {
    if (l.P_W.is_null() || !l.P_W.cartesian() || l.P_W.shape().size() != 2)
      fail("P_W must be a 2-D partition P_fout x P_fin, got " + say(l.P_W));
    const int64_t fout = l.P_W.shape()[0], fin = l.P_W.shape()[1];
    if (l.P_x.is_null() || l.P_x.shape() != Shape{1, fin})
      fail("P_x must be 1 x P_fin with P_W " + say(l.P_W) + ", got " + say(l.P_x));
    if (l.P_y.is_null() || l.P_y.shape() != Shape{1, fout})
      fail("P_y must be 1 x P_fout with P_W " + say(l.P_W) + ", got " + say(l.P_y));
    if (l.in < fin || l.out < fout) fail("fewer features than P_W's workers along them");
    return;
  }
  // The layer's partition (where the features are split) and the other one.
  const Partition& P = layer_partition(l);
  const Partition& other = gathers(l.kind) ? l.P_x : l.P_y;
  const size_t d = P.shape().size();
  if (P.is_null() || !P.cartesian() || d < 2 || P.shape()[d - 2] != 1)
    fail("the partition must be D x ... x 1 x M, got " + say(P));
  if (other != P && (other.workers() != P.workers() || other.shape() != swap_last_two(P.shape())))
    fail("the second partition must be the same workers as " + shape_string(swap_last_two(P.shape())) +
         ", got " + say(other));
  const int64_t M = P.shape()[d - 1];
  if (l.out < M || (!gathers(l.kind) && l.in < M)) fail("fewer features than the M workers");
  if (!zero3(l.kind)) return;
  if (d < 3) fail("the fully-sharded layer needs a data-parallel axis, got " + say(P));
  for (size_t k = 1; k + 2 < d; ++k)
    if (P.shape()[k] != 1) fail("the fully-sharded layer shards over axis 0 only, got " + say(P));
  const int64_t D = P.shape()[0];
  const int64_t smallest_out_block = l.out / M;  // the last worker's share of out
  if (gathers(l.kind) ? (l.in < D || smallest_out_block < D)
                      : (l.out < D || (l.bias && smallest_out_block < D)))
    fail("a shard over the " + std::to_string(D) + " data-parallel workers would be empty");
}

ParameterBlock parameter_block(const LinearLayer& l, int w) {
  ParameterBlock p;
  const Partition& P = layer_partition(l);
  if (P.is_null() || !P.active(w)) return p;
  const Index i = P.index(w);
  const size_t d = i.size();
  if (l.kind == LinearKind::General) {
    std::tie(p.r0, p.rn) = balanced_piece(l.out, P.shape()[0], i[0]);
    std::tie(p.c0, p.cn) = balanced_piece(l.in, P.shape()[1], i[1]);
    if (l.bias && i[1] == 0) std::tie(p.b0, p.bn) = std::pair{p.r0, p.rn};
    return p;
  }
  const int64_t M = P.shape()[d - 1], D = P.shape()[0], m = i[d - 1];
  // Model-parallel worker m's share: its block of out (all-gather) or of in
  // (reduce-scatter), and its block of b either way.
  const auto [o0, on] = balanced_piece(l.out, M, m);
  if (gathers(l.kind)) {
    std::tie(p.r0, p.rn) = std::pair{o0, on};
    if (zero3(l.kind)) std::tie(p.c0, p.cn) = balanced_piece(l.in, D, i[0]);
    else if (first_copy(i)) std::tie(p.c0, p.cn) = std::pair<int64_t, int64_t>{0, l.in};
    else return ParameterBlock{};
  } else {
    std::tie(p.c0, p.cn) = balanced_piece(l.in, M, m);
    if (zero3(l.kind)) std::tie(p.r0, p.rn) = balanced_piece(l.out, D, i[0]);
    else if (first_copy(i)) std::tie(p.r0, p.rn) = std::pair<int64_t, int64_t>{0, l.out};
    else return ParameterBlock{};
  }
  if (!l.bias) return p;
  if (zero3(l.kind)) {
    const auto [s, n] = balanced_piece(on, D, i[0]);
    std::tie(p.b0, p.bn) = std::pair{o0 + s, n};
  } else {
    std::tie(p.b0, p.bn) = std::pair{o0, on};
  }
  return p;
}

Tensors linear(const LinearLayer& l, const at::Tensor& W, const at::Tensor& b, const Tensors& x) {
  const std::string what = "reference::linear";
  check_layer(what, l);
  check_inputs(what, l.P_x, x);
  const Ranks& xs = l.P_x.workers();
  std::vector<Shape> pieces;
  for (int w : xs) pieces.push_back(shape_of(x[w]));
  const Layout lay = lay_out(what, l.P_x.shape(), pieces, xs);
  // The pieces must be the balanced decomposition of the global x.
  for (size_t r = 0; r < xs.size(); ++r) {
    const Index i = l.P_x.index(xs[r]);
    for (size_t k = 0; k < i.size(); ++k)
      if (balanced_piece(lay.global[k], l.P_x.shape()[k], i[k]) !=
          std::pair{lay.start[r][k], pieces[r][k]})
        throw ShapeError(what + ": worker " + std::to_string(xs[r]) + "'s x " +
                         shape_string(pieces[r]) + " is not its balanced piece of " +
                         shape_string(lay.global), rule_code::kLinearInput);
    if (x[xs[r]].scalar_type() != W.scalar_type())
      throw ShapeError(what + ": worker " + std::to_string(xs[r]) + "'s x has dtype " +
                       dtype_name(x[xs[r]].scalar_type()) + ", the layer " +
                       dtype_name(W.scalar_type()), rule_code::kLinearInput);
  }
  if (lay.global.back() != l.in)
    throw ShapeError(what + ": x has " + std::to_string(lay.global.back()) +
                     " features, the layer in_features " + std::to_string(l.in), rule_code::kLinearInput);

  // The global x: every piece padded with zeros to its place, summed.
  at::Tensor X = at::zeros(lay.global, W.options().requires_grad(false));
  for (size_t r = 0; r < xs.size(); ++r) {
    if (x[xs[r]].numel() == 0) continue;
    std::vector<int64_t> pad;  // last dimension first, as constant_pad_nd wants
    for (size_t k = lay.global.size(); k-- > 0;) {
      pad.push_back(lay.start[r][k]);
      pad.push_back(lay.global[k] - lay.start[r][k] - pieces[r][k]);
    }
    X = X + at::constant_pad_nd(x[xs[r]], pad);
  }
  at::Tensor Y = X.matmul(W.t());
  if (b.defined()) Y = Y + b;

  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (l.P_y.active(me)) {
      const Index i = l.P_y.index(me);
      at::Tensor block = Y;
      for (size_t k = 0; k < i.size(); ++k) {
        const auto [s, n] = balanced_piece(Y.size(k), l.P_y.shape()[k], i[k]);
        block = block.slice(k, s, s + n);
      }
      y[w] = block.clone();
    } else if (l.P_x.active(me) || (!l.P_W.is_null() && l.P_W.active(me))) {
      // The sum-reduce into P_y keeps the batch (preserve_batch, DistDL's default).
      y[w] = at::zeros({Y.size(0), 0}, W.options().requires_grad(false));
    } else {
      y[w] = x[w].clone();
    }
  }
  return y;
}

}  // namespace partita::reference
