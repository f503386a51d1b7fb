// libFuzzer target: partita::smp's configuration reader (impl/src/smp/config.cpp)
// on arbitrary text, as it comes from PARTITA_SMP_CONFIG or a file. Its
// promise (partita/smp.hpp): anything that is not a valid configuration
// raises partita::smp::ConfigError. Any other exception, a crash or a
// sanitizer report is a finding; so is a broken property of what it
// accepts:
//  - to_json() reads back as the same configuration;
//  - validate(world) accepts exactly the worlds the layout can be built
//    for (whole model replicas of partitions x tensor_parallel_degree, and
//    virtual stages only under "interleaved_virtual"), and the 2-D layout
//    of an accepted world places every rank in an mp and a dp group that
//    contain it, in the order the layout's rule says.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "partita/smp.hpp"
#include "partita/smp/layout.hpp"

namespace {

using partita::smp::Config;
using partita::smp::ConfigError;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "smp_config_fuzz: %s\n", what.c_str());
  std::abort();
}

bool same(const Config& a, const Config& b) {
  return a.partitions() == b.partitions() && a.microbatches() == b.microbatches() && a.pipeline() == b.pipeline() &&
         a.ddp() == b.ddp() && a.tensor_parallel_degree() == b.tensor_parallel_degree() &&
         a.virtual_pipeline_model_parallel_size() == b.virtual_pipeline_model_parallel_size();
}

void check_layout(const Config& c, int world) {
  bool accepted = true;
  try {
    c.validate(world);
  } catch (const ConfigError&) {
    accepted = false;
  }
  // A model replica is partitions x tensor_parallel_degree processes; the
  // world holds whole replicas (exactly one with ddp off); virtual stages
  // only with the one schedule that has them (docs/smp.md).
  const long long mp = static_cast<long long>(c.partitions()) * c.tensor_parallel_degree();
  const bool stages_ok = c.virtual_pipeline_model_parallel_size() == 1 || c.pipeline() == "interleaved_virtual";
  if (accepted != (stages_ok && world % mp == 0 && (c.ddp() || world == mp)))
    finding("validate(" + std::to_string(world) + ") of " + c.to_json() + " answered " +
            (accepted ? "yes" : "no"));
  // The placement below is the 2-D layout's rule (pp x dp); the 3-D one's
  // tables are spec_3d's.
  if (!accepted || c.tensor_parallel_degree() != 1) return;
  const partita::smp::Layout layout(world, c.partitions());
  for (int r = 0; r < world; ++r) {
    const auto p = layout.place(r);
    if (p.mp_rank != r % c.partitions() || p.dp_rank != r / c.partitions() ||
        static_cast<int>(p.mp_group.size()) != c.partitions() ||
        static_cast<int>(p.dp_group.size()) != world / c.partitions() || p.mp_group.at(p.mp_rank) != r ||
        p.dp_group.at(p.dp_rank) != r)
      finding("layout of " + c.to_json() + " on " + std::to_string(world) + " ranks misplaces rank " +
              std::to_string(r));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Config c;
  try {
    c = Config::from_json(text, "fuzz");
  } catch (const ConfigError&) {
    return 0;
  }
  Config back;
  try {
    back = Config::from_json(c.to_json(), "fuzz round trip");
  } catch (const ConfigError& e) {
    finding("to_json() of an accepted configuration is refused: " + std::string(e.what()));
  }
  if (!same(c, back)) finding("round trip changed " + c.to_json() + " into " + back.to_json());
  // Worlds of 1 to 16, 24, 32 and 64 ranks, and the configuration's own
  // partition count (kept small: the layout lists every rank's groups).
  for (int world = 1; world <= 16; ++world) check_layout(c, world);
  for (int world : {24, 32, 64}) check_layout(c, world);
  if (c.partitions() > 16 && c.partitions() <= 256) check_layout(c, c.partitions());
  return 0;
}
