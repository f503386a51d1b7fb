// Random partition cases for the lockstep properties: two teams drawn from
// the world (identical, disjoint, overlapping, or with workers in neither),
// shapes of 1-4 dimensions that follow the broadcast rules most of the time
// and break them sometimes, transposes, reduction axes and sub-topologies.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>
#include <vector>

#include "partita/shape.hpp"

namespace partita::testing {

struct PartitionCase {
  int world = 1;
  std::string relation;  // identical / disjoint / overlapping / random
  Ranks px_ranks;
  Shape px_shape;
  Ranks py_ranks;
  Shape py_shape;
  bool transpose_src = false, transpose_dest = false;
  std::vector<int> axes;     // all-reduction axes of P_x
  std::vector<bool> remain;  // sub-topology of P_y
  int data_root = 0;         // broadcast_data root in P_x
};

std::ostream& operator<<(std::ostream& os, const PartitionCase& c);

rc::Gen<PartitionCase> gen_partition_case(int world);

}  // namespace partita::testing

#include "partita/testing/case.hpp"

namespace partita::testing {

// A random Case of one of `primitives` (broadcast, sum_reduce,
// all_sum_reduce) on a world of `world` ranks: partitions from
// gen_partition_case (rule-breaking pairs included), random options, dtype
// (mostly float64; float32, bfloat16, int32 too), input shapes of 0-3
// dimensions with zero-length extents, or a balanced decomposition of a
// random global shape (uneven splits), random data.
rc::Gen<Case> gen_primitive_case(int world, std::vector<std::string> primitives);

// A random Case of one of seed 002's Linear `layers` (linear,
// linear_all_gather, ...): partitions of the layer's form anywhere in the
// world (single and separate forms, with and without data-parallel axes),
// feature counts from the smallest that fit to a dozen more, batch and
// token extents (some zero), bias on or off, float64/float32/bfloat16, some
// outputs unused, sometimes a layer that does not fit its x or its workers.
rc::Gen<Case> gen_linear_case(int world, std::vector<std::string> layers);

}  // namespace partita::testing
