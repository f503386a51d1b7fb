// One case type for spec tests, property tests, `partita run` and the
// benchmarks: a primitive, its partitions and options, the dtype and the
// input shapes. It parses from JSON, prints itself as a one-line repro, and
// knows how many ranks it needs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "partita/options.hpp"
#include "partita/shape.hpp"

namespace partita::testing {

struct PartitionSpec {
  Ranks ranks;
  Shape shape;
};

struct Case {
  // broadcast | sum_reduce | all_sum_reduce | all_gather | reduce_scatter |
  // repartition (alias: transpose) | halo_exchange, or one of seed 002's
  // layers: linear | linear_all_gather | linear_reduce_scatter |
  // linear_all_gather_zero | linear_reduce_scatter_zero
  std::string primitive;
  PartitionSpec P_x;
  std::optional<PartitionSpec> P_y;  // not for all_sum_reduce
  std::vector<int> axes;             // all_sum_reduce only
  int axis = 0;                      // all_gather / reduce_scatter: partition dimension
  int64_t dim = 0;                   // ... and tensor dimension
  // all_gather / reduce_scatter in DistDL's form instead of axis and dim
  //: fields axes_all_gather (all_gather) or axes_reduce_scatter
  // (reduce_scatter), axes_keep, scale_backward (all_gather).
  std::optional<GatherAxes> distdl;
  Shape left, right;                 // halo_exchange: ghost widths per tensor dimension
  bool in_place = false;             // halo_exchange: DistDL's in-place form (halo_exchange_)
  // The Linear layers (docs/linear.md): P_x holds x and P_y holds y (absent:
  // the single-partition forms, y on P_x); the general layer's P_W. in
  // features default to the last extent of global_shape (the only input
  // form the layers take). W and b are drawn like the inputs.
  std::optional<PartitionSpec> P_W;
  int64_t out_features = 0;
  int64_t in_features = 0;
  bool bias = true;
  Options options;
  std::string dtype = "float64";

  // Exactly one of these gives the input shape of each P_x worker.
  // (For halo_exchange the shapes are windows: bulk plus ghosts; a
  // global_shape is decomposed into bulks and the ghosts added.)
  std::optional<Shape> global_shape;       // balanced decomposition over P_x
  std::optional<Shape> local_shape;        // every P_x worker holds this shape
  std::map<int, Shape> local_shapes;       // per world rank (uneven decompositions)

  int ranks = 0;  // world size the case needs; 0: one more than its largest rank
  // Inputs: absent, x = arange(n) + 1000*r and dy = arange(m) + 2000*r on
  // world rank r (the documented, reproducible scheme); present, random
  // values drawn from this seed and the rank (property tests).
  std::optional<uint64_t> data_seed;
  // With data_seed, what is drawn: "integers" (default), values in
  // [-8, 8] ([0, 8] for uint8), whose sums over any team are exact in every
  // dtype, so every result is compared bit for bit; or "normal", random
  // normal values (integers for integer dtypes), where sums in another order
  // differ in the last bits and reductions are compared elementwise within
  // the dtype's tolerance.
  std::string fill = "integers";
  // World ranks whose output does not reach the loss: their
  // backward receives an undefined gradient, which the reference treats as
  // zero. The primitive's backward must still run there (it is collective).
  Ranks unused_outputs;

  // Every field of a case file is read in one table in case.cpp (name, what
  // is expected, how it is read). These throw CaseError naming `source` (the
  // file), the field and what was expected.
  static Case from_json(const nlohmann::ordered_json& v, const std::string& source = "case");
  static Case parse(const std::string& text, const std::string& source = "case");
  static Case load(const std::string& path);  // parse(contents of path, path)
  nlohmann::ordered_json to_json() const;
  std::string repro() const;  // to_json() on one line

  bool is_linear() const;  // one of the Linear layers
  int world_size_needed() const;
  // The shape of world rank `worker`'s input; {0} for a worker outside P_x.
  Shape input_shape(int worker) const;
};

// The repro line (RapidCheck prints counterexamples with it).
inline std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.repro(); }

}  // namespace partita::testing
