#include "partita/testing/module_checks.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "partita/mpi/runtime.hpp"
#include "partita/testing/lockstep.hpp"
#include "exact_zero.hpp"

namespace partita::testing {

namespace {

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

double dot_double(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0) return 0;
  return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
}

std::vector<int64_t> start_of(const ParameterShard& s) {
  return s.start.empty() ? std::vector<int64_t>(static_cast<size_t>(s.tensor.dim()), 0) : s.start;
}

// The box of `global` that shard `s` holds; throws a readable message when
// it does not fit.
at::Tensor box(const at::Tensor& global, const ParameterShard& s) {
  const auto start = start_of(s);
  if (static_cast<int64_t>(start.size()) != global.dim() || s.tensor.dim() != global.dim())
    throw std::runtime_error("shard of '" + s.name + "' of shape " + shape_text(s.tensor.sizes()) +
                             " does not fit the global shape " + shape_text(global.sizes()));
  at::Tensor b = global;
  for (int64_t d = 0; d < global.dim(); ++d) {
    if (start[d] < 0 || start[d] + s.tensor.size(d) > global.size(d))
      throw std::runtime_error("shard of '" + s.name + "' of shape " + shape_text(s.tensor.sizes()) + " at " +
                               shape_text(start) + " lies outside the global shape " + shape_text(global.sizes()));
    b = b.narrow(d, start[d], s.tensor.size(d));
  }
  return b;
}

// The global parameters of a case: the same on every rank.
ParameterMap draw_parameters(const DistributedModule& m, uint64_t seed) {
  ParameterMap out;
  uint64_t k = 0;
  for (const auto& [name, shape] : m.parameters) out[name] = rank_input(seed + 7001 + 13 * k++, 0, shape, m.dtype);
  return out;
}

// Writes each shard's slice of `globals` into it and clears its gradient.
void load(const std::vector<ParameterShard>& shards, const ParameterMap& globals) {
  at::NoGradGuard no_grad;
  for (const auto& s : shards) {
    const auto it = globals.find(s.name);
    if (it == globals.end()) throw std::runtime_error("a shard of '" + s.name + "', which is no global parameter");
    if (s.tensor.scalar_type() != it->second.scalar_type())
      throw std::runtime_error(std::string("shard of '") + s.name + "' is " + c10::toString(s.tensor.scalar_type()) +
                               ", the parameters are " + c10::toString(it->second.scalar_type()));
    s.tensor.copy_(box(it->second, s));
    s.tensor.mutable_grad() = at::Tensor();
  }
}

bool is_float_input(const DistributedModule& m, int j) { return !m.integer_inputs.count(j); }

std::vector<Tensors> draw_inputs(const DistributedModule& m, uint64_t seed) {
  std::vector<Tensors> xs;
  for (int r = 0; r < mpi::world_size(); ++r) {
    Tensors mine;
    const auto shapes = m.input_shapes(r);
    for (size_t j = 0; j < shapes.size(); ++j) {
      const auto it = m.integer_inputs.find(static_cast<int>(j));
      const auto high = m.integer_high.find(static_cast<int>(j));
      mine.push_back(rank_input(seed + 31 * j, r, shapes[j], it == m.integer_inputs.end() ? m.dtype : it->second,
                                high == m.integer_high.end() ? 8 : high->second));
    }
    xs.push_back(std::move(mine));
  }
  return xs;
}

Tensors leaves(const DistributedModule& m, const Tensors& xs) {
  Tensors out;
  for (size_t j = 0; j < xs.size(); ++j) {
    at::Tensor x = xs[j].detach().clone();
    if (is_float_input(m, static_cast<int>(j))) x.requires_grad_(true);
    out.push_back(x);
  }
  return out;
}

// Rank r's cotangents for outputs of these shapes.
Tensors cotangents(uint64_t seed, int r, const Tensors& outs, at::ScalarType dtype) {
  Tensors v;
  for (size_t j = 0; j < outs.size(); ++j) v.push_back(rank_input(seed + 29 + 7 * j, r, outs[j].sizes().vec(), dtype));
  return v;
}

// backward() of sum_j <outs_j, vs_j> over the outputs that require grad; at
// an unused rank, of a loss whose gradient comes back undefined.
void run_backward(const Tensors& outs, const Tensors& vs, bool unused) {
  std::vector<at::Tensor> roots, grads;
  at::Tensor dead;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j].requires_grad()) continue;
    if (unused) {
      const at::Tensor l = loss_without_gradient(outs[j]);
      dead = dead.defined() ? dead + l : l;
    } else {
      roots.push_back(outs[j]);
      grads.push_back(vs[j]);
    }
  }
  if (dead.defined()) torch::autograd::backward({dead});
  if (!roots.empty()) torch::autograd::backward(roots, grads);
}

// Per global parameter, how many ranks hold each element (over the world).
ParameterMap multiplicity(const DistributedModule& m, const std::vector<ParameterShard>& shards) {
  std::vector<double> flat;
  std::vector<std::pair<std::string, at::Tensor>> counts;
  for (const auto& [name, shape] : m.parameters) {
    at::Tensor c = at::zeros(shape, at::kDouble);
    for (const auto& s : shards)
      if (s.name == name) box(c, s).add_(1);
    counts.emplace_back(name, c);
    flat.insert(flat.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  flat = sum_over_ranks(std::move(flat));
  ParameterMap out;
  size_t at = 0;
  for (auto& [name, c] : counts) {
    out[name] = at::from_blob(flat.data() + at, c.sizes(), at::kDouble).clone();
    at += static_cast<size_t>(c.numel());
  }
  return out;
}

std::string named(const DistributedModule& m, const std::string& what, const std::string& why) {
  return why.empty() ? "" : m.name + " " + what + ": " + why;
}

// Adds one problem to a list of them, "; " between.
void append(std::string& problems, const std::string& one) {
  if (!one.empty()) problems += (problems.empty() ? "" : "; ") + one;
}

}  // namespace

std::string check_module_forward(const DistributedModule& m, uint64_t seed, const Tolerance& tol) {
  const int me = mpi::world_rank();
  const auto shards = m.shards();
  std::string problem;
  try {
    load(shards, draw_parameters(m, seed));
  } catch (const std::exception& e) {
    problem = m.name + " parameters: " + e.what();
  }
  // Every element of every global parameter is held by some rank.
  if (all_ranks(problem.empty())) {
    for (const auto& [name, c] : multiplicity(m, shards))
      if (c.numel() && c.eq(0).any().item<bool>())
        problem += m.name + " parameters: " + std::to_string(c.eq(0).sum().item<int64_t>()) + " element(s) of '" +
                   name + "' " + shape_text(c.sizes()) + " are held by no rank; ";
  }
  const auto xs = draw_inputs(m, seed);
  std::vector<Tensors> want;
  ParameterMap globals = draw_parameters(m, seed);
  {
    at::NoGradGuard no_grad;
    want = m.twin(xs, globals);
  }
  const Tensors got = m.run(xs[me]);
  if (got.size() != want.at(me).size())
    return problem + m.name + " forward: " + std::to_string(got.size()) + " outputs, the twin " +
           std::to_string(want[me].size());
  for (size_t j = 0; j < got.size(); ++j) {
    std::string why = compare(got[j], want[me][j], tol);
    if (why.empty())
      why = detail::zero_where_exact_is_not(got[j], want[me][j], [&] {
        at::NoGradGuard no_grad;
        std::vector<Tensors> x64;
        for (const auto& x : xs) x64.push_back(detail::in_float64(x));
        ParameterMap g64;
        for (const auto& [name, g] : globals) g64[name] = g.to(at::kDouble);
        return m.twin(x64, g64).at(me).at(j);
      });
    append(problem, named(m, "forward (output " + std::to_string(j) + ", " + c10::toString(m.dtype) + ")", why));
  }
  return problem;
}

std::string check_module_backward(const DistributedModule& m, uint64_t seed, const std::vector<int>& unused,
                                  const Tolerance& tol) {
  auto is_unused = [&](int r) { return std::find(unused.begin(), unused.end(), r) != unused.end(); };
  const int me = mpi::world_rank(), p = mpi::world_size();
  const auto shards = m.shards();
  const ParameterMap globals = draw_parameters(m, seed);
  std::string problem;
  try {
    load(shards, globals);
  } catch (const std::exception& e) {
    problem = m.name + " parameters: " + e.what() + "; ";
  }
  const auto xs = draw_inputs(m, seed);

  // The twin, differentiated in this rank's float inputs and the global
  // parameters (in that order), from every rank's inputs and the global
  // parameters as given (`in64`: in float64, for the all-zero guard).
  auto twin_gradients = [&](bool in64) {
    std::vector<Tensors> tx;
    for (int r = 0; r < p; ++r) tx.push_back(leaves(m, in64 ? detail::in_float64(xs[r]) : xs[r]));
    ParameterMap tp;
    for (const auto& [name, g] : globals)
      tp[name] = (in64 ? g.to(at::kDouble) : g).detach().clone().requires_grad_(true);
    const auto touts = m.twin(tx, tp);
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int r = 0; r < p; ++r) {
      // The cotangents of the dtype's twin, cast where the twin ran in float64.
      const Tensors v = cotangents(seed, r, touts.at(r), m.dtype);
      if (is_unused(r)) continue;
      for (size_t j = 0; j < touts[r].size(); ++j)
        if (touts[r][j].requires_grad()) loss = loss + (touts[r][j].to(at::kDouble) * v[j].to(at::kDouble)).sum();
    }
    std::vector<at::Tensor> wrt;
    for (size_t j = 0; j < tx[me].size(); ++j)
      if (is_float_input(m, static_cast<int>(j))) wrt.push_back(tx[me][j]);
    for (auto& [name, t] : tp) wrt.push_back(t);
    std::vector<at::Tensor> grads(wrt.size());
    if (loss.requires_grad()) grads = torch::autograd::grad({loss}, wrt, {}, false, false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = grads[i].defined() ? grads[i].detach() : at::zeros_like(wrt[i]).detach();
    return grads;
  };
  const std::vector<at::Tensor> want = twin_gradients(false);
  std::vector<at::Tensor> exact;  // twin_gradients(true), when a guard asks
  auto exact_at = [&](size_t i) {
    return [&, i] {
      if (exact.empty()) exact = twin_gradients(true);
      return exact.at(i);
    };
  };

  // This rank's module.
  const Tensors x = leaves(m, xs[me]);
  const Tensors out = m.run(x);
  run_backward(out, cotangents(seed, me, out, m.dtype), is_unused(me));

  std::string which = " (" + std::string(c10::toString(m.dtype));
  if (!unused.empty()) {
    which += ", outputs unused at rank";
    for (const int r : unused) which += " " + std::to_string(r);
  }
  which += ")";
  size_t k = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    if (!is_float_input(m, static_cast<int>(j))) continue;
    const at::Tensor g = x[j].grad().defined() ? x[j].grad() : at::zeros_like(x[j]);
    std::string why = compare(g, want[k], tol);
    if (why.empty()) why = detail::zero_where_exact_is_not(g, want[k], exact_at(k));
    ++k;
    append(problem, named(m, "gradient of input " + std::to_string(j) + which, why));
  }
  std::map<std::string, size_t> global_grad;  // the parameter's place in `want`
  for (const auto& [name, t] : globals) global_grad[name] = k++;
  for (const auto& s : shards) {
    const auto it = global_grad.find(s.name);
    if (it == global_grad.end()) continue;  // reported by load()
    at::Tensor want_s;
    try {
      want_s = box(want[it->second], s);
    } catch (const std::exception&) {
      continue;  // reported by load()
    }
    const at::Tensor g = s.tensor.grad().defined() ? s.tensor.grad() : at::zeros_like(s.tensor);
    std::ostringstream where;
    where << "gradient of '" << s.name << "' " << shape_text(s.tensor.sizes()) << " at " << shape_text(start_of(s)) << which;
    std::string why = compare(g, want_s, tol);
    if (why.empty()) why = detail::zero_where_exact_is_not(g, want_s, [&] { return box(exact_at(it->second)(), s); });
    append(problem, named(m, where.str(), why));
  }
  return problem;
}

std::string check_module_adjoint(const DistributedModule& m, uint64_t seed, Wrt wrt, double bound) {
  const int me = mpi::world_rank();
  if (m.dtype != at::kDouble) return m.name + " adjoint: the module must be built in float64";
  const auto shards = m.shards();
  std::string problem;
  const ParameterMap drawn = draw_parameters(m, seed);
  try {
    load(shards, drawn);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!all_ranks(problem.empty())) return m.name + " adjoint: " + (problem.empty() ? "another rank's shards" : problem);
  const Tensors x = leaves(m, draw_inputs(m, seed).at(me));
  const Tensors out = m.run(x);
  const Tensors y = cotangents(seed + 17, me, out, at::kDouble), y_drawn = [&] {
    Tensors c;
    for (const auto& t : y) c.push_back(t.clone());
    return c;
  }();
  run_backward(out, y, false);
  bool kept = true;
  for (size_t j = 0; j < y.size(); ++j) kept = kept && y[j].equal(y_drawn[j]);
  const bool y_kept = all_ranks(kept);

  // F(0): the varied argument set to zero, the other held.
  Tensors zero_out;
  double rhs_local = 0, u_norm = 0, g_norm = 0;
  if (wrt == Wrt::Parameters) {
    const auto mult = multiplicity(m, shards);
    for (const auto& s : shards) {
      const at::Tensor u = s.tensor.detach().clone();
      const at::Tensor g = s.tensor.grad().defined() ? s.tensor.grad() : at::zeros_like(s.tensor);
      const at::Tensor w = box(mult.at(s.name), s).clamp_min(1);
      rhs_local += dot_double(u / w, g);
      u_norm += dot_double(u * u / w, at::ones_like(u));
      g_norm += dot_double(g * g / w, at::ones_like(g));
    }
    ParameterMap zeros;
    for (const auto& [name, t] : drawn) zeros[name] = at::zeros_like(t);
    load(shards, zeros);
    at::NoGradGuard no_grad;
    zero_out = m.run(x);
  } else {
    Tensors z;
    for (size_t j = 0; j < x.size(); ++j) {
      const bool varied = is_float_input(m, static_cast<int>(j));
      if (varied) {
        const at::Tensor g = x[j].grad().defined() ? x[j].grad() : at::zeros_like(x[j]);
        rhs_local += dot_double(x[j].detach(), g);
        u_norm += dot_double(x[j].detach(), x[j].detach());
        g_norm += dot_double(g, g);
      }
      z.push_back(varied ? at::zeros_like(x[j]).detach() : x[j].detach());
    }
    at::NoGradGuard no_grad;
    zero_out = m.run(z);
  }
  double lhs_local = 0, f_norm = 0, y_norm = 0;
  for (size_t j = 0; j < out.size(); ++j) {
    const at::Tensor d = out[j].detach() - zero_out.at(j);
    lhs_local += dot_double(d, y_drawn[j]);
    f_norm += dot_double(d, d);
    y_norm += dot_double(y_drawn[j], y_drawn[j]);
  }
  const auto sums = sum_over_ranks(std::vector<double>{lhs_local, rhs_local, f_norm, y_norm, u_norm, g_norm});
  const double scale = std::sqrt(sums[2] * sums[3]) + std::sqrt(sums[4] * sums[5]);
  const double gap = std::abs(sums[0] - sums[1]) / std::max(scale, 1e-300);
  const std::string what = wrt == Wrt::Parameters ? "parameters" : "inputs";
  if (!y_kept) return m.name + " backward changed the cotangent its caller holds (on some rank)";
  if (scale == 0) return m.name + " adjoint in its " + what + ": every norm is zero (nothing was checked)";
  // An overflowing norm would make the scale infinite and any gap zero.
  if (!std::isfinite(scale) || !std::isfinite(sums[0]) || !std::isfinite(sums[1])) {
    std::ostringstream os;
    os << m.name << " adjoint identity in its " << what << ": not finite (<F(u) - F(0), y> = " << sums[0]
       << ", <u, F* y> = " << sums[1] << ", norms' scale " << scale << ")";
    return os.str();
  }
  if (!(gap <= bound)) {
    std::ostringstream os;
    os << m.name << " adjoint identity in its " << what << ": <F(u) - F(0), y> = " << sums[0]
       << ", <u, F* y> = " << sums[1] << " (relative gap " << gap << ", bound " << bound << ")";
    return os.str();
  }
  return "";
}

std::string check_module_finite_differences(const DistributedModule& m, uint64_t seed) {
  const int me = mpi::world_rank(), p = mpi::world_size();
  if (m.dtype != at::kDouble) return m.name + " finite differences: the module must be built in float64";
  const auto shards = m.shards();
  const ParameterMap globals = draw_parameters(m, seed);
  std::string problem;
  try {
    load(shards, globals);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!all_ranks(problem.empty()))
    return m.name + " finite differences: " + (problem.empty() ? "another rank's shards" : problem);
  const Tensors x0 = draw_inputs(m, seed).at(me);
  Tensors v;
  auto loss = [&](const Tensors& x) {
    at::NoGradGuard no_grad;
    const Tensors out = m.run(x);
    if (v.empty()) v = cotangents(seed + 101, me, out, at::kDouble);
    double local = 0;
    for (size_t j = 0; j < out.size(); ++j) local += dot_double(out[j], v[j]);
    return sum_over_ranks(local);
  };
  loss(x0);  // draws v
  const Tensors x = leaves(m, x0);
  run_backward(m.run(x), v, false);
  std::vector<at::Tensor> shard_grad;
  for (const auto& s : shards)
    shard_grad.push_back((s.tensor.grad().defined() ? s.tensor.grad() : at::zeros_like(s.tensor)).clone());

  constexpr double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  std::ostringstream problems;
  int bad = 0;
  auto judge = [&](const std::string& what, double numeric, double analytic) {
    if (!(std::abs(numeric - analytic) <= atol + rtol * std::abs(numeric)) && bad++ < 3)  // NaN fails
      problems << m.name << " gradient of " << what << ": backward " << analytic << ", finite differences "
               << numeric << "; ";
  };
  // Parameters: every rank walks every element of every global parameter;
  // the ranks holding it perturb their shards, and each compares its own.
  for (const auto& [name, g] : globals) {
    for (int64_t e = 0; e < g.numel(); ++e) {
      std::vector<int64_t> idx(static_cast<size_t>(g.dim()));
      for (int64_t d = g.dim() - 1, rest = e; d >= 0; --d) {
        idx[d] = rest % g.size(d);
        rest /= g.size(d);
      }
      std::vector<std::pair<size_t, std::vector<int64_t>>> held;  // (shard, local index)
      for (size_t i = 0; i < shards.size(); ++i) {
        if (shards[i].name != name) continue;
        const auto start = start_of(shards[i]);
        std::vector<int64_t> local(static_cast<size_t>(g.dim()));
        bool inside = true;
        for (int64_t d = 0; d < g.dim(); ++d) {
          local[d] = idx[d] - start[d];
          inside = inside && local[d] >= 0 && local[d] < shards[i].tensor.size(d);
        }
        if (inside) held.emplace_back(i, std::move(local));
      }
      // The element itself, whatever the shard's strides (a parameter may
      // be a transposed view).
      auto element = [](at::Tensor t, const std::vector<int64_t>& at) {
        for (int64_t i : at) t = t.select(0, i);
        return t;
      };
      auto nudge = [&](double by) {
        at::NoGradGuard no_grad;
        for (const auto& [i, local] : held) element(shards[i].tensor, local) += by;
      };
      nudge(eps);
      const double up = loss(x0);
      nudge(-2 * eps);
      const double down = loss(x0);
      nudge(eps);
      for (const auto& [i, local] : held)
        judge("'" + name + "' element " + shape_text(idx), (up - down) / (2 * eps),
              element(shard_grad[i], local).item<double>());
    }
  }
  // Float inputs, every rank's in turn.
  for (int r = 0; r < p; ++r) {
    for (size_t j = 0; j < m.input_shapes(r).size(); ++j) {
      if (!is_float_input(m, static_cast<int>(j))) continue;
      const Shape shape = m.input_shapes(r).at(j);
      int64_t n = 1;
      for (const auto s : shape) n *= s;
      for (int64_t i = 0; i < n; ++i) {
        Tensors xp = x0, xm = x0;
        if (r == me && j < x0.size()) {
          xp[j] = x0[j].clone();
          xm[j] = x0[j].clone();
          xp[j].view(-1)[i] += eps;
          xm[j].view(-1)[i] -= eps;
        }
        const double up = loss(xp), down = loss(xm);
        if (r == me && j < x.size()) {
          const at::Tensor gx = x[j].grad().defined() ? x[j].grad() : at::zeros_like(x[j]);
          judge("input " + std::to_string(j) + " element " + std::to_string(i), (up - down) / (2 * eps),
                gx.view(-1)[i].item<double>());
        }
      }
    }
  }
  return problems.str();
}

void check_module_all(const DistributedModule& m, uint64_t seed, Verdict& v, const ModuleCheckOptions& o) {
  if (o.forward()) v.expect_empty(check_module_forward(m, seed, o.tolerance()));
  if (o.backward()) {
    v.expect_empty(check_module_backward(m, seed, {}, o.tolerance()));
    if (mpi::world_size() > 1) v.expect_empty(check_module_backward(m, seed, {0}, o.tolerance()));
  }
  if (o.adjoint_inputs()) v.expect_empty(check_module_adjoint(m, seed, Wrt::Inputs));
  if (o.adjoint_parameters()) v.expect_empty(check_module_adjoint(m, seed, Wrt::Parameters));
  if (o.finite_differences()) v.expect_empty(check_module_finite_differences(m, seed));
}

}  // namespace partita::testing
