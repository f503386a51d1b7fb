// smp::step and StepOutput (seed 004, issue 13 items 4-5): microbatch
// splitting of nested inputs and user types, non-split inputs and split axes
// by name and position, uneven batches, collected outputs, and the central
// check: gradient accumulation over 1, 2 and 4 microbatches trains a small
// MLP exactly as one full-batch step of plain LibTorch does (float64, 10
// steps, losses and parameters within 1e-10). Every rank runs the same
// single-process computation.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "expect_raises.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/step.hpp"

namespace partita::spec {
namespace {


at::Tensor d(std::vector<double> v) { return at::tensor(v, at::kDouble); }
bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

TEST(SmpStep, StepOutputReductionsByHand) {
  const smp::StepOutput o({d({1, 2}), d({3, 6})});
  EXPECT_EQ(o.outputs().size(), 2u);
  EXPECT_TRUE(same(o.reduce_mean(), d({2, 4})));
  EXPECT_TRUE(same(o.reduce_sum(), d({4, 8})));
  EXPECT_TRUE(same(o.concat(), d({1, 2, 3, 6})));
  EXPECT_TRUE(same(o.stack(), d({1, 2, 3, 6}).reshape({2, 2})));
  const smp::StepOutput rows({d({1, 2, 3, 4}).reshape({2, 2}), d({5, 6}).reshape({1, 2})});
  EXPECT_TRUE(same(rows.concat(), d({1, 2, 3, 4, 5, 6}).reshape({3, 2})));
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::StepOutput().reduce_mean(); }), "no microbatch outputs");
}

// The seed's CustomType: split by its own smp_slice.
struct Custom {
  at::Tensor data;
  std::vector<std::tuple<int, int, int64_t>>* calls;
  Custom smp_slice(int num_mb, int mb, int64_t axis) const {
    calls->emplace_back(num_mb, mb, axis);
    const int64_t n = data.size(axis) / num_mb;
    return Custom{data.narrow(axis, mb * n, n), calls};
  }
};

TEST(SmpStep, SplitsNestedInputsAndUserTypes) {
  const at::Tensor x = at::arange(12, at::kDouble).reshape({4, 3});
  const std::vector<at::Tensor> v = {at::arange(4, at::kLong), at::arange(8, at::kFloat).reshape({4, 2})};
  const std::map<std::string, at::Tensor> m = {{"a", at::arange(4, at::kInt) * 10}};
  const std::tuple<at::Tensor, int> t = {at::arange(4, at::kDouble) + 100, 7};
  std::vector<std::tuple<int, int, int64_t>> calls;
  const Custom c{at::arange(6, at::kDouble).reshape({2, 3}), &calls};
  smp::StepOptions o;
  o.microbatches(2);
  o.arg_names({"x", "v", "m", "t", "k", "c"});
  o.input_split_axes({{"c", 1}});  // the custom type is split along its axis 1
  std::vector<int> seen_mb;
  auto f = smp::step(
      [&](at::Tensor xs, std::vector<at::Tensor> vs, std::map<std::string, at::Tensor> ms,
          std::tuple<at::Tensor, int> ts, int k, Custom cs) {
        const int mb = smp::microbatch();
        seen_mb.push_back(mb);
        EXPECT_EQ(smp::num_microbatches(), 2);
        EXPECT_TRUE(same(xs, x.narrow(0, 2 * mb, 2)));
        EXPECT_TRUE(same(vs[0], v[0].narrow(0, 2 * mb, 2)));
        EXPECT_TRUE(same(vs[1], v[1].narrow(0, 2 * mb, 2)));
        EXPECT_TRUE(same(ms.at("a"), m.at("a").narrow(0, 2 * mb, 2)));
        EXPECT_TRUE(same(std::get<0>(ts), std::get<0>(t).narrow(0, 2 * mb, 2)));
        EXPECT_EQ(std::get<1>(ts), 7);
        EXPECT_EQ(k, 5);
        return cs.data;
      },
      o);
  // Axis 1 of the custom type has 3 columns: the user's smp_slice decides
  // (it floors, as the seed's example does).
  const smp::StepOutput out = f(x, v, m, t, 5, c);
  EXPECT_EQ(seen_mb, (std::vector<int>{0, 1}));
  EXPECT_EQ(calls, (std::vector<std::tuple<int, int, int64_t>>{{2, 0, 1}, {2, 1, 1}}));
  EXPECT_TRUE(same(out.outputs()[0], c.data.narrow(1, 0, 1)));
  EXPECT_TRUE(same(out.outputs()[1], c.data.narrow(1, 1, 1)));
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::microbatch(); }), "not inside an smp::step");
}

TEST(SmpStep, NonSplitInputsAndAxesByNameAndPosition) {
  const at::Tensor x = at::arange(8, at::kDouble).reshape({2, 4});
  const at::Tensor w = at::arange(6, at::kDouble);
  smp::StepOptions o;
  o.microbatches(4);
  o.arg_names({"x", "w"});
  o.input_split_axes({{"x", 1}});
  o.non_split_inputs({"w"});
  auto f = smp::step([&](at::Tensor xs, at::Tensor ws) {
    EXPECT_TRUE(same(xs, x.narrow(1, smp::microbatch(), 1)));
    EXPECT_TRUE(same(ws, w));
    return xs.sum();
  }, o);
  EXPECT_TRUE(same(f(x, w).stack(), d({4, 6, 8, 10})));

  smp::StepOptions p;
  p.microbatches(2);
  p.non_split_positions({0});
  p.split_axes_by_position({{1, -1}});
  auto g = smp::step([&](at::Tensor ws, at::Tensor xs) {
    EXPECT_TRUE(same(ws, w));
    EXPECT_TRUE(same(xs, x.narrow(1, 2 * smp::microbatch(), 2)));
    return xs;
  }, p);
  EXPECT_TRUE(same(g(w, x).concat(1), x));
}

TEST(SmpStep, BadSplitsAreUsageErrors) {
  smp::StepOptions o;
  o.microbatches(2);
  auto id = [](at::Tensor t) { return t; };
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::step(id, o)(at::zeros({5, 2})); }),
                  "smp::step: argument 0 has batch size 5 along axis 0, which 2 microbatches do not divide");
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::step(id, o)(at::zeros({})); }),
                  "argument 0 has 0 dimensions, it cannot be split along axis 0");
  o.arg_names({"x"});
  o.non_split_inputs({"y"});
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::step(id, o)(at::zeros({4})); }),
                  "non_split_inputs names \"y\", which is not in arg_names");
  smp::StepOptions p;
  p.microbatches(2);
  p.split_axes_by_position({{0, 3}});
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::step(id, p)(at::zeros({4, 2})); }),
                  "argument 0 has 2 dimensions, it cannot be split along axis 3");
  p.split_axes_by_position({{1, 0}});
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::step(id, p)(at::zeros({4, 2})); }),
                  "split_axes_by_position holds 1, the step has 1 arguments");
}

TEST(SmpStep, OutputsAreCollectedAndDetached) {
  smp::StepOptions o;
  o.microbatches(2);
  const at::Tensor w = at::ones({3}, at::kDouble).requires_grad_();
  auto f = [&](at::Tensor x) {
    at::Tensor y = x * w;
    return std::make_tuple(y.sum(), std::vector<at::Tensor>{y, x}, std::map<std::string, at::Tensor>{{"y", y}},
                           static_cast<int>(x.size(0)));
  };
  const at::Tensor x = at::arange(6, at::kDouble).reshape({2, 3});
  const auto [sums, list, dict, sizes] = smp::step(f, o)(x);
  EXPECT_TRUE(same(sums.stack(), d({3, 12})));
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(same(list[0].concat(), x));
  EXPECT_TRUE(same(dict.at("y").concat(), x));
  EXPECT_EQ(sizes, (std::vector<int>{1, 1}));
  EXPECT_FALSE(sums.outputs()[0].requires_grad()) << "detach_outputs is on by default";
  o.detach_outputs(false);
  const auto kept = smp::step(f, o)(x);
  EXPECT_TRUE(std::get<0>(kept).outputs()[1].requires_grad());
  std::get<0>(kept).reduce_sum().backward();
  EXPECT_TRUE(same(w.grad(), d({3, 5, 7})));  // column sums of x
}

// Issue 13's check: microbatches 1, 2, 4 of a small MLP, 10 SGD steps,
// against plain LibTorch on the full batch.
TEST(SmpStep, GradientAccumulationEqualsTheFullBatch) {
  torch::manual_seed(13);
  torch::nn::Sequential reference(torch::nn::Linear(5, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8),
                                  torch::nn::GELU(), torch::nn::Linear(8, 3));
  reference->to(at::kDouble);
  const at::Tensor x = at::randn({16, 5}, at::kDouble), y = at::randn({16, 3}, at::kDouble);
  const double lr = 0.05;
  auto sgd = [&](torch::nn::Sequential& m) {
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) {
      p.sub_(lr * p.grad());
      p.grad().zero_();
    }
  };
  const int n = mpi::world_size();
  for (int microbatches : {1, 2, 4}) {
    smp::Config c;
    c.microbatches(microbatches);
    smp::init(c);  // the step reads its microbatch count from the configuration
    auto full = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    auto split = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    torch::nn::Sequential full_m(full), split_m(split);
    auto train = smp::step([&](at::Tensor xs, at::Tensor ys) {
      at::Tensor loss = torch::mse_loss(split_m->forward(xs), ys);
      (loss / smp::num_microbatches()).backward();
      return loss;
    });
    for (int s = 0; s < 10; ++s) {
      at::Tensor full_loss = torch::mse_loss(full_m->forward(x), y);
      full_loss.backward();
      const smp::StepOutput losses = train(x, y);
      ASSERT_EQ(static_cast<int>(losses.outputs().size()), microbatches);
      const double gap = std::abs(losses.reduce_mean().item<double>() - full_loss.item<double>());
      EXPECT_LE(gap, 1e-10) << microbatches << " microbatches, step " << s << " (" << n << " ranks)";
      const auto pf = full_m->parameters(), ps = split_m->parameters();
      for (size_t i = 0; i < pf.size(); ++i)
        EXPECT_LE((pf[i].grad() - ps[i].grad()).abs().max().item<double>(), 1e-10)
            << microbatches << " microbatches, step " << s << ", gradient of parameter " << i;
      sgd(full_m);
      sgd(split_m);
    }
    const auto pf = full_m->parameters(), ps = split_m->parameters();
    double worst = 0, moved = 0;
    for (size_t i = 0; i < pf.size(); ++i) {
      worst = std::max(worst, (pf[i] - ps[i]).abs().max().item<double>());
      moved = std::max(moved, (pf[i] - reference->parameters()[i]).abs().max().item<double>());
    }
    EXPECT_LE(worst, 1e-10) << microbatches << " microbatches: parameters after 10 steps";
    EXPECT_GT(moved, 1e-3) << "training did not move the parameters: the check would prove nothing";
  }
}

}  // namespace
}  // namespace partita::spec
