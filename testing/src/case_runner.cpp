#include "partita/testing/case_runner.hpp"

#include "partita/testing/checks.hpp"

#include "partita/testing/primitive_table.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/linear.hpp"
#include "partita/reference/linear.hpp"
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

}  // namespace

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  // Bytes alone would let a tensor of another dtype or shape pass, or read
  // past the end of a shorter one.
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  // An empty tensor's data pointer may be null, and memcmp's arguments may
  // not be, even for 0 bytes (UndefinedBehaviorSanitizer, issue 35).
  if (a.numel() == 0) return b.numel() == 0;
  const auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

namespace {

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

}  // namespace

// The class of a partita error, as a word for reports (when both sides
// raise, the classes must agree), with the broken rule's code
// (partita::rule_code): "ShapeError[tiling.uneven]".
std::string error_class(const Error& e) {
  const std::string rule = "[" + (e.rule().empty() ? std::string("no rule") : e.rule()) + "]";
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError" + rule;
  if (dynamic_cast<const PartitionError*>(&e)) return "PartitionError" + rule;
  if (dynamic_cast<const DeadlineError*>(&e)) return "DeadlineError" + rule;
  return "Error" + rule;
}

bool rejection_agrees(const std::string& expected_class, const std::string& mpi_class, bool involved) {
  // An error without a rule code cannot show that both sides rejected the
  // case for one reason.
  if (mpi_class.empty()) return !involved;
  return mpi_class == expected_class && expected_class.find("[no rule]") == std::string::npos;
}

namespace {

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

// A run of one case on this rank: the entry's two sides and what each gave.
struct Run {
  Run(const Case& c, const PrimitiveEntry& entry, CaseContext ctx)
      : c(c), entry(entry), ctx(std::move(ctx)) {}
  const Case& c;
  const PrimitiveEntry& entry;
  CaseContext ctx;
  int world = 0, me = 0;
  at::ScalarType dtype = at::kDouble;
  bool differentiable = false;
  reference::Tensors xr, yr, dyr, magnitudes;  // every worker's, emulated here
  std::string expected_class;                  // the reference's error class
  std::string mpi_error, mpi_class;            // this rank's MPI error
  MpiLayer layer;
  at::Tensor y, first_y;                       // this rank's MPI output (second and first call)
  std::vector<std::string> problems;
};

// Inputs of every worker (each rank emulates the whole world), this rank's
// copy for the MPI side, and the Linear layers' global parameters (the same
// on every rank).
void draw_inputs(Run& r, CaseOutcome& out) {
  const Case& c = r.c;
  r.xr.resize(r.world);
  for (int w = 0; w < r.world; ++w) {
    r.xr[w] = case_input(c, w);
    if (r.differentiable) r.xr[w].requires_grad_(true);
  }
  out.x = r.xr[r.me].detach().clone();
  if (r.differentiable) out.x.requires_grad_(true);
  if (r.entry.linear) {
    if (!c.in_features && (!c.global_shape || c.global_shape->empty()))
      throw CaseError("case: the Linear layers need a global_shape of at least one dimension: " + c.repro());
    r.ctx.in = c.in_features ? c.in_features : c.global_shape->back();
    std::tie(r.ctx.W0, r.ctx.b0) = linear_parameters(c, r.ctx.in);
    r.ctx.Wr = r.ctx.W0.clone().requires_grad_(true);
    if (r.ctx.b0.defined()) r.ctx.br = r.ctx.b0.clone().requires_grad_(true);
  }
}

// The reference, forward (its backward comes from autograd later); for the
// sums of floats also the same sum over the terms' magnitudes, which scales
// the tolerance. A rejected case leaves its error and class.
void reference_forward(Run& r, CaseOutcome& out) {
  try {
    r.yr = r.entry.reference(r.ctx, r.xr);
    if (r.entry.forward == Moves::kSums && !r.entry.linear && at::isFloatingType(r.dtype)) {
      reference::Tensors abs_x;
      for (const auto& x : r.xr) abs_x.push_back(x.defined() ? x.detach().abs() : x);
      r.magnitudes = r.entry.reference(r.ctx, abs_x);
    }
  } catch (const Error& e) {
    out.expected_error = e.what();
    r.expected_class = error_class(e);
  }
}

// The MPI implementation: construction and forward. Every layer is called
// twice with the same inputs (issue 15, plans made once): the second call
// reuses the plan the first one made and checked, and is the one whose
// output and backward are checked; the first call's output must equal it
// bit for bit (its graph is dropped unused). The first output is
// overwritten with a byte pattern before it is dropped (unless it is the
// input, written in place): a layer that writes its next output into it
// (docs/output-reuse.md) must overwrite every element, or the pattern shows.
void mpi_forward(Run& r, const CaseOutcome& out) {
  try {
    r.layer = r.entry.mpi(r.ctx);
    {
      const at::Tensor first = r.layer.call(out.x);
      r.first_y = first.detach().clone();
      if (!r.layer.written && first.numel() > 0 && first.is_contiguous() && first.device().is_cpu())
        std::memset(first.data_ptr(), 0xA5, first.nbytes());
    }
    r.y = r.layer.call(out.x);
  } catch (const Error& e) {
    r.mpi_error = e.what();
    r.mpi_class = error_class(e);
  }
}

// The case the reference rejects: every rank of the layer must raise the
// same class naming the same rule (issue 9); a rank in neither partition
// takes no part in the layer and may go on.
void judge_rejected(const Run& r, CaseOutcome& out) {
  const Case& c = r.c;
  bool involved = std::count(c.P_x.ranks.begin(), c.P_x.ranks.end(), r.me) > 0;
  for (const auto* P : {&c.P_y, &c.P_W})
    if (*P) involved = involved || listed((*P)->ranks, r.me);
  const bool raised = !r.mpi_error.empty();
  const bool same_class = raised && rejection_agrees(r.expected_class, r.mpi_class, involved);
  out.ok = rejection_agrees(r.expected_class, raised ? r.mpi_class : "", involved);
  out.summary =
      raised && same_class ? "both raised " + r.mpi_class + ": " + r.mpi_error
      : raised ? "the reference raised " + r.expected_class + " '" + out.expected_error +
                     "' but MPI raised " + r.mpi_class + " '" + r.mpi_error + "'"
      : out.ok ? "not involved; the reference raised: " + out.expected_error
               : "the reference raised '" + out.expected_error + "' but MPI did not";
}

// Copies are bit-identical in any dtype; every result is with integer
// fills (exact sums); only sums of random normal values get a tolerance.
// (Without a seed the inputs are arange + 1000 r: integers that float32
// and float64 sum exactly, the 16-bit types do not.)
Compare sums_compare(const Run& r) {
  const bool exact_sums = r.c.data_seed ? r.c.fill == "integers"
                                        : r.dtype != at::kHalf && r.dtype != at::kBFloat16;
  return exact_sums ? Compare::Exact : Compare::Elementwise;
}

// The forward output against the reference's, the second call against the
// first, and where the output lives (new storage, or the in-place input's).
void check_forward(Run& r, const CaseOutcome& out) {
  std::string why;
  const Compare how = r.entry.forward == Moves::kCopies ? Compare::Exact : sums_compare(r);
  if (!close(out.y, r.yr[r.me].detach(), how, &why,
             r.magnitudes.empty() ? at::Tensor() : r.magnitudes[r.me].detach()))
    r.problems.push_back("forward " + why);
  if (!same_bits(r.first_y, out.y))
    r.problems.push_back("a second call with the same inputs (its plan reused) differs from the first (" +
                         dtype_string(r.first_y.scalar_type()) + " " + shape_string(shape_of(r.first_y)) +
                         " then " + dtype_string(out.y.scalar_type()) + " " + shape_string(shape_of(out.y)) + ")");
  if (r.layer.written) {
    if (out.y.numel() > 0 && out.y.data_ptr() != r.layer.written->data_ptr())
      r.problems.push_back("in_place: the forward output is not the input's storage");
  } else if (out.y.numel() > 0 && out.x.numel() > 0 && out.y.data_ptr() == out.x.data_ptr()) {
    r.problems.push_back("forward output shares the input's storage (in place)");
  }
}

// Backward on both sides: the reference through autograd over the whole
// emulated world, MPI on every rank; the input gradients compared. Returns
// the reference's input gradients.
reference::Tensors check_backward(Run& r, CaseOutcome& out) {
  const Case& c = r.c;
  r.dyr.resize(r.world);
  for (int w = 0; w < r.world; ++w)
    r.dyr[w] = listed(c.unused_outputs, w) ? at::zeros_like(r.yr[w].detach())
                                           : case_cotangent(c, w, r.yr[w].sizes());
  // Reference backward: one scalar over the whole emulated world.
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int w = 0; w < r.world; ++w)
    if (r.yr[w].requires_grad())
      total = total + (r.yr[w].to(at::kDouble) * r.dyr[w].to(at::kDouble)).sum();
  if (total.requires_grad()) total.backward();
  reference::Tensors dxr(r.world);
  for (int w = 0; w < r.world; ++w)
    dxr[w] = r.xr[w].grad().defined() ? r.xr[w].grad() : at::zeros_like(r.xr[w]);
  // MPI backward, on every rank.
  if (r.y.requires_grad()) {
    if (listed(c.unused_outputs, r.me))
      torch::autograd::backward({loss_without_gradient(r.y)});
    else if (r.layer.written)  // a gradient nobody else holds: the adjoint may reuse it
      (r.y * r.dyr[r.me]).sum().backward();
    else
      torch::autograd::backward({r.y}, {r.dyr[r.me]});
  }
  out.dx = out.x.grad().defined() ? out.x.grad() : at::zeros_like(out.x);
  // (scale_backward divides before the adjoint sums: quotients added in
  // another order differ in the last bits.)
  const bool scaled = c.distdl && !c.distdl->scale_backward().empty();
  const auto how = r.entry.exact_backward ? Compare::Exact
                   : scaled               ? Compare::Elementwise
                                          : sums_compare(r);
  // Scaled sums are held relative to the same adjoint taken over the terms'
  // magnitudes (the reference's backward with |dy|, its scales positive):
  // where the quotients cancel to 0 in the reference, the implementation's
  // other order leaves a rounding residue that |reference| cannot bound.
  at::Tensor scale;
  if (scaled && how == Compare::Elementwise && at::isFloatingType(out.dx.scalar_type())) {
    reference::Tensors xa(r.world);
    for (int w = 0; w < r.world; ++w)
      xa[w] = r.xr[w].detach().clone().requires_grad_(r.xr[w].requires_grad());
    const reference::Tensors ya = r.entry.reference(r.ctx, xa);
    at::Tensor total_a = at::zeros({}, at::kDouble);
    for (int w = 0; w < r.world; ++w)
      if (ya[w].requires_grad())
        total_a = total_a + (ya[w].to(at::kDouble) * r.dyr[w].to(at::kDouble).abs()).sum();
    if (total_a.requires_grad()) total_a.backward();
    if (xa[r.me].grad().defined()) scale = xa[r.me].grad().detach();
  }
  std::string why;
  if (!close(out.dx, dxr[r.me], how, &why, scale)) r.problems.push_back("backward " + why);
  return dxr;
}

// This rank's parameters and their gradients (the Linear layers).
struct LocalParameters {
  at::Tensor W, dW, b, db;
};

// The Linear layers: each rank stores the block of W and b the reference
// says, and its gradients are the global gradients' blocks.
LocalParameters check_parameters(Run& r) {
  LocalParameters p;
  if (!r.layer.linear) return p;
  const auto& L = *r.layer.linear;
  const auto wb = L.weight_block();
  const auto bb = L.bias_block();
  const reference::ParameterBlock got{wb[0], wb[1], wb[2], wb[3], bb[0], bb[1]};
  const auto want = reference::parameter_block(r.ctx.rlayer, r.me);
  auto block = [](const reference::ParameterBlock& q) {
    std::ostringstream os;
    os << "W rows [" << q.r0 << ", " << q.r0 + q.rn << ") cols [" << q.c0 << ", " << q.c0 + q.cn
       << "), b [" << q.b0 << ", " << q.b0 + q.bn << ")";
    return os.str();
  };
  if (!(got == want))
    r.problems.push_back("stores " + block(got) + ", the reference " + block(want));
  auto grad_or_zero = [](const at::Tensor& t) {
    return t.grad().defined() ? t.grad() : at::zeros_like(t);
  };
  const Compare sums = sums_compare(r);
  std::string why;
  if (want.rn * want.cn > 0 && L.local_weight().defined()) {
    p.W = L.local_weight().detach();
    p.dW = grad_or_zero(L.local_weight());
    const at::Tensor dW = grad_or_zero(r.ctx.Wr).slice(0, want.r0, want.r0 + want.rn)
                              .slice(1, want.c0, want.c0 + want.cn);
    if (!close(p.dW, dW, sums, &why)) r.problems.push_back("weight gradient " + why);
  }
  if (want.bn > 0 && L.local_bias().defined()) {
    p.b = L.local_bias().detach();
    p.db = grad_or_zero(L.local_bias());
    if (!close(p.db, grad_or_zero(r.ctx.br).slice(0, want.b0, want.b0 + want.bn), sums, &why))
      r.problems.push_back("bias gradient " + why);
  }
  return p;
}

// Adjoint identity, summed over all workers: MPI (reduced) and reference.
// <y, dy> = factor <x, dx> + <b, db> (in x) and <W, dW> + <b, db> (in W,
// the Linear layers), the parameters counted once, where they are stored.
// Sets out's two gaps.
void check_adjoint(Run& r, CaseOutcome& out, const reference::Tensors& dxr,
                   const LocalParameters& p) {
  const Case& c = r.c;
  const Dots mine = Dots::of(out.y, r.dyr[r.me], out.x.detach(), out.dx, p.W, p.dW, p.b, p.db);
  Dots global;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(mine.v, global.v, Dots::kCount, MPI_DOUBLE, MPI_SUM,
                                   mpi::world_comm(), &req));
  mpi::wait(req, "run_case adjoint");
  // AllGather's scale_backward makes backward the adjoint divided by the
  // factor: the identity is <F x, y> = factor * <x, B y>.
  double factor = 1;
  if (c.distdl)
    for (int d : c.distdl->scale_backward()) factor *= static_cast<double>(c.P_x.shape.at(d));
  Dots ref;
  for (int w = 0; w < r.world; ++w)
    ref += Dots::of(r.yr[w].detach(), r.dyr[w], r.xr[w].detach(), dxr[w], {}, {}, {}, {});
  const auto& Wr = r.ctx.Wr;
  const auto& br = r.ctx.br;
  if (r.entry.linear)
    ref += Dots::of({}, {}, {}, {}, Wr.detach(), Wr.grad(), br.defined() ? br.detach() : br,
                    br.defined() ? br.grad() : br);
  out.adjoint_mpi = global.gap_in_x(factor);
  out.adjoint_reference = ref.gap_in_x(factor);
  const double tol = adjoint_tolerance(r.dtype);
  if (out.adjoint_mpi > tol)
    r.problems.push_back("MPI adjoint identity off by " + std::to_string(out.adjoint_mpi));
  if (out.adjoint_reference > tol)
    r.problems.push_back("reference adjoint identity off by " + std::to_string(out.adjoint_reference));
  if (r.entry.linear) {
    const double gw = global.gap_in_w(), rw = ref.gap_in_w();
    if (gw > tol) r.problems.push_back("MPI adjoint identity in W off by " + std::to_string(gw));
    if (rw > tol) r.problems.push_back("reference adjoint identity in W off by " + std::to_string(rw));
  }
  // An all-zero result proves nothing: the outputs must carry something.
  if (global.v[Dots::kYY] == 0 && global.v[Dots::kXX] > 0 && ref.v[Dots::kYY] > 0)
    r.problems.push_back("all outputs are zero");
}

// One line: what matched, or every problem found.
std::string summary_of(const Run& r, const CaseOutcome& out) {
  std::ostringstream os;
  if (out.ok) {
    os << "forward"
       << (!r.differentiable ? ""
           : r.entry.linear  ? ", backward (x, W and b), the stored blocks and both adjoints (gap "
                             : ", backward and adjoint (gap ");
    if (r.differentiable) os << out.adjoint_mpi << ")";
    os << " match the reference; y " << shape_string(shape_of(out.y));
  } else {
    for (size_t i = 0; i < r.problems.size(); ++i) os << (i ? "; " : "") << r.problems[i];
  }
  return os.str();
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
  const PrimitiveEntry& entry = primitive_entry(c.primitive);
  const auto rworld = reference::Partition::world(world);
  const auto mworld = mpi::Partition::world();
  Run r(c, entry,
        CaseContext(
            c,
            [&](const PartitionSpec& s) {
              return rworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
            },
            [&](const PartitionSpec& s) {
              return mworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
            }));
  r.world = world;
  r.me = me;
  r.dtype = parse_dtype(c.dtype);
  r.differentiable = at::isFloatingType(r.dtype);
  CaseOutcome out;

  draw_inputs(r, out);
  reference_forward(r, out);
  mpi_forward(r, out);
  // The MPI side's errors agreed on all ranks.
  const bool mpi_ok_everywhere = mpi::all_true(r.mpi_error.empty(), mpi::world_comm());
  if (!out.expected_error.empty()) {
    judge_rejected(r, out);
    return out;
  }
  if (!mpi_ok_everywhere) {
    out.ok = false;
    out.summary = r.mpi_error.empty() ? "MPI raised on another rank" : "MPI raised: " + r.mpi_error;
    return out;
  }
  out.y = r.y.detach();
  check_forward(r, out);
  if (r.differentiable) {
    const reference::Tensors dxr = check_backward(r, out);
    const LocalParameters p = check_parameters(r);
    check_adjoint(r, out, dxr, p);
  }
  out.ok = r.problems.empty();
  out.summary = summary_of(r, out);
  return out;
}

}  // namespace partita::testing
