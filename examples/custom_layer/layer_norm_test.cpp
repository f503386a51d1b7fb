// The example layer's suite, written only with partita::testing
// (docs/testing-library.md): random cases in lockstep on every rank, each
// checked against a serial twin (torch's own layer_norm on the whole row):
// first as a function of its input, then as a module, its parameter shards'
// gradients included.
// PARTITA_EXAMPLE_PLANT=missing_term|neighbour_slice|gamma_grad switches on a
// planted bug.
// Two features at least: over one, the variance is 0 and 1/sqrt(eps) scales
// float32 rounding past any fair bound (the gradient is 0 in exact arithmetic).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "layer_norm.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/checks.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/testing/module_checks.hpp"

using namespace partita::testing;

struct Case {  // what the repro line prints
  int64_t batch, features;
  uint64_t seed;
};
std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "{\"batch\": " << c.batch << ", \"features\": " << c.features << ", \"seed\": " << c.seed << "}";
}

example::Plant plant() {
  const std::string p = std::getenv("PARTITA_EXAMPLE_PLANT") ? std::getenv("PARTITA_EXAMPLE_PLANT") : "";
  return p == "missing_term" ? example::Plant::missing_term
         : p == "neighbour_slice" ? example::Plant::neighbour_slice
         : p == "gamma_grad"      ? example::Plant::gamma_grad
                                  : example::Plant::none;
}

TEST(DistributedLayerNorm, MatchesTheSerialTwin) {
  const int p = partita::mpi::world_size();
  const auto gen = rc::gen::apply([](int64_t b, int64_t f, uint64_t s) { return Case{b, f, s}; },
                                  rc::gen::inRange<int64_t>(1, 5), rc::gen::inRange<int64_t>(2, 3 * p + 2),
                                  rc::gen::inRange<uint64_t>(0, 1000000));
  EXPECT_TRUE(check_lockstep<Case>("layer norm", gen, [&](const Case& c, Verdict& v) {
    const auto gamma = rank_input(c.seed + 1, 0, {c.features}, at::kDouble) + 1;
    const auto beta = rank_input(c.seed + 2, 0, {c.features}, at::kDouble);
    const auto P = partita::mpi::Partition::world().create_cartesian_topology_partition({p});
    example::DistributedLayerNorm layer(P, gamma, beta, plant());
    DistributedFunction f{"layer_norm", [&](const at::Tensor& x) { return layer.forward(x); },
                          [&](const Tensors& xs) {  // the twin: every rank's slice, joined
                            const auto t = xs[0].scalar_type();
                            const auto y = at::layer_norm(at::cat(xs, 1), {c.features}, gamma.to(t), beta.to(t), 1e-5);
                            Tensors ys;
                            for (int r = 0; r < p; ++r)
                              ys.push_back(y.narrow(1, example::start(c.features, p, r), example::share(c.features, p, r)));
                            return ys;
                          },
                          [&](int r) { return Shape{c.batch, example::share(c.features, p, r)}; }};
    CheckOptions options;
    options.adjoint(false);        // LayerNorm is not linear
    options.dtypes({at::kDouble});  // in float32 a row of small variance scales rounding past 8e-5
    check_all(f, c.seed, v, options);
  }));
}

// The same layer as a module: gamma and beta are parameters split over the
// ranks as the features are; the checks draw the global gamma and beta,
// write each rank's slice into its shards, and compare each shard's
// gradient with the same slice of the twin's global gradient.
TEST(DistributedLayerNorm, ParameterGradientsMatchTheSerialTwin) {
  const int p = partita::mpi::world_size();
  const auto gen = rc::gen::apply([](int64_t b, int64_t f, uint64_t s) { return Case{b, f, s}; },
                                  rc::gen::inRange<int64_t>(1, 5), rc::gen::inRange<int64_t>(2, 3 * p + 2),
                                  rc::gen::inRange<uint64_t>(0, 1000000));
  EXPECT_TRUE(check_lockstep<Case>("layer norm module", gen, [&](const Case& c, Verdict& v) {
    const int64_t n = c.features;
    const auto P = partita::mpi::Partition::world().create_cartesian_topology_partition({p});
    const auto ones = at::ones({n}, at::kDouble);
    example::DistributedLayerNorm layer(P, ones, ones, plant());  // the checks overwrite gamma and beta
    DistributedModule m;
    m.name = "layer_norm module";
    m.run = [&](const Tensors& xs) { return Tensors{layer.forward(xs[0])}; };
    m.shards = [&] {
      const std::vector<int64_t> at{layer.first_feature()};
      return std::vector<ParameterShard>{{"gamma", layer.gamma(), at}, {"beta", layer.beta(), at}};
    };
    m.parameters = {{"gamma", {n}}, {"beta", {n}}};
    m.input_shapes = [&](int r) { return std::vector<partita::Shape>{{c.batch, example::share(n, p, r)}}; };
    m.twin = [&](const std::vector<Tensors>& inputs, const ParameterMap& w) {  // whole rows, global gamma and beta
      Tensors xs;
      for (const auto& in : inputs) xs.push_back(in[0]);
      const auto y = at::layer_norm(at::cat(xs, 1), {n}, w.at("gamma"), w.at("beta"), 1e-5);
      std::vector<Tensors> ys;
      for (int r = 0; r < p; ++r) ys.push_back({y.narrow(1, example::start(n, p, r), example::share(n, p, r))});
      return ys;
    };
    // Affine in its parameters (y = xhat * gamma + beta): the adjoint holds there.
    check_module_all(m, c.seed, v, ModuleCheckOptions().adjoint_parameters(true));
  }));
}
