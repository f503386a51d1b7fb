#include "partita/testing/case_runner.hpp"

#include "partita/testing/checks.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/reference/all_gather.hpp"
#include "partita/reference/all_sum_reduce.hpp"
#include "partita/reference/reduce_scatter.hpp"
#include "partita/reference/broadcast.hpp"
#include "partita/reference/halo_exchange.hpp"
#include "partita/reference/linear.hpp"
#include "partita/reference/repartition.hpp"
#include "partita/reference/sum_reduce.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::testing {

namespace {

at::Tensor fill(const Case& c, int worker, at::IntArrayRef shape, int64_t offset_per_rank,
                uint64_t salt) {
  const auto dtype = parse_dtype(c.dtype);
  const int64_t n = c10::multiply_integers(shape);
  if (!c.data_seed) {
    return (torch::arange(n, torch::kFloat64) + static_cast<double>(offset_per_rank * worker))
        .to(dtype)
        .reshape(shape);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(*c.data_seed * 7919 + worker * 104729 + salt);
  const auto f64 = at::TensorOptions().dtype(torch::kFloat64);
  const bool unsigned_type = dtype == at::kByte;
  if (c.fill == "normal" && at::isFloatingType(dtype)) return at::randn(shape, gen, f64).to(dtype);
  if (c.fill == "normal")
    return at::randint(unsigned_type ? 0 : -50, 50, shape, gen, f64).to(dtype);
  // Small integers: any sum over a team (at most a few dozen terms) stays
  // below 256, where bfloat16, float16 and float32 hold every integer. The
  // Linear layers multiply before they sum: their values are in [-2, 2], so
  // a layer of up to 60 features over up to 60 rows stays below 256 too.
  const int64_t top = c.is_linear() ? 2 : 8;
  return at::randint(unsigned_type ? 0 : -top, top + 1, shape, gen, f64).to(dtype);
}

// How a result is compared with the reference's (issue 9): bit for bit, or
// elementwise within the dtype's precision (only where the values are random
// normal floats and the result is a sum, which MPI adds in another order).
enum class Compare { Exact, Elementwise };

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

// `scale`, when given (same shape as want), is the same sum taken over the
// terms' magnitudes, sum |x_i|: a sum's rounding error is bounded by
// (n - 1) u sum |x_i| whatever the order, so that is what the tolerance is
// relative to where the terms cancel (u = 2^-11 for float16: 12 terms stay
// within 1e-2).
bool close(const at::Tensor& got, const at::Tensor& want, Compare how, std::string* why,
           const at::Tensor& scale = {}) {
  if (got.sizes() != want.sizes()) {
    *why = "shape " + shape_string(shape_of(got)) + " != reference " + shape_string(shape_of(want));
    return false;
  }
  if (got.scalar_type() != want.scalar_type()) {
    *why = "dtype " + dtype_string(got.scalar_type()) + " != reference " +
           dtype_string(want.scalar_type());
    return false;
  }
  if (got.numel() == 0) return true;
  const auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  std::ostringstream os;
  if (how == Compare::Exact || !at::isFloatingType(got.scalar_type())) {
    if (same_bits(got, want)) return true;
    const auto differ = (g != w) | (g.signbit() != w.signbit());
    os << "not bit-identical: " << differ.sum().item<int64_t>() << " of " << got.numel()
       << " elements differ (max |diff| " << (g - w).abs().max().item<double>() << ")";
    *why = os.str();
    return false;
  }
  double rtol = 1e-12;
  if (got.scalar_type() == at::kFloat) rtol = 1e-5;
  if (got.scalar_type() == at::kHalf) rtol = 1e-2;
  if (got.scalar_type() == at::kBFloat16) rtol = 4e-2;
  // Elementwise: |g - w| <= rtol * (|w| + the mean magnitude), the second
  // term standing for the cancellation a sum of normal values can show.
  const double typical = w.abs().mean().item<double>();
  const auto bound = scale.defined() ? scale.to(at::kDouble).abs() : w.abs();
  const auto excess = (g - w).abs() - rtol * (bound + typical);
  if (excess.max().item<double>() <= 0) return true;
  os << "values differ: " << (excess > 0).sum().item<int64_t>() << " of " << got.numel()
     << " elements beyond " << rtol << " * (" << (scale.defined() ? "sum of |terms|" : "|reference|") << " + "
     << typical << "), max |diff| " << (g - w).abs().max().item<double>();
  *why = os.str();
  return false;
}

double inner64(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
}
double sq(const at::Tensor& a) { return inner64(a, a); }

// The terms of the dot-product tests, summed over ranks with one allreduce:
// inner products and squared norms of (y, dy), (x, dx), (W, dW), (b, db).
struct Dots {
  enum { kYD, kYY, kDD, kXD, kXX, kDXX, kWD, kWW, kDWW, kBD, kBB, kDBB, kCount };
  double v[kCount] = {};
  static Dots of(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dx,
                 const at::Tensor& W, const at::Tensor& dW, const at::Tensor& b, const at::Tensor& db) {
    Dots d;
    auto pair = [&](const at::Tensor& a, const at::Tensor& da, int at) {
      if (!a.defined() || !da.defined()) return;
      d.v[at] = inner64(a, da);
      d.v[at + 1] = sq(a);
      d.v[at + 2] = sq(da);
    };
    pair(y, dy, kYD);
    pair(x, dx, kXD);
    pair(W, dW, kWD);
    pair(b, db, kBD);
    return d;
  }
  Dots& operator+=(const Dots& o) {
    for (int i = 0; i < kCount; ++i) v[i] += o.v[i];
    return *this;
  }
  // |<F x, dy> - <x, F* dy>| relative to the norms: <y, dy> against
  // factor <x, dx> + <b, db> (the bias term is zero but for the layers).
  double gap_in_x(double factor) const {
    return gap(v[kYD], factor * v[kXD] + v[kBD], factor * std::sqrt(v[kXX] * v[kDXX]));
  }
  // The layers only: y is linear in W too, <y, dy> = <W, dW> + <b, db>.
  double gap_in_w() const { return gap(v[kYD], v[kWD] + v[kBD], std::sqrt(v[kWW] * v[kDWW])); }

 private:
  double gap(double lhs, double rhs, double main_term) const {
    const double scale =
        std::max(std::sqrt(v[kYY] * v[kDD]), main_term + std::sqrt(v[kBB] * v[kDBB]));
    return scale == 0 ? std::abs(lhs - rhs) : std::abs(lhs - rhs) / scale;
  }
};

double adjoint_tolerance(at::ScalarType t) {
  if (t == at::kDouble) return 1e-10;
  if (t == at::kFloat) return 1e-4;
  return 5e-2;
}

// The class of a partita error, as a word for reports (issue 9: when both
// sides raise, the classes must agree).
// With the broken rule's code (partita::rule_code): "ShapeError[tiling.uneven]".
std::string error_class(const Error& e) {
  const std::string rule = "[" + (e.rule().empty() ? std::string("no rule") : e.rule()) + "]";
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError" + rule;
  if (dynamic_cast<const PartitionError*>(&e)) return "PartitionError" + rule;
  if (dynamic_cast<const DeadlineError*>(&e)) return "DeadlineError" + rule;
  return "Error" + rule;
}

bool listed(const Ranks& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// The Linear layers' global W ([out, in]) and b ([out]): drawn like the
// inputs from the case's seed, or without one a fixed pattern of small
// integers.
std::pair<at::Tensor, at::Tensor> linear_parameters(const Case& c, int64_t in) {
  const int64_t out = c.out_features;
  at::Tensor W, b;
  if (c.data_seed) {
    W = fill(c, 0, {out, in}, 0, 3);
    b = fill(c, 0, {out}, 0, 4);
  } else {
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    W = (at::arange(out * in, f64).remainder(5) - 2).reshape({out, in}).to(parse_dtype(c.dtype));
    b = (at::arange(out, f64).remainder(3) - 1).to(parse_dtype(c.dtype));
  }
  if (!c.bias) b = at::Tensor();
  return {W, b};
}

// The Linear layer a case names, built from MPI partitions.
std::shared_ptr<nn::DistributedLinearBase> make_linear(const Case& c, int64_t in,
                      const std::function<mpi::Partition(const PartitionSpec&)>& part) {
  nn::LinearOptions o;
  o.bias = c.bias;
  o.dtype = parse_dtype(c.dtype);
  const auto px = part(c.P_x);
  const auto py = c.P_y ? part(*c.P_y) : mpi::Partition();
  const auto kind = reference::linear_kind(c.primitive);
  using K = reference::LinearKind;
  // The all-gather layers take P_y first and P_x as the option (x split
  // along the tokens); without P_y the single form is P_x alone.
  const auto& first = c.P_y ? py : px;
  const auto second = c.P_y ? px : mpi::Partition();
  switch (kind) {
    case K::General:
      return nn::DistributedLinear(px, py, part(*c.P_W), in, c.out_features, o).ptr();
    case K::AllGather:
      return nn::DistributedLinearAllGather(first, in, c.out_features, o, second).ptr();
    case K::AllGatherZero:
      return nn::DistributedLinearAllGatherZero(first, in, c.out_features, o, second).ptr();
    case K::ReduceScatter:
      return nn::DistributedLinearReduceScatter(px, in, c.out_features, o, py).ptr();
    case K::ReduceScatterZero:
      return nn::DistributedLinearReduceScatterZero(px, in, c.out_features, o, py).ptr();
  }
  throw Error("no layer " + c.primitive);
}

}  // namespace

at::Tensor case_input(const Case& c, int worker) {
  return fill(c, worker, c.input_shape(worker), 1000, 1);
}

at::Tensor case_cotangent(const Case& c, int worker, at::IntArrayRef shape) {
  return fill(c, worker, shape, 2000, 2);
}

CaseOutcome run_case(const Case& c) {
  const int world = mpi::world_size(), me = mpi::world_rank();
  if (world < c.world_size_needed())
    throw Error("case needs " + std::to_string(c.world_size_needed()) + " ranks, the world has " +
                std::to_string(world) + ": " + c.repro());
  const auto dtype = parse_dtype(c.dtype);
  const bool differentiable = at::isFloatingType(dtype);
  CaseOutcome out;

  // Inputs of every worker (each rank emulates the whole world).
  reference::Tensors xr(world);
  for (int w = 0; w < world; ++w) {
    xr[w] = case_input(c, w);
    if (differentiable) xr[w].requires_grad_(true);
  }
  out.x = xr[me].detach().clone();
  if (differentiable) out.x.requires_grad_(true);

  const auto rworld = reference::Partition::world(world);
  const auto mworld = mpi::Partition::world();
  auto rpart = [&](const PartitionSpec& s) {
    return rworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
  };
  auto mpart = [&](const PartitionSpec& s) {
    return mworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
  };

  // The Linear layers' global parameters (the same on every rank).
  const int64_t in = !c.is_linear() ? 0 : c.in_features ? c.in_features : c.global_shape->back();
  at::Tensor W0, b0, Wr, br;
  if (c.is_linear()) {
    std::tie(W0, b0) = linear_parameters(c, in);
    Wr = W0.clone().requires_grad_(true);
    if (b0.defined()) br = b0.clone().requires_grad_(true);
  }
  reference::LinearLayer rlayer;

  // The reference, forward and (through autograd) backward.
  reference::Tensors yr, dyr(world), magnitudes;
  std::string expected_class, mpi_class;
  try {
    const auto rx = rpart(c.P_x);
    // The primitives that sum, on given inputs (the case's, or their magnitudes).
    auto summed = [&](const reference::Tensors& xs) {
      if (c.primitive == "sum_reduce") return reference::sum_reduce(rx, rpart(*c.P_y), xs, c.options);
      if (c.primitive == "reduce_scatter" && c.distdl) return reference::reduce_scatter(rx, *c.distdl, xs);
      if (c.primitive == "reduce_scatter") return reference::reduce_scatter(rx, c.axis, c.dim, xs);
      return reference::all_sum_reduce(rx, c.axes, xs);
    };
    if (c.is_linear()) {
      rlayer.kind = reference::linear_kind(c.primitive);
      rlayer.P_x = rx;
      rlayer.P_y = c.P_y ? rpart(*c.P_y) : rx;
      if (c.P_W) rlayer.P_W = rpart(*c.P_W);
      rlayer.in = in;
      rlayer.out = c.out_features;
      rlayer.bias = c.bias;
      yr = reference::linear(rlayer, Wr, br, xr);
    } else if (c.primitive == "broadcast") yr = reference::broadcast(rx, rpart(*c.P_y), xr, c.options);
    else if (c.primitive == "repartition") yr = reference::repartition(rx, rpart(*c.P_y), xr);
    else if (c.primitive == "all_gather" && c.distdl) yr = reference::all_gather(rx, *c.distdl, xr);
    else if (c.primitive == "all_gather") yr = reference::all_gather(rx, c.axis, c.dim, xr);
    else if (c.primitive == "halo_exchange") yr = reference::halo_exchange(rx, c.left, c.right, xr);
    else {
      yr = summed(xr);
      if (at::isFloatingType(dtype)) {
        reference::Tensors abs_x;
        for (const auto& x : xr) abs_x.push_back(x.defined() ? x.detach().abs() : x);
        magnitudes = summed(abs_x);
      }
    }
  } catch (const Error& e) {
    out.expected_error = e.what();
    expected_class = error_class(e);
  }

  // The MPI implementation: construction and forward, agreed on all ranks.
  std::string mpi_error;
  at::Tensor y, in_place_input, first_y;
  // Every layer is called twice with the same inputs (issue 15, plans made
  // once): the second call reuses the plan the first one made and checked,
  // and is the one whose output and backward are checked below; the first
  // call's output must equal it bit for bit (its graph is dropped unused).
  auto twice = [&](const std::function<at::Tensor()>& call) {
    first_y = call().detach().clone();
    y = call();
  };
  std::shared_ptr<nn::DistributedLinearBase> mlin;
  try {
    const auto px = mpart(c.P_x);
    if (c.is_linear()) {
      mlin = make_linear(c, in, mpart);
      // The layer starts from the reference's W and b.
      torch::nn::Linear global(torch::nn::LinearOptions(in, c.out_features).bias(c.bias));
      global->to(dtype);
      {
        torch::NoGradGuard no_grad;
        global->weight.copy_(W0);
        if (c.bias) global->bias.copy_(b0);
      }
      mlin->scatter_parameters(global);
      twice([&] { return mlin->forward(out.x); });
    } else if (c.primitive == "broadcast") {
      nn::Broadcast layer(px, mpart(*c.P_y), c.options);
      twice([&] { return layer(out.x); });
    } else if (c.primitive == "sum_reduce") {
      nn::SumReduce layer(px, mpart(*c.P_y), c.options);
      twice([&] { return layer(out.x); });
    } else if (c.primitive == "repartition") {
      nn::Repartition layer(px, mpart(*c.P_y));
      twice([&] { return layer(out.x); });
    } else if (c.primitive == "all_gather") {
      nn::AllGather layer = c.distdl ? nn::AllGather(px, *c.distdl) : nn::AllGather(px, c.axis, c.dim);
      twice([&] { return layer(out.x); });
    } else if (c.primitive == "reduce_scatter") {
      nn::ReduceScatter layer =
          c.distdl ? nn::ReduceScatter(px, *c.distdl) : nn::ReduceScatter(px, c.axis, c.dim);
      twice([&] { return layer(out.x); });
    } else if (c.primitive == "halo_exchange" && c.in_place) {
      // DistDL's form: the ghosts of a computed (non-leaf) copy of x are
      // filled in place, and the gradient reaches x through it.
      nn::HaloExchange layer(px, c.left, c.right, nn::HaloExchangeImpl::Storage::kInPlace);
      twice([&] {
        in_place_input = out.x.requires_grad() ? out.x * 1 : out.x.clone();
        return layer(in_place_input);
      });
    } else if (c.primitive == "halo_exchange") {
      nn::HaloExchange layer(px, c.left, c.right);
      twice([&] { return layer(out.x); });
    } else {
      nn::AllSumReduce layer(px, c.axes);
      twice([&] { return layer(out.x); });
    }
  } catch (const Error& e) {
    mpi_error = e.what();
    mpi_class = error_class(e);
  }
  const bool mpi_ok_everywhere = mpi::all_true(mpi_error.empty(), mpi::world_comm());
  if (!out.expected_error.empty()) {
    // Every rank of the layer must raise; a rank in neither partition takes
    // no part in the layer and may go on.
    bool involved = std::count(c.P_x.ranks.begin(), c.P_x.ranks.end(), me) > 0;
    for (const auto* P : {&c.P_y, &c.P_W})
      if (*P) involved = involved || listed((*P)->ranks, me);
    // The same class and the same rule (issue 9); an error without a rule
    // code cannot show that both sides rejected the case for one reason.
    const bool same_class =
        mpi_class == expected_class && expected_class.find("[no rule]") == std::string::npos;
    out.ok = (!mpi_error.empty() && same_class) || (mpi_error.empty() && !involved);
    out.summary =
        !mpi_error.empty() && same_class ? "both raised " + mpi_class + ": " + mpi_error
        : !mpi_error.empty() ? "the reference raised " + expected_class + " '" + out.expected_error +
                                   "' but MPI raised " + mpi_class + " '" + mpi_error + "'"
        : out.ok ? "not involved; the reference raised: " + out.expected_error
                 : "the reference raised '" + out.expected_error + "' but MPI did not";
    return out;
  }
  if (!mpi_ok_everywhere) {
    out.ok = false;
    out.summary = mpi_error.empty() ? "MPI raised on another rank" : "MPI raised: " + mpi_error;
    return out;
  }
  out.y = y.detach();
  std::vector<std::string> problems;
  std::string why;
  // Copies are bit-identical in any dtype; every result is with integer
  // fills (exact sums); only sums of random normal values get a tolerance.
  const bool copy = c.primitive == "broadcast" || c.primitive == "all_gather" ||
                    c.primitive == "repartition" || c.primitive == "halo_exchange";
  // (Without a seed the inputs are arange + 1000 r: integers that float32
  // and float64 sum exactly, the 16-bit types do not.)
  const bool exact_sums = c.data_seed ? c.fill == "integers"
                                      : dtype != at::kHalf && dtype != at::kBFloat16;
  const auto sums = exact_sums ? Compare::Exact : Compare::Elementwise;
  if (!close(out.y, yr[me].detach(), copy ? Compare::Exact : sums, &why,
             magnitudes.empty() ? at::Tensor() : magnitudes[me].detach()))
    problems.push_back("forward " + why);
  if (!same_bits(first_y, out.y))
    problems.push_back("a second call with the same inputs (its plan reused) differs from the first");
  if (c.in_place) {
    if (out.y.numel() > 0 && out.y.data_ptr() != in_place_input.data_ptr())
      problems.push_back("in_place: the forward output is not the input's storage");
  } else if (out.y.numel() > 0 && out.x.numel() > 0 && out.y.data_ptr() == out.x.data_ptr()) {
    problems.push_back("forward output shares the input's storage (in place)");
  }

  double gaps[2] = {0, 0};
  if (differentiable) {
    for (int w = 0; w < world; ++w)
      dyr[w] = listed(c.unused_outputs, w) ? at::zeros_like(yr[w].detach())
                                           : case_cotangent(c, w, yr[w].sizes());
    // Reference backward: one scalar over the whole emulated world.
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int w = 0; w < world; ++w)
      if (yr[w].requires_grad()) total = total + (yr[w].to(at::kDouble) * dyr[w].to(at::kDouble)).sum();
    if (total.requires_grad()) total.backward();
    reference::Tensors dxr(world);
    for (int w = 0; w < world; ++w)
      dxr[w] = xr[w].grad().defined() ? xr[w].grad() : at::zeros_like(xr[w]);
    // MPI backward, on every rank.
    if (y.requires_grad()) {
      if (listed(c.unused_outputs, me))
        torch::autograd::backward({loss_without_gradient(y)});
      else if (c.in_place)  // a gradient nobody else holds: the adjoint may reuse it
        (y * dyr[me]).sum().backward();
      else
        torch::autograd::backward({y}, {dyr[me]});
    }
    out.dx = out.x.grad().defined() ? out.x.grad() : at::zeros_like(out.x);
    // (scale_backward divides before the adjoint sums: quotients added in
    // another order differ in the last bits.)
    const bool scaled = c.distdl && !c.distdl->scale_backward.empty();
    const auto backward_compare = c.primitive == "repartition" ? Compare::Exact
                                  : scaled                      ? Compare::Elementwise
                                                                : sums;
    if (!close(out.dx, dxr[me], backward_compare, &why)) problems.push_back("backward " + why);

    // The Linear layers: each rank stores the block of W and b the reference
    // says, and its gradients are the global gradients' blocks.
    at::Tensor Wl, dWl, bl, dbl;  // this rank's parameters and their gradients
    if (mlin) {
      const auto& L = *mlin;
      const auto wb = L.weight_block();
      const auto bb = L.bias_block();
      const reference::ParameterBlock got{wb[0], wb[1], wb[2], wb[3], bb[0], bb[1]};
      const auto want = reference::parameter_block(rlayer, me);
      auto block = [](const reference::ParameterBlock& p) {
        std::ostringstream os;
        os << "W rows [" << p.r0 << ", " << p.r0 + p.rn << ") cols [" << p.c0 << ", " << p.c0 + p.cn
           << "), b [" << p.b0 << ", " << p.b0 + p.bn << ")";
        return os.str();
      };
      if (!(got == want))
        problems.push_back("stores " + block(got) + ", the reference " + block(want));
      auto grad_or_zero = [](const at::Tensor& p) {
        return p.grad().defined() ? p.grad() : at::zeros_like(p);
      };
      if (want.rn * want.cn > 0 && L.local_weight().defined()) {
        Wl = L.local_weight().detach();
        dWl = grad_or_zero(L.local_weight());
        const at::Tensor dW = grad_or_zero(Wr).slice(0, want.r0, want.r0 + want.rn)
                                  .slice(1, want.c0, want.c0 + want.cn);
        if (!close(dWl, dW, sums, &why)) problems.push_back("weight gradient " + why);
      }
      if (want.bn > 0 && L.local_bias().defined()) {
        bl = L.local_bias().detach();
        dbl = grad_or_zero(L.local_bias());
        if (!close(dbl, grad_or_zero(br).slice(0, want.b0, want.b0 + want.bn), sums, &why))
          problems.push_back("bias gradient " + why);
      }
    }

    // Adjoint identity, summed over all workers: MPI (reduced) and reference.
    // <y, dy> = factor <x, dx> + <b, db> (in x) and <W, dW> + <b, db> (in W,
    // the Linear layers), the parameters counted once, where they are stored.
    const Dots mine = Dots::of(out.y, dyr[me], out.x.detach(), out.dx, Wl, dWl, bl, dbl);
    Dots global;
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Iallreduce(mine.v, global.v, Dots::kCount, MPI_DOUBLE, MPI_SUM,
                                     mpi::world_comm(), &req));
    mpi::wait(req, "run_case adjoint");
    // AllGather's scale_backward makes backward the adjoint divided by the
    // factor: the identity is <F x, y> = factor * <x, B y>.
    double factor = 1;
    if (c.distdl)
      for (int d : c.distdl->scale_backward) factor *= static_cast<double>(c.P_x.shape.at(d));
    Dots r;
    for (int w = 0; w < world; ++w)
      r += Dots::of(yr[w].detach(), dyr[w], xr[w].detach(), dxr[w], {}, {}, {}, {});
    if (c.is_linear())
      r += Dots::of({}, {}, {}, {}, Wr.detach(), Wr.grad(), br.defined() ? br.detach() : br,
                    br.defined() ? br.grad() : br);
    gaps[0] = global.gap_in_x(factor);
    gaps[1] = r.gap_in_x(factor);
    const double tol = adjoint_tolerance(dtype);
    if (gaps[0] > tol) problems.push_back("MPI adjoint identity off by " + std::to_string(gaps[0]));
    if (gaps[1] > tol) problems.push_back("reference adjoint identity off by " + std::to_string(gaps[1]));
    if (c.is_linear()) {
      const double gw = global.gap_in_w(), rw = r.gap_in_w();
      if (gw > tol) problems.push_back("MPI adjoint identity in W off by " + std::to_string(gw));
      if (rw > tol) problems.push_back("reference adjoint identity in W off by " + std::to_string(rw));
    }
    // An all-zero result proves nothing: the outputs must carry something.
    if (global.v[Dots::kYY] == 0 && global.v[Dots::kXX] > 0 && r.v[Dots::kYY] > 0)
      problems.push_back("all outputs are zero");
  }
  out.adjoint_mpi = gaps[0];
  out.adjoint_reference = gaps[1];
  out.ok = problems.empty();
  std::ostringstream os;
  if (out.ok) {
    os << "forward"
       << (!differentiable   ? ""
           : c.is_linear() ? ", backward (x, W and b), the stored blocks and both adjoints (gap "
                           : ", backward and adjoint (gap ");
    if (differentiable) os << gaps[0] << ")";
    os << " match the reference; y " << shape_string(shape_of(out.y));
  } else {
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
  }
  out.summary = os.str();
  return out;
}

}  // namespace partita::testing
