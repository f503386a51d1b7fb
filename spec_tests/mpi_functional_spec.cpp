// Issue 9 A3: every primitive's functional form (partita/nn/functional.hpp)
// against its torch::nn module on the same inputs: the forward outputs and
// the input gradients must be bit-identical, with a plan built on its own
// and with the module's own plan (through DistDL's *Function names).
// Partitions are drawn from the world size, so the same tests run at 1, 2
// and 4 ranks with teams of 1, 2 and 2x2 workers.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <torch/torch.h>

#include <cstring>
#include <functional>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/functional.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"

namespace partita::spec {
namespace {

namespace F = partita::nn::functional;
using Layer = std::function<at::Tensor(const at::Tensor&)>;

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

// Bit for bit: dtype, shape and every byte (so -0.0 differs from 0.0).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;  // (an empty tensor's data may be null: no memcmp on it)
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

// The grid every test uses: k x m workers (m = 2 from 2 ranks on), all of
// the world in reverse order, so that partition rank and world rank differ.
struct Grid {
  int64_t k, m;
  Ranks all, last_row;  // every worker; the m workers of a 1 x m partition
};
Grid grid() {
  const int n = mpi::world_size();
  Grid g;
  g.m = n >= 2 ? 2 : 1;
  g.k = n / g.m;
  for (int r = n - 1; r >= 0; --r) g.all.push_back(r);
  for (int64_t j = 0; j < g.m; ++j) g.last_row.push_back(static_cast<int>(j));
  return g;
}
mpi::CartesianPartition cartesian(const Ranks& ranks, const Shape& shape) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(
      shape);
}

// Random normal values that depend on the rank and a salt.
at::Tensor random(const Shape& shape, int salt, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + mpi::world_rank());
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

struct Run {
  at::Tensor y, dx;
};
// y = layer(x) and x's gradient for a random cotangent (the same for every
// layer given the same output shape).
Run run(const Layer& layer, const at::Tensor& x) {
  const at::Tensor leaf = x.detach().clone().requires_grad_(true);
  Run r;
  r.y = layer(leaf);
  const Shape ys(r.y.sizes().begin(), r.y.sizes().end());
  torch::autograd::backward({r.y}, {random(ys, 7, r.y.scalar_type())});
  r.dx = leaf.grad();
  r.y = r.y.detach();
  return r;
}

// The module, the function on a plan of its own and the function on the
// module's plan: same outputs and gradients, bit for bit, on every rank.
void expect_same(const std::string& what, const at::Tensor& x, const Layer& module,
                 const Layer& function, const Layer& on_module_plan) {
  const Run a = run(module, x), b = run(function, x), c = run(on_module_plan, x);
  bool ok = same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && same_bits(a.y, c.y) &&
            same_bits(a.dx, c.dx);
  EXPECT_TRUE(ok) << what << " on rank " << mpi::world_rank() << ": module y " << a.y
                  << "\nfunction y " << b.y << "\nmodule dx " << a.dx << "\nfunction dx " << b.dx;
  // Something moved: a gradient reaches every input that has elements.
  if (x.numel() > 0) ok = ok && a.dx.defined() && a.dx.abs().sum().item<double>() > 0;
  EXPECT_TRUE(agreed(ok)) << what;
}

class Functional : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(Functional, BroadcastAndSumReduce) {
  const Grid g = grid();
  const auto row = cartesian(g.last_row, {1, g.m}), full = cartesian(g.all, {g.k, g.m});
  const auto o = Options().preserve_batch(true);
  const at::Tensor xb = row.active() ? random({3, 4}, 1, GetParam()) : at::zeros({0}, GetParam());
  nn::Broadcast b(row, full, o);
  const F::BroadcastPlan pb(row, full, o);
  expect_same("broadcast", xb, b, [&](const at::Tensor& x) { return F::broadcast(x, pb); },
              [&](const at::Tensor& x) { return F::BroadcastFunction::apply(x, b->plan()); });

  const at::Tensor xs = random({3, 4}, 2, GetParam());
  nn::SumReduce s(full, row, o);
  const F::SumReducePlan ps(full, row, o);
  expect_same("sum_reduce", xs, s, [&](const at::Tensor& x) { return F::sum_reduce(x, ps); },
              [&](const at::Tensor& x) { return F::SumReduceFunction::apply(x, s->plan()); });
}

TEST_P(Functional, AllSumReduce) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  const at::Tensor x = random({2, 5}, 3, GetParam());
  nn::AllSumReduce a(full, std::vector<int>{0, 1});
  const F::AllSumReducePlan p(full, {0, 1});
  expect_same("all_sum_reduce", x, a, [&](const at::Tensor& v) { return F::all_sum_reduce(v, p); },
              [&](const at::Tensor& v) { return F::AllSumReduceFunction::apply(v, a->plan()); });
}

TEST_P(Functional, AllGatherAndReduceScatter) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  // Uneven pieces along the gathered dimension: worker r holds r + 1 rows.
  const at::Tensor xg = random({mpi::world_rank() + 1, 3}, 4, GetParam());
  nn::AllGather ag(full, 0, 0);
  const F::AllGatherPlan pg(full, 0, 0);
  expect_same("all_gather", xg, ag, [&](const at::Tensor& v) { return F::all_gather(v, pg); },
              [&](const at::Tensor& v) { return F::AllGatherFunction::apply(v, ag->plan()); });

  // DistDL's form with scale_backward.
  const auto keep = GatherAxes().axes_keep(std::vector<int>{0}).scale_backward({1});
  const at::Tensor xk = random({2, 3}, 5, GetParam());
  nn::AllGather ak(full, keep);
  const F::AllGatherPlan pk(full, keep);
  expect_same("all_gather axes_keep scale_backward", xk, ak,
              [&](const at::Tensor& v) { return F::all_gather(v, pk); },
              [&](const at::Tensor& v) { return F::AllGatherFunction::apply(v, ak->plan()); });

  const at::Tensor xr = random({3, 5}, 6, GetParam());
  nn::ReduceScatter rs(full, 1, 1);
  const F::ReduceScatterPlan pr(full, 1, 1);
  expect_same("reduce_scatter", xr, rs, [&](const at::Tensor& v) { return F::reduce_scatter(v, pr); },
              [&](const at::Tensor& v) { return F::ReduceScatterFunction::apply(v, rs->plan()); });
}

TEST_P(Functional, RepartitionAndHaloExchange) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  const auto other = cartesian(g.last_row, {g.m, 1});
  // A 5 x 7 global tensor, balanced over k x m.
  const int64_t me = full.rank();
  const Index i = full.cartesian_index(static_cast<int>(me));
  const Shape piece{5 / g.k + (i[0] < 5 % g.k), 7 / g.m + (i[1] < 7 % g.m)};
  const at::Tensor x = random(piece, 8, GetParam());
  nn::Repartition rp(full, other);
  const F::RepartitionPlan pp(full, other);
  expect_same("repartition", x, rp, [&](const at::Tensor& v) { return F::repartition(v, pp); },
              [&](const at::Tensor& v) {
                return F::DistributedTransposeFunction::apply(v, rp->plan());
              });

  // Windows of that tiling with ghosts of width 1 on every side.
  const at::Tensor w = random({piece[0] + 2, piece[1] + 2}, 9, GetParam());
  nn::HaloExchange h(full, Shape{1, 1}, Shape{1, 1});
  const F::HaloExchangePlan ph(full, {1, 1}, {1, 1});
  expect_same("halo_exchange", w, h, [&](const at::Tensor& v) { return F::halo_exchange(v, ph); },
              [&](const at::Tensor& v) { return F::HaloExchangeFunction::apply(v, h->plan()); });
}

// halo_exchange_, DistDL's in-place form (issue 15): the same values and
// gradients as the out-of-place form, bit for bit, written into the input
// itself; a cotangent the caller still holds is left alone while a fresh
// one may be reused; the history of a view is rebased through its base; a
// leaf that requires grad is refused on every rank.
TEST_P(Functional, HaloExchangeInPlace) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  const Index i = full.cartesian_index(full.rank());
  const Shape window{5 / g.k + (i[0] < 5 % g.k) + 2, 7 / g.m + (i[1] < 7 % g.m) + 2};
  const at::Tensor w = random(window, 9, GetParam());
  const at::Tensor c = random(window, 10, GetParam());  // the cotangent
  const at::Tensor pristine = c.clone();                 // never handed to autograd
  const F::HaloExchangePlan ph(full, {1, 1}, {1, 1});
  nn::HaloExchange module(full, Shape{1, 1}, Shape{1, 1}, nn::HaloExchangeImpl::Storage::kInPlace);

  // Out of place: the expected values and gradient.
  const at::Tensor leaf0 = w.clone().requires_grad_(true);
  const at::Tensor y0 = F::halo_exchange(leaf0, ph);
  torch::autograd::backward({y0}, {c});
  // A cotangent the caller holds is never changed (had it been, every
  // later use of c would carry the change and could hide it: the adjoint
  // of an adjoint's output is that output).
  EXPECT_TRUE(agreed(same_bits(c, pristine))) << "out of place, rank " << mpi::world_rank();

  struct Form {
    const char* name;
    std::function<at::Tensor(const at::Tensor&)> call;
    bool held;  // backward with a cotangent the test keeps (else a fresh one)
  };
  const std::vector<Form> forms = {
      {"halo_exchange_, held cotangent", [&](const at::Tensor& v) { return F::halo_exchange_(v, ph); }, true},
      {"halo_exchange_, fresh gradient", [&](const at::Tensor& v) { return F::halo_exchange_(v, ph); }, false},
      {"HaloExchange kInPlace", [&](const at::Tensor& v) { return module(v); }, false},
      {"HaloExchangeInPlaceFunction",
       [&](const at::Tensor& v) { return F::HaloExchangeInPlaceFunction::apply(v, ph); }, true},
  };
  for (const auto& f : forms) {
    const at::Tensor leaf = w.clone().requires_grad_(true);
    const at::Tensor x = leaf * 1;  // not a leaf: may change in place
    const auto version = x._version();
    const at::Tensor held = c.clone();
    const at::Tensor y = f.call(x);
    bool ok = y.data_ptr() == x.data_ptr() && x._version() > version;
    ok = ok && same_bits(y.detach(), y0.detach());
    if (f.held) {
      torch::autograd::backward({y}, {held});
      ok = ok && same_bits(held, pristine);  // the caller's cotangent is untouched
    } else {
      (y * c).sum().backward();
    }
    ok = ok && same_bits(leaf.grad(), leaf0.grad());
    EXPECT_TRUE(agreed(ok)) << f.name << " on rank " << mpi::world_rank() << ": y " << y
                            << "\nexpected " << y0 << "\ngrad " << leaf.grad() << "\nexpected "
                            << leaf0.grad();
  }

  // A view (the transpose of a window stored transposed): its base changes
  // and the gradient reaches the base's leaf through the view.
  {
    const at::Tensor leaf = w.t().contiguous().requires_grad_(true);
    const at::Tensor base = leaf * 1;
    const at::Tensor y = F::halo_exchange_(base.t(), ph);
    (base.t() * c).sum().backward();
    const bool ok = same_bits(y.detach(), y0.detach()) && same_bits(base.t().detach(), y0.detach()) &&
                    same_bits(leaf.grad().t(), leaf0.grad());
    EXPECT_TRUE(agreed(ok)) << "in place on a view, rank " << mpi::world_rank();
  }

  // Rank 0 passes a leaf that requires grad, the others a computed tensor:
  // every rank raises the same ShapeError, and rank 0's window is intact.
  {
    const at::Tensor leaf = w.clone().requires_grad_(true);
    const at::Tensor x = mpi::world_rank() == 0 ? leaf : leaf * 1;
    std::string rule;
    try {
      F::halo_exchange_(x, ph);
    } catch (const ShapeError& e) {
      rule = e.rule();
    }
    EXPECT_TRUE(agreed(rule == rule_code::kInPlaceLeaf)) << "rank " << mpi::world_rank() << ": '" << rule << "'";
    EXPECT_TRUE(same_bits(leaf.detach(), w));
  }
  // Under grad mode off a leaf that requires grad changes in place, as in
  // autograd (and DistDL under no_grad): every rank's ghosts are filled.
  {
    const at::Tensor leaf = w.clone().requires_grad_(true);
    std::string error;
    {
      at::NoGradGuard off;
      try {
        F::halo_exchange_(leaf, ph);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    EXPECT_TRUE(agreed(error.empty() && same_bits(leaf.detach(), y0.detach())))
        << "under NoGradGuard, rank " << mpi::world_rank() << ": '" << error << "'";
  }
  // On the last rank only, one of chunk's outputs (a view autograd cannot
  // rebase), then an inference tensor outside InferenceMode: every rank
  // raises input.in_place_refused before anything moves, and the last
  // rank's tensor is intact.
  for (const bool inference : {false, true}) {
    const bool odd = mpi::world_rank() == mpi::world_size() - 1;
    at::Tensor x;
    at::Tensor whole;
    if (odd && inference) {
      c10::InferenceMode on;
      x = w.clone();
    } else if (odd) {
      whole = at::cat({w, w}).requires_grad_(true) * 1;
      x = whole.chunk(2, 0)[0];
    } else {
      x = w.clone().requires_grad_(true) * 1;
    }
    std::string rule;
    try {
      F::halo_exchange_(x, ph);
    } catch (const ShapeError& e) {
      rule = e.rule();
    }
    EXPECT_TRUE(agreed(rule == rule_code::kInPlaceRefused))
        << (inference ? "an inference tensor" : "a chunk") << " on the last rank; rank " << mpi::world_rank() << ": '"
        << rule << "'";
    if (odd) EXPECT_TRUE(same_bits(x.detach(), w));
  }
}

// Plans made once (issue 15): one layer called with a dozen shapes in
// turn, twice round (more than the eight plans a layer keeps, so plans are
// evicted and made again), gives what a fresh layer gives, bit for bit;
// an input that does not tile after cached good ones raises on every rank,
// and the layer works again afterwards.
TEST_P(Functional, PlansMadeOnce) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  const auto other = cartesian(g.last_row, {g.m, 1});
  const Index i = full.cartesian_index(full.rank());
  nn::Repartition reused_r(full, other);
  nn::AllGather reused_g(full, 1, 1);
  nn::HaloExchange reused_h(full, Shape{1, 1}, Shape{1, 1});
  auto piece = [&](int64_t rows, int64_t cols) {
    return Shape{rows / g.k + (i[0] < rows % g.k), cols / g.m + (i[1] < cols % g.m)};
  };
  for (int round = 0; round < 2; ++round) {
    for (int64_t n = 2; n < 14; ++n) {
      const Shape p = piece(n + 3, n);
      const at::Tensor x = random(p, static_cast<int>(n), GetParam());
      const at::Tensor w = random({p[0] + 2, p[1] + 2}, static_cast<int>(n) + 50, GetParam());
      nn::Repartition fresh_r(full, other);
      nn::AllGather fresh_g(full, 1, 1);
      nn::HaloExchange fresh_h(full, Shape{1, 1}, Shape{1, 1});
      const auto a = run(reused_r, x), b = run(fresh_r, x);
      const auto c = run(reused_g, x), d = run(fresh_g, x);
      const auto e = run(reused_h, w), f = run(fresh_h, w);
      const bool ok = same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && same_bits(c.y, d.y) &&
                      same_bits(c.dx, d.dx) && same_bits(e.y, f.y) && same_bits(e.dx, f.dx);
      EXPECT_TRUE(agreed(ok)) << "round " << round << ", " << n << " columns, rank "
                              << mpi::world_rank();
    }
  }
  if (mpi::world_size() < 2) return;
  // Worker 0's piece one row short: not a tiling (for the gather, a
  // team whose shapes differ outside dimension 1).
  Shape bad = piece(8, 7);
  if (mpi::world_rank() == 0) bad[0] -= 1;
  const at::Tensor xb = random(bad, 99, GetParam());
  for (const auto* layer : {"repartition", "all_gather"}) {
    std::string rule;
    try {
      std::string(layer) == "repartition" ? reused_r(xb) : reused_g(xb);
    } catch (const ShapeError& e) {
      rule = e.rule();
    }
    EXPECT_TRUE(agreed(!rule.empty())) << layer << ": rank " << mpi::world_rank() << " raised '" << rule << "'";
  }
  const at::Tensor x = random(piece(8, 7), 5, GetParam());
  nn::Repartition fresh_r(full, other);
  EXPECT_TRUE(agreed(same_bits(run(reused_r, x).y, run(fresh_r, x).y)));
}

// Large strided pieces are packed and unpacked by partita, contiguous ones
// sent in place, small strided ones addressed by datatypes (issue 15): the
// same bits as MPI_Alltoallw moving every piece by datatype, forward and
// adjoint, for a 2-D tiling into another (row and column blocks of pieces
// of 64 KiB and more) and back.
TEST_P(Functional, RepartitionLargePieces) {
  const Grid g = grid();
  const auto full = cartesian(g.all, {g.k, g.m});
  const auto rows = cartesian(g.all, {g.k * g.m, 1});
  const Index i = full.cartesian_index(full.rank());
  const int64_t n = 384;  // 384 x 384 elements: pieces of 64-576 KiB
  const Shape piece{n / g.k + (i[0] < n % g.k), n / g.m + (i[1] < n % g.m)};
  const at::Tensor x = random(piece, 11, GetParam());
  for (const auto& [from, to, input] :
       {std::tuple{full, rows, x}, std::tuple{rows, full, random({n / (g.k * g.m) + (rows.rank() < n % (g.k * g.m)), n}, 12, GetParam())}}) {
    nn::Repartition p2p(from, to), a2aw(from, to, nn::RepartitionExchange::kAlltoallw);
    const auto a = run(p2p, input), b = run(a2aw, input);
    EXPECT_TRUE(agreed(same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && a.y.numel() > 0))
        << "rank " << mpi::world_rank();
  }
}

// Constructor arguments every rank must pass alike, agreed when the layer
// is built: an all-gather's tensor dimension (another dim on one rank moved
// the same bytes into another shape, and the adjoint summed mismatched
// elements, silently) and a repartition's exchange (a collective on some
// ranks and messages on others waited for ever). Every rank raises
// partition.arguments_differ, and the layers built alike work after it.
TEST(FunctionalErrors, ConstructorArgumentsDifferOnOneRank) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto line = mpi::Partition::world().create_cartesian_topology_partition({n});
  const auto rule_of = [](const std::function<void()>& build) {
    try {
      build();
    } catch (const PartitionError& e) {
      return e.rule();
    }
    return std::string();
  };
  EXPECT_TRUE(agreed(rule_of([&] { nn::AllGather g(line, 0, me == n - 1 ? 1 : 0); }) == rule_code::kArgumentsDiffer))
      << "AllGather on rank " << me;
  EXPECT_TRUE(agreed(rule_of([&] { nn::ReduceScatter r(line, 0, me == 0 ? 1 : 0); }) == rule_code::kArgumentsDiffer))
      << "ReduceScatter on rank " << me;
  EXPECT_TRUE(agreed(rule_of([&] {
                nn::Repartition r(line, line, me == 0 ? nn::RepartitionExchange::kAlltoallw
                                                      : nn::RepartitionExchange::kPointToPoint);
              }) == rule_code::kArgumentsDiffer))
      << "Repartition on rank " << me;
  nn::AllGather g(line, 0, 0);
  const at::Tensor y = g(at::full({2}, me + 1.0, at::kDouble));
  EXPECT_TRUE(agreed(y.numel() == 2 * n && y[2 * n - 1].item<double>() == n));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Functional, ::testing::Values(at::kDouble, at::kFloat),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace partita::spec
