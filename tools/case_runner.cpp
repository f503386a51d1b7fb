#include "case_runner.hpp"

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
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/reference/all_gather.hpp"
#include "partita/reference/all_sum_reduce.hpp"
#include "partita/reference/reduce_scatter.hpp"
#include "partita/reference/broadcast.hpp"
#include "partita/reference/halo_exchange.hpp"
#include "partita/reference/repartition.hpp"
#include "partita/reference/sum_reduce.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::tools {

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
  // below 256, where bfloat16, float16 and float32 hold every integer.
  return at::randint(unsigned_type ? 0 : -8, 9, shape, gen, f64).to(dtype);
}

// How a result is compared with the reference's (issue 9): bit for bit, or
// elementwise within the dtype's precision (only where the values are random
// normal floats and the result is a sum, which MPI adds in another order).
enum class Compare { Exact, Elementwise };

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

bool close(const at::Tensor& got, const at::Tensor& want, Compare how, std::string* why) {
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
  const auto excess = (g - w).abs() - rtol * (w.abs() + typical);
  if (excess.max().item<double>() <= 0) return true;
  os << "values differ: " << (excess > 0).sum().item<int64_t>() << " of " << got.numel()
     << " elements beyond " << rtol << " * (|reference| + " << typical << "), max |diff| "
     << (g - w).abs().max().item<double>();
  *why = os.str();
  return false;
}

double inner64(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
}
double sq(const at::Tensor& a) { return inner64(a, a); }

// |<F x, y> - <x, F* y>| relative to the norms.
double adjoint_gap(double fx_y, double x_fty, double nfx, double ny, double nx, double nfty) {
  const double scale = std::max(std::sqrt(nfx * ny), std::sqrt(nx * nfty));
  return scale == 0 ? std::abs(fx_y - x_fty) : std::abs(fx_y - x_fty) / scale;
}

double adjoint_tolerance(at::ScalarType t) {
  if (t == at::kDouble) return 1e-10;
  if (t == at::kFloat) return 1e-4;
  return 5e-2;
}

// The output passes through unchanged, and its gradient comes back
// undefined: what a primitive's backward receives on a rank whose output
// does not reach the loss (PyTorch's gradcheck tests the same).
struct UndefinedGrad : torch::autograd::Function<UndefinedGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& y) {
    return y.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    return {at::Tensor()};
  }
};

// The class of a partita error, as a word for reports (issue 9: when both
// sides raise, the classes must agree).
std::string error_class(const Error& e) {
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const PartitionError*>(&e)) return "PartitionError";
  if (dynamic_cast<const DeadlineError*>(&e)) return "DeadlineError";
  return "Error";
}

bool listed(const Ranks& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

}  // namespace

at::Tensor loss_without_gradient(const at::Tensor& y) { return UndefinedGrad::apply(y).sum(); }

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

  // The reference, forward and (through autograd) backward.
  reference::Tensors yr, dyr(world);
  std::string expected_class, mpi_class;
  try {
    const auto rx = rpart(c.P_x);
    if (c.primitive == "broadcast") yr = reference::broadcast(rx, rpart(*c.P_y), xr, c.options);
    else if (c.primitive == "sum_reduce") yr = reference::sum_reduce(rx, rpart(*c.P_y), xr, c.options);
    else if (c.primitive == "repartition") yr = reference::repartition(rx, rpart(*c.P_y), xr);
    else if (c.primitive == "all_gather" && c.distdl) yr = reference::all_gather(rx, *c.distdl, xr);
    else if (c.primitive == "all_gather") yr = reference::all_gather(rx, c.axis, c.dim, xr);
    else if (c.primitive == "reduce_scatter" && c.distdl)
      yr = reference::reduce_scatter(rx, *c.distdl, xr);
    else if (c.primitive == "reduce_scatter") yr = reference::reduce_scatter(rx, c.axis, c.dim, xr);
    else if (c.primitive == "halo_exchange") yr = reference::halo_exchange(rx, c.left, c.right, xr);
    else yr = reference::all_sum_reduce(rx, c.axes, xr);
  } catch (const Error& e) {
    out.expected_error = e.what();
    expected_class = error_class(e);
  }

  // The MPI implementation: construction and forward, agreed on all ranks.
  std::string mpi_error;
  at::Tensor y;
  try {
    const auto px = mpart(c.P_x);
    if (c.primitive == "broadcast") {
      nn::Broadcast layer(px, mpart(*c.P_y), c.options);
      y = layer(out.x);
    } else if (c.primitive == "sum_reduce") {
      nn::SumReduce layer(px, mpart(*c.P_y), c.options);
      y = layer(out.x);
    } else if (c.primitive == "repartition") {
      nn::Repartition layer(px, mpart(*c.P_y));
      y = layer(out.x);
    } else if (c.primitive == "all_gather") {
      nn::AllGather layer = c.distdl ? nn::AllGather(px, *c.distdl) : nn::AllGather(px, c.axis, c.dim);
      y = layer(out.x);
    } else if (c.primitive == "reduce_scatter") {
      nn::ReduceScatter layer =
          c.distdl ? nn::ReduceScatter(px, *c.distdl) : nn::ReduceScatter(px, c.axis, c.dim);
      y = layer(out.x);
    } else if (c.primitive == "halo_exchange") {
      nn::HaloExchange layer(px, c.left, c.right);
      y = layer(out.x);
    } else {
      nn::AllSumReduce layer(px, c.axes);
      y = layer(out.x);
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
    if (c.P_y) involved = involved || std::count(c.P_y->ranks.begin(), c.P_y->ranks.end(), me) > 0;
    const bool same_class = mpi_class == expected_class;
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
  if (!close(out.y, yr[me].detach(), copy ? Compare::Exact : sums, &why))
    problems.push_back("forward " + why);
  if (out.y.numel() > 0 && out.x.numel() > 0 && out.y.data_ptr() == out.x.data_ptr())
    problems.push_back("forward output shares the input's storage (in place)");

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

    // Adjoint identity, summed over all workers: MPI (reduced) and reference.
    double local[6] = {inner64(out.y, dyr[me]), inner64(out.x.detach(), out.dx), sq(out.y),
                       sq(dyr[me]), sq(out.x.detach()), sq(out.dx)};
    double global[6];
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Iallreduce(local, global, 6, MPI_DOUBLE, MPI_SUM, mpi::world_comm(), &req));
    mpi::wait(req, "run_case adjoint");
    // AllGather's scale_backward makes backward the adjoint divided by the
    // factor: the identity is <F x, y> = factor * <x, B y>.
    double factor = 1;
    if (c.distdl)
      for (int d : c.distdl->scale_backward) factor *= static_cast<double>(c.P_x.shape.at(d));
    gaps[0] = adjoint_gap(global[0], factor * global[1], global[2], global[3], global[4],
                          factor * factor * global[5]);
    double r[6] = {0, 0, 0, 0, 0, 0};
    for (int w = 0; w < world; ++w) {
      const auto yw = yr[w].detach(), xw = xr[w].detach();
      r[0] += inner64(yw, dyr[w]);
      r[1] += inner64(xw, dxr[w]);
      r[2] += sq(yw);
      r[3] += sq(dyr[w]);
      r[4] += sq(xw);
      r[5] += sq(dxr[w]);
    }
    gaps[1] = adjoint_gap(r[0], factor * r[1], r[2], r[3], r[4], factor * factor * r[5]);
    const double tol = adjoint_tolerance(dtype);
    if (gaps[0] > tol) problems.push_back("MPI adjoint identity off by " + std::to_string(gaps[0]));
    if (gaps[1] > tol) problems.push_back("reference adjoint identity off by " + std::to_string(gaps[1]));
    // An all-zero result proves nothing: the outputs must carry something.
    if (global[2] == 0 && global[4] > 0 && r[2] > 0) problems.push_back("all outputs are zero");
  }
  out.adjoint_mpi = gaps[0];
  out.adjoint_reference = gaps[1];
  out.ok = problems.empty();
  std::ostringstream os;
  if (out.ok) {
    os << "forward" << (differentiable ? ", backward and adjoint (gap " : "") ;
    if (differentiable) os << gaps[0] << ")";
    os << " match the reference; y " << shape_string(shape_of(out.y));
  } else {
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
  }
  out.summary = os.str();
  return out;
}

}  // namespace partita::tools
