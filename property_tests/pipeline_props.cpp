// Lockstep property of the pipeline (issue 14): random models (MLP or
// residual blocks, random layer counts and widths), random split points (or
// the balanced split), random microbatch counts and batch sizes, at every
// partition count of this world and every schedule (issue 31: ZB-H1, and
// Megatron's interleaved 1F1B with 2 virtual stages per rank where there
// are 2+ ranks), train for 2 SGD steps exactly as one process does on the
// whole batch (float64, 1e-10).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "partita/testing/lockstep.hpp"
#include "partita/testing/pipeline_checks.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"

namespace partita::testing {
namespace {

// Layers of the model `spec` builds (pipeline_checks.hpp).
int layer_count(const ModelSpec& spec) {
  const int n = static_cast<int>(spec.widths.size());
  return spec.blocks ? n : 2 * (n - 1) - 1;
}

// `stages` of the model (ranks x virtual stages); microbatch counts rounded
// up to a multiple of `multiple` (the interleaved schedule's rule).
rc::Gen<PipelineRun> gen_run(int stages, int multiple = 1) {
  return rc::gen::mapcat(
      rc::gen::tuple(rc::gen::arbitrary<bool>(), rc::gen::inRange(2, 8), rc::gen::inRange<uint64_t>(1, 1000000)),
      [stages, multiple](std::tuple<bool, int, uint64_t> t) {
        const auto [blocks, extra, seed] = t;
        // Enough layers for every stage: an MLP of k Linear layers has 2k-1.
        const int widths = blocks ? std::max(3, stages) + extra % 3 : std::max(2, (stages + 4) / 2) + extra % 4;
        return rc::gen::apply(
            [blocks = blocks, seed = seed, stages, multiple](std::vector<int64_t> w, int microbatches, int64_t rows,
                                                   bool balanced, std::vector<int> cuts) {
              PipelineRun r;
              r.model = {blocks, std::move(w), seed};
              r.microbatches = (microbatches + multiple - 1) / multiple * multiple;
              r.batch = r.microbatches * rows;
              r.steps = 2;
              const int layers = layer_count(r.model);
              if (!balanced && stages > 1) {
                std::set<int> points;
                for (int c : cuts) points.insert(1 + c % (layers - 1));
                if (static_cast<int>(points.size()) == stages - 1) r.split_points.assign(points.begin(), points.end());
              }
              return r;
            },
            rc::gen::container<std::vector<int64_t>>(widths, rc::gen::inRange<int64_t>(1, 10)),
            rc::gen::element(1, 2, 3, 4, 8), rc::gen::inRange<int64_t>(1, 3),
            rc::gen::weightedElement<bool>({{1, true}, {2, false}}),
            rc::gen::container<std::vector<int>>(std::max(0, stages - 1), rc::gen::inRange(0, 1000)));
      });
}

TEST(PipelineProperty, EqualsOneProcess) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  for (int p : {1, 2, 4, 8}) {
    if (p > n || n % p) continue;
    for (const char* pipeline : {"simple", "interleaved", "zero_bubble", "interleaved_virtual"}) {
      const bool virtual_stages = std::string(pipeline) == "interleaved_virtual";
      if (virtual_stages && p == 1) continue;  // one rank: nothing to interleave
      smp::Config cfg;
      cfg.partitions(p);
      cfg.pipeline(pipeline);
      cfg.virtual_pipeline_model_parallel_size(virtual_stages ? 2 : 1);
      smp::init(cfg);
      std::map<std::string, int> seen;
      const bool ok = check_lockstep<PipelineRun>(
          std::string("pipeline equals one process, ") + std::to_string(p) + " partitions, " + pipeline,
          virtual_stages ? gen_run(2 * p, p) : gen_run(p),
          [&seen](const PipelineRun& r, Verdict& v) {
            ++seen[r.model.blocks ? "blocks" : "mlp"];
            ++seen["microbatches " + std::to_string(r.microbatches)];
            ++seen[r.split_points.empty() ? "balanced" : "split points"];
            const std::string d = check_against_serial(r);
            v.expect(d.empty(), d);
          });
      EXPECT_TRUE(ok);
      if (mpi::world_rank() == 0) {
        std::cout << "  " << p << " partitions, " << pipeline << ":";
        for (const auto& [k, c] : seen) std::cout << " " << k << " " << c << ";";
        std::cout << std::endl;
      }
      // The generator must reach what the property is about.
      EXPECT_GT(seen["blocks"], 0);
      EXPECT_GT(seen["mlp"], 0);
      EXPECT_GT(seen["microbatches 8"], 0);
      if (p > 1) EXPECT_GT(seen["split points"], 0);
    }
  }
}

}  // namespace
}  // namespace partita::testing
