#include "comm_checks.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "case_runner.hpp"
#include "lockstep.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::testing::comm {

at::Tensor input_of(uint64_t seed, int rank, const Shape& shape, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed * 1000003ull + static_cast<uint64_t>(rank) * 7919ull + 1);
  at::Tensor t;
  if (at::isFloatingType(dtype)) {
    t = at::randn(shape, gen, at::TensorOptions(at::kDouble)).to(dtype);
  } else if (dtype == at::kBool) {
    t = at::randint(0, 2, shape, gen, at::TensorOptions(at::kLong)).to(at::kBool);
  } else {
    t = at::randint(0, 8, shape, gen, at::TensorOptions(at::kLong)).to(dtype);
  }
  // Never all zeros (an all-zero check proves nothing): set one element.
  if (t.numel() > 0 && dtype != at::kBool && !t.ne(0).any().item<bool>())
    t.view(-1)[0] = 1 + rank;
  return t;
}

double sum_over_ranks(double local) {
  // Non-blocking and finished under partita's waiting policy: a blocking
  // MPI_Allreduce spins, which costs milliseconds per call when ranks
  // outnumber cores.
  double all = 0;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(&local, &all, 1, MPI_DOUBLE, MPI_SUM, harness_comm(), &req));
  mpi::wait(req, "sum_over_ranks");
  return all;
}

namespace {
double tolerance_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return 1e-12;
    case at::kFloat: return 1e-5;
    default: return 3e-2;  // 16-bit floats
  }
}

std::string str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}
}  // namespace

std::string compare(const at::Tensor& got, const at::Tensor& want) {
  if (!got.defined()) return "no output";
  if (got.sizes() != want.sizes())
    return "shape " + str(got.sizes()) + ", reference " + str(want.sizes());
  if (got.scalar_type() != want.scalar_type())
    return std::string("dtype ") + c10::toString(got.scalar_type()) + ", reference " +
           c10::toString(want.scalar_type());
  if (got.numel() == 0) return "";
  if (!at::isFloatingType(want.scalar_type())) {
    if (!at::equal(got, want)) {
      std::ostringstream os;
      os << "values differ: got " << got.view(-1).slice(0, 0, 8) << " want "
         << want.view(-1).slice(0, 0, 8);
      return os.str();
    }
    return "";
  }
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = std::max(1.0, w.abs().max().item<double>());
  const double err = (g - w).abs().max().item<double>();
  if (err > tolerance_of(want.scalar_type()) * scale * 8) {
    std::ostringstream os;
    os << "values differ by " << err << " (scale " << scale << ")";
    return os.str();
  }
  if (w.ne(0).any().item<bool>() && !g.ne(0).any().item<bool>()) return "all-zero output";
  return "";
}

Tensors reference_outputs(const Call& c, int ranks, at::ScalarType dtype, uint64_t seed) {
  Tensors xs;
  for (int r = 0; r < ranks; ++r) xs.push_back(input_of(seed, r, c.shape(r), dtype));
  at::NoGradGuard no_grad;
  return c.reference(xs);
}

std::string check_forward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                          uint64_t seed) {
  const int me = comm.rank();
  const at::Tensor x = input_of(seed, me, c.shape(me), dtype);
  const at::Tensor x_before = x.clone();
  const Tensors want = reference_outputs(c, comm.size(), dtype, seed);
  const at::Tensor got = c.run(comm, x);
  std::string why = compare(got, want[me]);
  if (!why.empty()) return c.name + " forward (" + c10::toString(dtype) + "): " + why;
  return "";
}

std::string check_backward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                           uint64_t seed, const std::vector<int>& unused) {
  auto is_unused = [&](int r) { return std::find(unused.begin(), unused.end(), r) != unused.end(); };
  const int me = comm.rank(), p = comm.size();
  Tensors xs, vs;
  for (int r = 0; r < p; ++r) xs.push_back(input_of(seed, r, c.shape(r), dtype).requires_grad_(true));
  const Tensors outs = c.reference(xs);
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (int r = 0; r < p; ++r) {
    vs.push_back(is_unused(r) ? at::zeros(outs[r].sizes(), outs[r].options().requires_grad(false))
                              : input_of(seed + 29, r, outs[r].sizes().vec(), dtype));
    if (outs[r].requires_grad()) loss = loss + (outs[r].to(at::kDouble) * vs[r].to(at::kDouble)).sum();
  }
  at::Tensor want = at::zeros_like(xs[me]);
  if (loss.requires_grad()) {
    const auto grads = torch::autograd::grad({loss}, {xs[me]}, {}, false, false, true);
    if (grads[0].defined()) want = grads[0];
  }
  const at::Tensor x = input_of(seed, me, c.shape(me), dtype).requires_grad_(true);
  const at::Tensor out = c.run(comm, x);
  if (out.requires_grad()) {
    if (is_unused(me)) torch::autograd::backward({tools::loss_without_gradient(out)});
    else torch::autograd::backward({out}, {vs[me]});
  }
  const at::Tensor got = x.grad().defined() ? x.grad() : at::zeros_like(x);
  const std::string why = compare(got, want.detach());
  return why.empty() ? "" : c.name + " backward (" + c10::toString(dtype) + "): " + why;
}

namespace {
double dot_product(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
}
double norm2(const at::Tensor& a) { return a.numel() ? a.to(at::kDouble).pow(2).sum().item<double>() : 0; }
}  // namespace

std::string check_adjoint(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                          double* relative_gap) {
  const int me = comm.rank();
  const at::Tensor x = input_of(seed, me, c.shape(me), at::kDouble).requires_grad_(true);
  const at::Tensor out = c.run(comm, x);
  const at::Tensor y = input_of(seed + 17, me, out.sizes().vec(), at::kDouble);
  // The identity is taken with the cotangent as drawn: an adjoint that wrote
  // into the tensor its caller still holds (instead of a copy) could
  // otherwise keep both sides equal while changing the caller's data.
  const at::Tensor y_drawn = y.clone();
  torch::autograd::backward({out}, {y});
  // Agreed on every rank before anything returns: the second pass below is
  // collective, and an adjoint may change the cotangent on some ranks only.
  const bool y_kept = sum_over_ranks(y.equal(y_drawn) ? 0.0 : 1.0) == 0;
  const at::Tensor gx = x.grad().defined() ? x.grad() : at::zeros_like(x);
  const double lhs = sum_over_ranks(dot_product(out.detach(), y_drawn));
  const double rhs = sum_over_ranks(dot_product(x.detach(), gx));
  const double scale = std::sqrt(sum_over_ranks(norm2(out.detach())) * sum_over_ranks(norm2(y_drawn))) +
                       std::sqrt(sum_over_ranks(norm2(x.detach())) * sum_over_ranks(norm2(gx)));
  const double gap = std::abs(lhs - rhs) / std::max(scale, 1e-300);
  if (relative_gap) *relative_gap = gap;
  if (!y_kept) return c.name + " backward changed the cotangent its caller holds (on some rank)";
  // The same cotangent arriving from inside the graph, as in training:
  // (F(x) * y).sum() hands the call's node a gradient only it holds, which
  // an adjoint may work on in place (owned_contiguous); it must give the
  // same gradient.
  {
    const at::Tensor x2 = input_of(seed, me, c.shape(me), at::kDouble).requires_grad_(true);
    (c.run(comm, x2) * y_drawn).sum().backward();
    const at::Tensor gx2 = x2.grad().defined() ? x2.grad() : at::zeros_like(x2);
    if (!at::allclose(gx2, gx, 1e-13, 1e-13))
      return c.name + " backward of a gradient made inside the graph differs from that of the "
                      "same cotangent passed to backward() (max difference " +
             std::to_string((gx2 - gx).abs().max().item<double>()) + " on rank " +
             std::to_string(me) + ")";
  }
  if (scale == 0) return c.name + " adjoint: every norm is zero (nothing was checked)";
  if (gap > 1e-10) {
    std::ostringstream os;
    os << c.name << " adjoint identity: <F x, y> = " << lhs << ", <x, F* y> = " << rhs
       << " (relative gap " << gap << ")";
    return os.str();
  }
  return "";
}

std::string check_gradient(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                           int cotangents) {
  const int me = comm.rank(), p = comm.size();
  const at::Tensor x0 = input_of(seed, me, c.shape(me), at::kDouble);
  // The loss: sum over ranks of <F(x)_r, v_r>.
  std::ostringstream problems;
  for (int k = 0; k < cotangents; ++k) {
    at::Tensor v;
    auto loss = [&](const at::Tensor& x) {
      at::NoGradGuard no_grad;
      const at::Tensor out = c.run(comm, x);
      if (!v.defined()) v = input_of(seed + 101 + k, me, out.sizes().vec(), at::kDouble);
      return sum_over_ranks(dot_product(out, v));
    };
    loss(x0);  // draws v
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor out = c.run(comm, x);
    torch::autograd::backward({out}, {v});
    const at::Tensor g = x.grad().defined() ? x.grad() : at::zeros_like(x);
    // Every rank walks every rank's elements in lockstep; only the owner
    // perturbs and compares.
    int64_t most = x0.numel();
    MPI_Request req;
    PARTITA_MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, &most, 1, MPI_INT64_T, MPI_MAX, harness_comm(), &req));
    mpi::wait(req, "check_gradient");
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
        if (std::abs(numeric - analytic) > atol + rtol * std::abs(numeric) && bad++ < 3)
          problems << c.name << " gradient of element " << i << " (cotangent " << k
                   << "): backward " << analytic << ", finite differences " << numeric << "; ";
      }
    }
  }
  return problems.str();
}

}  // namespace partita::testing::comm
