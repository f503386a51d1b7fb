// The module checks must be able to fail: each on the bug it is meant for.
// The module under test is y_r = x_r * w + c, with w ([n]) replicated on
// every rank and c sharded (rank r holds entry r of a [world] vector, added
// to every element). Its correct backward sums w's gradient over the world
// (a hook with sum_over_ranks); the planted ones forget the sum, double it,
// place c's shard at the wrong entry, or are not affine in w.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "partita/mpi/runtime.hpp"
#include "partita/testing/module_checks.hpp"

namespace partita::testing {
namespace {

enum class Plant { kNone, kNoSum, kDoubled, kWrongStart, kSquare, kNaN, kHuge };

struct Toy {
  int64_t n = 3;
  Plant plant = Plant::kNone;
  at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor c = at::zeros({1}, at::kDouble).requires_grad_(true);

  Toy(Plant p) : plant(p) {
    if (plant == Plant::kNoSum) return;
    w.register_hook([this](const at::Tensor& g) {
      std::vector<double> v(g.data_ptr<double>(), g.data_ptr<double>() + g.numel());
      v = sum_over_ranks(std::move(v));
      at::Tensor s = at::tensor(v, at::kDouble);
      if (plant == Plant::kNaN) return s * std::nan("");
      if (plant == Plant::kHuge) s[0] += 1e200;  // its square overflows
      return plant == Plant::kDoubled ? s * 2 : s;
    });
  }

  DistributedModule module() {
    const int me = mpi::world_rank(), p = mpi::world_size();
    DistributedModule m;
    m.name = "toy";
    m.run = [this](const Tensors& xs) {
      const at::Tensor wu = plant == Plant::kSquare ? w * w : w;
      return Tensors{xs[0] * wu + c};
    };
    m.shards = [this, me, p] {
      const int64_t at = plant == Plant::kWrongStart ? (me + 1) % p : me;
      return std::vector<ParameterShard>{{"w", w, {}}, {"c", c, {at}}};
    };
    m.parameters = {{"w", {n}}, {"c", {p}}};
    m.input_shapes = [this](int r) { return std::vector<Shape>{{r + 1, n}}; };
    m.twin = [this](const std::vector<Tensors>& xs, const ParameterMap& g) {
      std::vector<Tensors> ys;
      for (size_t r = 0; r < xs.size(); ++r) {
        const at::Tensor wu = g.at("w");
        const at::Tensor c_all = g.at("c");
        const auto i = static_cast<int64_t>(r);
        ys.push_back({xs[r][0] * wu + (i < c_all.size(0) ? c_all.narrow(0, i, 1) : at::zeros({1}, at::kDouble))});
      }
      return ys;
    };
    return m;
  }
};

TEST(ModuleChecks, PassOnACorrectModule) {
  Toy toy(Plant::kNone);
  const auto m = toy.module();
  PARTITA_EXPECT_AGREED(check_module_forward(m, 5));
  PARTITA_EXPECT_AGREED(check_module_backward(m, 5));
  // (Not with an output unused: the toy's hook, a collective, runs only
  // where a gradient arrives; partita's layers run theirs regardless.)
  PARTITA_EXPECT_AGREED(check_module_adjoint(m, 5, Wrt::Parameters));
  PARTITA_EXPECT_AGREED(check_module_adjoint(m, 5, Wrt::Inputs));
  PARTITA_EXPECT_AGREED(check_module_finite_differences(m, 5));
}

TEST(ModuleChecks, AReplicatedGradientNotSummedFailsBackward) {
  if (mpi::world_size() == 1) GTEST_SKIP() << "one rank: nothing to sum";
  Toy toy(Plant::kNoSum);
  const std::string why = agree(check_module_backward(toy.module(), 5));
  EXPECT_NE(why.find("toy gradient of 'w' [3] at [0]"), std::string::npos) << why;
  const std::string fd = agree(check_module_finite_differences(toy.module(), 5));
  EXPECT_NE(fd.find("toy gradient of 'w' element"), std::string::npos) << fd;
}

TEST(ModuleChecks, ADoubledGradientFailsBackwardAndFiniteDifferences) {
  Toy toy(Plant::kDoubled);
  const std::string why = agree(check_module_backward(toy.module(), 5));
  EXPECT_NE(why.find("gradient of 'w'"), std::string::npos) << why;
  const std::string fd = agree(check_module_finite_differences(toy.module(), 5));
  EXPECT_NE(fd.find("gradient of 'w' element"), std::string::npos) << fd;
  const std::string adj = agree(check_module_adjoint(toy.module(), 5, Wrt::Parameters));
  EXPECT_NE(adj.find("adjoint identity in its parameters"), std::string::npos) << adj;
}

// A NaN gradient fails finite differences (NaN compares false both ways);
// an element whose square overflows fails the adjoint identity instead of
// making its scale infinite and every gap zero.
TEST(ModuleChecks, NonFiniteGradientsFail) {
  Toy nan(Plant::kNaN);
  const std::string fd = agree(check_module_finite_differences(nan.module(), 5));
  EXPECT_NE(fd.find("gradient of 'w' element"), std::string::npos) << fd;
  Toy huge(Plant::kHuge);
  const std::string adj = agree(check_module_adjoint(huge.module(), 5, Wrt::Parameters));
  EXPECT_NE(adj.find("adjoint identity in its parameters: not finite"), std::string::npos) << adj;
}

// A bfloat16 module y_r = x_r * s_r * 0.05, s sharded one entry per rank:
// outputs and gradients near 0.05, which the 16-bit bound (absolute below
// 1) cannot tell from zeros. Zeros in place of its output, its input's
// gradient or its parameter's gradient fail against the twin in float64.
TEST(ModuleChecks, SixteenBitZerosFailWhereTheExactResultIsNot) {
  enum class Wrong { none, zero_output, zero_input_gradient, zero_parameter_gradient };
  const int me = mpi::world_rank(), p = mpi::world_size();
  for (const Wrong wrong : {Wrong::none, Wrong::zero_output, Wrong::zero_input_gradient, Wrong::zero_parameter_gradient}) {
    const at::Tensor s = at::ones({1}, at::kBFloat16).requires_grad_(true);
    DistributedModule m;
    m.name = "scaled";
    m.dtype = at::kBFloat16;
    m.run = [&](const Tensors& xs) {
      if (wrong == Wrong::zero_output) return Tensors{at::zeros_like(xs[0])};
      const at::Tensor x = wrong == Wrong::zero_input_gradient ? xs[0].detach() : xs[0];
      const at::Tensor w = wrong == Wrong::zero_parameter_gradient ? s.detach() : s;
      return Tensors{x * w * 0.05};
    };
    m.shards = [&] { return std::vector<ParameterShard>{{"s", s, {me}}}; };
    m.parameters = {{"s", {p}}};
    m.input_shapes = [](int) { return std::vector<Shape>{{4, 3}}; };
    m.twin = [](const std::vector<Tensors>& xs, const ParameterMap& g) {
      std::vector<Tensors> ys;
      for (size_t r = 0; r < xs.size(); ++r) ys.push_back({xs[r][0] * g.at("s").narrow(0, static_cast<int64_t>(r), 1) * 0.05});
      return ys;
    };
    const std::string forward = agree(check_module_forward(m, 9));
    const std::string backward = agree(check_module_backward(m, 9));
    switch (wrong) {
      case Wrong::none:
        EXPECT_EQ(forward, "");
        EXPECT_EQ(backward, "");
        break;
      case Wrong::zero_output:
        EXPECT_NE(forward.find("forward (output 0, BFloat16): all-zero output (the twin's in float64"),
                  std::string::npos) << forward;
        break;
      case Wrong::zero_input_gradient:
        EXPECT_EQ(forward, "");
        EXPECT_NE(backward.find("gradient of input 0 (BFloat16): all-zero output (the twin's in float64"),
                  std::string::npos) << backward;
        break;
      case Wrong::zero_parameter_gradient:
        EXPECT_EQ(forward, "");
        EXPECT_NE(backward.find("gradient of 's' [1] at [" + std::to_string(me) +
                                "] (BFloat16): all-zero output (the twin's in float64"),
                  std::string::npos) << backward;
        break;
    }
  }
}

// A parameter whose leaf is a transposed tensor, held by rank 0 alone:
// finite differences perturb its elements in place on rank 0 while the
// others run the same losses.
TEST(ModuleChecks, AParameterStoredTransposedIsPerturbedInPlace) {
  const at::Tensor w = at::ones({3, 3}, at::kDouble).t().requires_grad_(true);
  ASSERT_FALSE(w.is_contiguous());
  const int me = mpi::world_rank();
  DistributedModule m;
  m.name = "transposed";
  m.run = [&](const Tensors& xs) { return Tensors{me == 0 ? at::matmul(xs[0], w) : xs[0] * 1}; };
  m.shards = [&] { return me == 0 ? std::vector<ParameterShard>{{"w", w, {0, 0}}} : std::vector<ParameterShard>{}; };
  m.parameters = {{"w", {3, 3}}};
  m.input_shapes = [](int r) { return std::vector<Shape>{{r + 1, 3}}; };
  m.twin = [](const std::vector<Tensors>& xs, const ParameterMap& g) {
    std::vector<Tensors> ys;
    for (size_t r = 0; r < xs.size(); ++r) ys.push_back({r == 0 ? at::matmul(xs[r][0], g.at("w")) : xs[r][0] * 1});
    return ys;
  };
  PARTITA_EXPECT_AGREED(check_module_finite_differences(m, 5));
  PARTITA_EXPECT_AGREED(check_module_backward(m, 5));
}

TEST(ModuleChecks, AShardAtTheWrongPlaceFailsForward) {
  if (mpi::world_size() == 1) GTEST_SKIP() << "one rank: one place";
  Toy toy(Plant::kWrongStart);
  const std::string why = agree(check_module_forward(toy.module(), 5));
  EXPECT_NE(why.find("toy forward (output 0"), std::string::npos) << why;
}

TEST(ModuleChecks, AModuleNotAffineInItsParametersFailsTheAdjoint) {
  Toy toy(Plant::kSquare);
  const std::string adj = agree(check_module_adjoint(toy.module(), 5, Wrt::Parameters));
  EXPECT_NE(adj.find("adjoint identity in its parameters"), std::string::npos) << adj;
}

TEST(ModuleChecks, AShardOutsideItsParameterIsNamed) {
  Toy toy(Plant::kNone);
  auto m = toy.module();
  m.parameters["c"] = {mpi::world_size() - 1 > 0 ? mpi::world_size() - 1 : 0};
  const std::string why = agree(check_module_forward(m, 5));
  EXPECT_NE(why.find("lies outside the global shape"), std::string::npos) << why;
  // The others raise it too, and in step: one rank's bad shard is every
  // rank's verdict (no rank waits in a collective the failing one left).
  for (const auto& [what, f] : std::vector<std::pair<std::string, std::function<std::string()>>>{
           {"backward", [&] { return check_module_backward(m, 5); }},
           {"adjoint", [&] { return check_module_adjoint(m, 5, Wrt::Parameters); }},
           {"finite differences", [&] { return check_module_finite_differences(m, 5); }}}) {
    const std::string got = agree(f());
    EXPECT_NE(got.find("lies outside the global shape"), std::string::npos) << what << ": " << got;
  }
}

}  // namespace
}  // namespace partita::testing
