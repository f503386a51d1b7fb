// The tables and examples of seeds 000 and 001, as data, word for word.
// Both the reference spec tests and the MPI spec tests read them.
#pragma once

#include <string>
#include <vector>

#include "partita/shape.hpp"

namespace partita::spec {

struct SeedPartition {
  std::string label;
  Ranks workers;  // root first where the seed marks one in bold
};

struct SeedWorker {
  int worker;
  std::string send;  // "P_0" ... or "n/a"
  std::string recv;
};

struct SeedTable {
  std::string name;
  Ranks px_ranks;
  Shape px_shape;
  Ranks py_ranks;
  Shape py_shape;
  std::vector<SeedPartition> partitions;
  std::vector<SeedWorker> workers;
};

// Seed 000, Broadcast: 1x3x1 on workers 1,2,3 to 2x3x2 on workers 0..11.
inline const SeedTable kBroadcastTable{
    "broadcast 1x3x1 -> 2x3x2",
    {1, 2, 3}, {1, 3, 1},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 3, 2},
    {{"P_0", {1, 0, 6, 7}}, {"P_1", {2, 3, 8, 9}}, {"P_2", {3, 4, 5, 10, 11}}},
    {{0, "n/a", "P_0"}, {4, "n/a", "P_2"}, {8, "n/a", "P_1"},
     {1, "P_0", "P_0"}, {5, "n/a", "P_2"}, {9, "n/a", "P_1"},
     {2, "P_1", "P_1"}, {6, "n/a", "P_0"}, {10, "n/a", "P_2"},
     {3, "P_2", "P_1"}, {7, "n/a", "P_0"}, {11, "n/a", "P_2"}}};

// Seed 000, Sum-Reduce: 2x3x2 on workers 0..11 to 1x3x1 on workers 1,2,3.
inline const SeedTable kSumReduceTable{
    "sum-reduce 2x3x2 -> 1x3x1",
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 3, 2},
    {1, 2, 3}, {1, 3, 1},
    {{"P_0", {1, 0, 6, 7}}, {"P_1", {2, 3, 8, 9}}, {"P_2", {3, 4, 5, 10, 11}}},
    {{0, "P_0", "n/a"}, {4, "P_2", "n/a"}, {8, "P_1", "n/a"},
     {1, "P_0", "P_0"}, {5, "P_2", "n/a"}, {9, "P_1", "n/a"},
     {2, "P_1", "P_1"}, {6, "P_0", "n/a"}, {10, "P_2", "n/a"},
     {3, "P_1", "P_2"}, {7, "P_0", "n/a"}, {11, "P_2", "n/a"}}};

// Seed 000, All Sum-Reduce: 2x3x2 on workers 0..11 reduced over {0, 2}.
inline const Shape kAllReduceShape{2, 3, 2};
inline const std::vector<int> kAllReduceAxes{0, 2};
inline const std::vector<SeedPartition> kAllReducePartitions{
    {"P_0", {0, 1, 6, 7}}, {"P_1", {2, 3, 8, 9}}, {"P_2", {4, 5, 10, 11}}};

// Issue 9, DistDL's pairing of transposed partitions (docs/partitions.md):
// 2x2x1 <-> 3x2x2 with either flag. Worker (i, j, 0) of the 2x2x1 side is
// paired with workers (a, i, j) of the 3x2x2 side, a = 0..2, whichever side
// carries the flag. Teams written out by hand, root first: the 2x2x1 side on
// workers 0-3, the 3x2x2 side on `big_first`..`big_first`+11 (4 for 16
// workers, disjoint; 0 for 12, overlapping).
struct TransposedPairing {
  std::string name;
  bool broadcast;                 // else sum-reduce
  Shape px, py;
  bool transpose_src, transpose_dest;
  int big_first;                  // first worker of the 3x2x2 partition
  std::vector<Ranks> teams;       // per 2x2x1 worker, root first
};

inline const std::vector<TransposedPairing> kTransposedPairings{
    {"broadcast_transpose_src_16", true, {2, 2, 1}, {3, 2, 2}, true, false, 4,
     {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}},
    {"broadcast_transpose_dest_16", true, {2, 2, 1}, {3, 2, 2}, false, true, 4,
     {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}},
    {"sum_reduce_transpose_src_16", false, {3, 2, 2}, {2, 2, 1}, true, false, 4,
     {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}},
    {"sum_reduce_transpose_dest_16", false, {3, 2, 2}, {2, 2, 1}, false, true, 4,
     {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}},
    {"broadcast_transpose_src_12", true, {2, 2, 1}, {3, 2, 2}, true, false, 0,
     {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}},
    {"broadcast_transpose_dest_12", true, {2, 2, 1}, {3, 2, 2}, false, true, 0,
     {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}},
    {"sum_reduce_transpose_src_12", false, {3, 2, 2}, {2, 2, 1}, true, false, 0,
     {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}},
    {"sum_reduce_transpose_dest_12", false, {3, 2, 2}, {2, 2, 1}, false, true, 0,
     {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}},
};

// Seed 001, Reduction Rules, examples 1-8. Where the seed says an example
// reduces only with a transpose, both settings are listed.
struct ReductionExample {
  std::string name;
  Shape px, py;
  bool transpose_src, transpose_dest;
  bool reduces;
};

inline const std::vector<ReductionExample> kReductionExamples{
    {"example1_4_to_1", {4}, {1}, false, false, true},
    {"example2_2x3_to_1", {2, 3}, {1}, false, false, true},
    {"example3_3x4_to_3x1", {3, 4}, {3, 1}, false, false, true},
    {"example4_4x4x3_to_1x1x3", {4, 4, 3}, {1, 1, 3}, false, false, true},
    {"example5_3x3x2_to_1x1x3", {3, 3, 2}, {1, 1, 3}, false, false, false},
    {"example6_1x3_to_3x1", {1, 3}, {3, 1}, false, false, false},
    {"example6_1x3_to_3x1_transpose_src", {1, 3}, {3, 1}, true, false, true},
    {"example6_1x3_to_3x1_transpose_dest", {1, 3}, {3, 1}, false, true, true},
    {"example7_3x4_to_1x3", {3, 4}, {1, 3}, false, false, false},
    {"example7_3x4_to_1x3_transpose_src", {3, 4}, {1, 3}, true, false, true},
    {"example8_3x4_to_4x1", {3, 4}, {4, 1}, false, false, false},
    {"example8_3x4_to_4x1_transpose_dest", {3, 4}, {4, 1}, false, true, true},
};

// Which P_y worker each P_x worker sums into, for the examples that reduce:
// P_x workers sit on world ranks 0..|P_x|-1 and P_y workers on 0..|P_y|-1
// (overlapping, as in seed 001's code example). Stated from the pictures:
// the P_x index with the dimensions P_y collapses dropped (after the
// transposes) is the P_y index.
int expected_reduction_target(const ReductionExample& ex, const Index& px_index);

// Cartesian shapes that only seem to fit `n` workers: negative extents
// whose product is n, and (where a factor below 10^6 exists) two extents
// whose product passes 2^64 and wraps to n.
std::vector<Shape> shapes_that_wrap_to(int64_t n);

}  // namespace partita::spec
