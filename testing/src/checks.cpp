#include "partita/testing/checks.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "partita/mpi/runtime.hpp"
#include "partita/testing/lockstep.hpp"
#include "exact_zero.hpp"
#include "harness_comms.hpp"

namespace partita::testing {

double Tolerance::of(at::ScalarType t) const {
  switch (t) {
    case at::kDouble: return float64_;
    case at::kFloat: return float32_;
    default: return float16_;
  }
}

at::Tensor rank_input(uint64_t seed, int rank, const Shape& shape, at::ScalarType dtype, int64_t high) {
  if (high < 1) throw std::invalid_argument("rank_input: high must be at least 1");
  auto gen = at::detail::createCPUGenerator(seed * 1000003ull + static_cast<uint64_t>(rank) * 7919ull + 1);
  at::Tensor t;
  if (at::isFloatingType(dtype)) {
    t = at::randn(shape, gen, at::TensorOptions(at::kDouble)).to(dtype);
  } else if (dtype == at::kBool) {
    t = at::randint(0, 2, shape, gen, at::TensorOptions(at::kLong)).to(at::kBool);
  } else {
    t = at::randint(0, high, shape, gen, at::TensorOptions(at::kLong)).to(dtype);
  }
  // Never all zeros (an all-zero check proves nothing): set one element,
  // inside [0, high) (a bool to true). Only high = 1 leaves zeros.
  if (t.numel() > 0 && !t.ne(0).any().item<bool>() && (dtype == at::kBool || high > 1)) {
    if (dtype == at::kBool)
      t.view(-1)[0] = true;
    else
      t.view(-1)[0] = 1 + rank % (high - 1);
  }
  return t;
}

namespace {
MPI_Comm g_checks = MPI_COMM_NULL;

// Finishes `req`, whose buffers `keep` owns. A wait abandoned at a deadline
// leaves the operation posted, and MPI may still write its buffers when a
// late peer joins: they are then kept for the life of the process (a few
// bytes per missed deadline), never freed under MPI.
void wait_keeping(MPI_Request& req, std::shared_ptr<void> keep, const char* what) {
  static std::vector<std::shared_ptr<void>> abandoned;
  try {
    mpi::wait(req, what);
  } catch (...) {
    abandoned.push_back(std::move(keep));
    throw;
  }
}

MPI_Comm duplicate_world(const char* what) {
  auto c = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, c.get(), &req));
  wait_keeping(req, c, what);
  MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
  return *c;
}

// Non-blocking and finished under partita's waiting policy (a blocking
// MPI_Allreduce spins, which costs milliseconds per call when ranks
// outnumber cores, and no deadline reaches it), on buffers of its own.
void reduce(double* values, int n, MPI_Op op, const char* what) {
  auto buffer = std::make_shared<std::vector<double>>(values, values + n);
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer->data(), n, MPI_DOUBLE, op, checks_comm(), &req));
  wait_keeping(req, buffer, what);
  std::copy(buffer->begin(), buffer->end(), values);
}
}  // namespace

MPI_Comm checks_comm() {
  if (g_checks == MPI_COMM_NULL) g_checks = duplicate_world("checks_comm");
  return g_checks;
}

void detail::free_checks_comm() {
  if (g_checks != MPI_COMM_NULL) MPI_Comm_free(&g_checks);
}

void renew_after_missed_deadline() {
  mpi::renew_world();
  // The old one is abandoned, not freed: operations on it never finish.
  g_checks = duplicate_world("renew_after_missed_deadline");
}

double sum_over_ranks(double local) {
  reduce(&local, 1, MPI_SUM, "sum_over_ranks");
  return local;
}
std::vector<double> sum_over_ranks(std::vector<double> local) {
  reduce(local.data(), static_cast<int>(local.size()), MPI_SUM, "sum_over_ranks");
  return local;
}
double min_over_ranks(double local) {
  reduce(&local, 1, MPI_MIN, "min_over_ranks");
  return local;
}
double max_over_ranks(double local) {
  reduce(&local, 1, MPI_MAX, "max_over_ranks");
  return local;
}
void sync_ranks() {
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibarrier(checks_comm(), &req));
  mpi::wait(req, "sync_ranks");
}

bool all_ranks(bool local_ok) { return sum_over_ranks(local_ok ? 0.0 : 1.0) == 0; }

std::string agree(const std::string& local) {
  if (all_ranks(local.empty())) return "";
  const auto all = mpi::allgather_strings(local, checks_comm());
  std::string text;
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) text += (text.empty() ? "" : "\n") + std::string("rank ") + std::to_string(r) + ": " + all[r];
  return text;
}

namespace {

std::string str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

double dot_product(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
}
double norm2(const at::Tensor& a) { return a.numel() ? a.to(at::kDouble).pow(2).sum().item<double>() : 0; }

at::Tensor grad_or_zeros(const at::Tensor& x) { return x.grad().defined() ? x.grad() : at::zeros_like(x); }

Tensors all_inputs(const DistributedFunction& f, int ranks, at::ScalarType dtype, uint64_t seed) {
  Tensors xs;
  for (int r = 0; r < ranks; ++r) xs.push_back(rank_input(seed, r, f.input_shape(r), dtype));
  return xs;
}

// The gradient of a scalar that passes its input on and sends back an
// undefined gradient (what backward sees where an output reaches no loss).
struct UndefinedGrad : torch::autograd::Function<UndefinedGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& y) { return y.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    return {at::Tensor()};
  }
};

}  // namespace

at::Tensor loss_without_gradient(const at::Tensor& y) { return UndefinedGrad::apply(y).sum(); }

std::string compare(const at::Tensor& got, const at::Tensor& want, const Tolerance& tol) {
  if (!got.defined()) return "no output";
  if (got.sizes() != want.sizes())
    return "shape " + str(got.sizes()) + ", twin " + str(want.sizes());
  if (got.scalar_type() != want.scalar_type())
    return std::string("dtype ") + c10::toString(got.scalar_type()) + ", twin " +
           c10::toString(want.scalar_type());
  if (got.numel() == 0) return "";
  if (!at::isFloatingType(want.scalar_type()) || tol.bitwise()) {
    // Bitwise means bits: -0.0 is not +0.0, and a NaN equals the same NaN.
    const at::Tensor gc = got.resolve_conj().resolve_neg().contiguous(),
                     wc = want.resolve_conj().resolve_neg().contiguous();
    const bool same = tol.bitwise() ? std::memcmp(gc.data_ptr(), wc.data_ptr(), gc.nbytes()) == 0 : at::equal(got, want);
    if (!same) {
      std::ostringstream os;
      os << "values differ" << (tol.bitwise() ? " (bitwise)" : "") << ": got "
         << got.reshape(-1).slice(0, 0, 8) << " want " << want.reshape(-1).slice(0, 0, 8);
      return os.str();
    }
    return "";
  }
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = std::max(1.0, w.abs().max().item<double>());
  const double err = (g - w).abs().max().item<double>();
  if (!(err <= tol.of(want.scalar_type()) * scale)) {
    std::ostringstream os;
    os << "values differ by " << err << " (scale " << scale << ", bound "
       << tol.of(want.scalar_type()) << ")";
    return os.str();
  }
  // An all-zero result where the twin's is not is no pass (a check on zeros
  // proves nothing), unless the twin's is itself zero within the bound (a
  // gradient that vanishes in exact arithmetic, left as rounding by the twin).
  const double bound = tol.of(want.scalar_type()) * scale;
  if (!g.ne(0).any().item<bool>() && w.abs().max().item<double>() > bound) return "all-zero output";
  return "";
}

namespace detail {

std::string zero_where_exact_is_not(const at::Tensor& got, const at::Tensor& want,
                                    const std::function<at::Tensor()>& exact) {
  const at::ScalarType t = got.scalar_type();
  if ((t != at::kHalf && t != at::kBFloat16) || got.numel() == 0 || got.ne(0).any().item<bool>()) return "";
  const double eps = std::ldexp(1.0, t == at::kHalf ? -10 : -7);
  if (want.defined() && want.numel() && !(want.detach().abs().max().item<double>() > eps)) return "";
  at::Tensor e;
  try {
    e = exact();
  } catch (const std::exception&) {
    return "";
  }
  if (!e.defined() || e.numel() == 0) return "";
  const double reach = e.detach().abs().max().item<double>();
  if (!(reach > eps)) return "";
  std::ostringstream os;
  os << "all-zero output (the twin's in float64 reaches " << reach << ", beyond " << c10::toString(t)
     << "'s epsilon " << eps << ")";
  return os.str();
}

std::vector<at::Tensor> in_float64(const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> out;
  for (const auto& x : xs) out.push_back(at::isFloatingType(x.scalar_type()) ? x.to(at::kDouble) : x);
  return out;
}

}  // namespace detail

std::string check_forward(const DistributedFunction& f, at::ScalarType dtype, uint64_t seed,
                          const Tolerance& tol) {
  const int me = mpi::world_rank();
  const Tensors xs = all_inputs(f, mpi::world_size(), dtype, seed);
  Tensors want;
  {
    at::NoGradGuard no_grad;
    want = f.twin(xs);
  }
  const at::Tensor got = f.run(xs[me].clone());
  std::string why = compare(got, want.at(me), tol);
  if (why.empty())
    why = detail::zero_where_exact_is_not(got, want.at(me), [&] {
      at::NoGradGuard no_grad;
      return f.twin(detail::in_float64(xs)).at(me);
    });
  return why.empty() ? "" : f.name + " forward (" + c10::toString(dtype) + "): " + why;
}

std::string check_backward(const DistributedFunction& f, at::ScalarType dtype, uint64_t seed,
                           const std::vector<int>& unused, const Tolerance& tol) {
  auto is_unused = [&](int r) { return std::find(unused.begin(), unused.end(), r) != unused.end(); };
  const int me = mpi::world_rank(), p = mpi::world_size();
  const Tensors drawn = all_inputs(f, p, dtype, seed);
  Tensors vs;  // drawn at the first call, from the twin's output shapes
  // The twin's gradient of sum_r <f(x)_r, v_r> in this rank's input, the
  // inputs given as `xs`.
  auto twin_gradient = [&](Tensors xs) {
    for (auto& x : xs) x = x.detach().clone().requires_grad_(true);
    const Tensors outs = f.twin(xs);
    for (int r = static_cast<int>(vs.size()); r < p; ++r)
      vs.push_back(is_unused(r) ? at::zeros(outs[r].sizes(), outs[r].options().requires_grad(false))
                                : rank_input(seed + 29, r, outs[r].sizes().vec(), dtype));
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int r = 0; r < p; ++r)
      if (outs[r].requires_grad()) loss = loss + (outs[r].to(at::kDouble) * vs[r].to(at::kDouble)).sum();
    at::Tensor g = at::zeros_like(xs[me]);
    if (loss.requires_grad()) {
      const auto grads = torch::autograd::grad({loss}, {xs[me]}, {}, false, false, true);
      if (grads[0].defined()) g = grads[0];
    }
    return g.detach();
  };
  const at::Tensor want = twin_gradient(drawn);
  const at::Tensor x = drawn[me].detach().clone().requires_grad_(true);
  const at::Tensor out = f.run(x);
  if (out.requires_grad()) {
    if (is_unused(me)) torch::autograd::backward({loss_without_gradient(out)});
    else torch::autograd::backward({out}, {vs[me]});
  }
  std::string why = compare(grad_or_zeros(x), want, tol);
  if (why.empty())
    why = detail::zero_where_exact_is_not(grad_or_zeros(x), want,
                                          [&] { return twin_gradient(detail::in_float64(drawn)); });
  if (why.empty()) return "";
  std::string which = f.name + " backward (" + c10::toString(dtype);
  if (!unused.empty()) {
    which += ", output unused at rank";
    for (const int r : unused) which += " " + std::to_string(r);
  }
  return which + "): " + why;
}

std::string check_adjoint(const DistributedFunction& f, uint64_t seed, double* relative_gap,
                          double bound) {
  const int me = mpi::world_rank();
  const at::Tensor x = rank_input(seed, me, f.input_shape(me), at::kDouble).requires_grad_(true);
  const at::Tensor out = f.run(x);
  const at::Tensor y = rank_input(seed + 17, me, out.sizes().vec(), at::kDouble);
  // The identity is taken with the cotangent as drawn: an adjoint that wrote
  // into the tensor its caller still holds (instead of a copy) could
  // otherwise keep both sides equal while changing the caller's data.
  const at::Tensor y_drawn = y.clone();
  if (out.requires_grad()) torch::autograd::backward({out}, {y});
  // Agreed on every rank before anything returns: the second pass below is
  // collective, and an adjoint may change the cotangent on some ranks only.
  const bool y_kept = all_ranks(y.equal(y_drawn));
  const at::Tensor gx = grad_or_zeros(x);
  const double lhs = sum_over_ranks(dot_product(out.detach(), y_drawn));
  const double rhs = sum_over_ranks(dot_product(x.detach(), gx));
  const double scale = std::sqrt(sum_over_ranks(norm2(out.detach())) * sum_over_ranks(norm2(y_drawn))) +
                       std::sqrt(sum_over_ranks(norm2(x.detach())) * sum_over_ranks(norm2(gx)));
  const double gap = std::abs(lhs - rhs) / std::max(scale, 1e-300);
  if (relative_gap) *relative_gap = gap;
  if (!y_kept) return f.name + " backward changed the cotangent its caller holds (on some rank)";
  // The same cotangent arriving from inside the graph, as in training:
  // (F(x) * y).sum() hands the node a gradient only it holds, which an
  // adjoint may work on in place; it must give the same gradient.
  {
    const at::Tensor x2 = rank_input(seed, me, f.input_shape(me), at::kDouble).requires_grad_(true);
    const at::Tensor out2 = f.run(x2);
    if (out2.requires_grad()) (out2 * y_drawn).sum().backward();
    const at::Tensor gx2 = grad_or_zeros(x2);
    if (!at::allclose(gx2, gx, 1e-13, 1e-13))
      return f.name + " backward of a gradient made inside the graph differs from that of the "
                      "same cotangent passed to backward() (max difference " +
             std::to_string((gx2 - gx).abs().max().item<double>()) + " on rank " +
             std::to_string(me) + ")";
  }
  if (scale == 0) return f.name + " adjoint: every norm is zero (nothing was checked)";
  // A norm that overflows (an element near 1e154 or above) makes the scale
  // infinite and any gap zero: refused, not passed.
  if (!std::isfinite(scale) || !std::isfinite(lhs) || !std::isfinite(rhs)) {
    std::ostringstream os;
    os << f.name << " adjoint identity: not finite (<F x, y> = " << lhs << ", <x, F* y> = " << rhs
       << ", norms' scale " << scale << ")";
    return os.str();
  }
  if (!(gap <= bound)) {
    std::ostringstream os;
    os << f.name << " adjoint identity: <F x, y> = " << lhs << ", <x, F* y> = " << rhs
       << " (relative gap " << gap << ", bound " << bound << ")";
    return os.str();
  }
  return "";
}

std::string check_unused_output(const DistributedFunction& f, uint64_t seed, bool require_defined) {
  const int me = mpi::world_rank();
  const at::Tensor x = rank_input(seed, me, f.input_shape(me), at::kDouble).requires_grad_(true);
  const at::Tensor out = f.run(x);
  if (out.requires_grad()) torch::autograd::backward({loss_without_gradient(out)});
  if (!x.grad().defined()) {
    if (require_defined && out.requires_grad())
      return f.name + " with an output that reaches no loss: the input's gradient is undefined "
                      "(PyTorch's custom Functions, and so DistDL, give zeros)";
    return "";
  }
  if (x.grad().sizes() != x.sizes())
    return f.name + " with an output that reaches no loss: gradient of shape " + str(x.grad().sizes()) +
           " for an input of shape " + str(x.sizes());
  if (x.grad().numel() && x.grad().ne(0).any().item<bool>()) {
    std::ostringstream os;
    os << f.name << " with an output that reaches no loss: the input's gradient is not zero (max |g| "
       << x.grad().abs().max().item<double>() << ")";
    return os.str();
  }
  return "";
}

std::string check_finite_differences(const DistributedFunction& f, uint64_t seed, int cotangents) {
  const int me = mpi::world_rank(), p = mpi::world_size();
  const at::Tensor x0 = rank_input(seed, me, f.input_shape(me), at::kDouble);
  std::ostringstream problems;
  for (int k = 0; k < cotangents; ++k) {
    at::Tensor v;
    auto loss = [&](const at::Tensor& x) {  // sum over ranks of <F(x)_r, v_r>
      at::NoGradGuard no_grad;
      const at::Tensor out = f.run(x);
      if (!v.defined()) v = rank_input(seed + 101 + k, me, out.sizes().vec(), at::kDouble);
      return sum_over_ranks(dot_product(out, v));
    };
    loss(x0);  // draws v
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor out = f.run(x);
    if (out.requires_grad()) torch::autograd::backward({out}, {v});
    const at::Tensor g = grad_or_zeros(x);
    // Every rank walks every rank's elements in lockstep; only the owner
    // perturbs and compares.
    const auto most = static_cast<int64_t>(max_over_ranks(static_cast<double>(x0.numel())));
    constexpr double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
    int bad = 0;
    for (int r = 0; r < p; ++r) {
      for (int64_t i = 0; i < most; ++i) {
        const bool mine = r == me && i < x0.numel();
        at::Tensor xp = x0.clone(), xm = x0.clone();
        if (mine) {
          xp.view(-1)[i] += eps;
          xm.view(-1)[i] -= eps;
        }
        const double up = loss(xp);
        const double down = loss(xm);
        if (!mine) continue;
        const double numeric = (up - down) / (2 * eps);
        const double analytic = g.view(-1)[i].item<double>();
        // Written so that NaN on either side fails.
        if (!(std::abs(numeric - analytic) <= atol + rtol * std::abs(numeric)) && bad++ < 3)
          problems << f.name << " gradient of element " << i << " (cotangent " << k
                   << "): backward " << analytic << ", finite differences " << numeric << "; ";
      }
    }
  }
  return problems.str();
}

void check_all(const DistributedFunction& f, uint64_t seed, Verdict& v, const CheckOptions& o) {
  for (const auto dtype : o.dtypes()) {
    if (o.forward()) v.expect_empty(check_forward(f, dtype, seed, o.tolerance()));
    if (o.backward() && at::isFloatingType(dtype))
      v.expect_empty(check_backward(f, dtype, seed, {}, o.tolerance()));
  }
  // Rank 0's output reaches no loss: in float64 if asked for, else in the
  // first float dtype asked for.
  std::optional<at::ScalarType> unused_dtype;
  for (const auto dtype : o.dtypes())
    if (at::isFloatingType(dtype) && (!unused_dtype || dtype == at::kDouble)) unused_dtype = dtype;
  if (o.backward() && mpi::world_size() > 1 && unused_dtype)
    v.expect_empty(check_backward(f, *unused_dtype, seed, {0}, o.tolerance()));
  if (o.adjoint()) v.expect_empty(check_adjoint(f, seed));
  if (o.unused_output()) v.expect_empty(check_unused_output(f, seed));
  if (o.finite_differences()) v.expect_empty(check_finite_differences(f, seed));
}

}  // namespace partita::testing
