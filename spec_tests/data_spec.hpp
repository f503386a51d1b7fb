// The seeds' examples executed with data: inputs, cotangents and the
// outputs the seeds' words and tables imply, per world rank. Shared by the
// reference spec tests and the MPI spec tests; expectations come from the
// seed tables (seed_tables.hpp), never from partita's own team arithmetic.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "partita/shape.hpp"
#include "seed_tables.hpp"

namespace partita::spec {

// x on world rank w: arange(volume) + 1000*w in float64, shaped `shape`.
at::Tensor arange_input(int w, const Shape& shape);
// dy on world rank w: arange(volume) + 2000*w.
at::Tensor arange_cotangent(int w, const Shape& shape);

struct DataExample {
  std::string name;
  std::string primitive;  // broadcast | sum_reduce | all_sum_reduce
  Ranks px_ranks;
  Shape px_shape;
  Ranks py_ranks;
  Shape py_shape;
  std::vector<int> axes;
  bool transpose_src = false, transpose_dest = false, preserve_batch = true;
  Shape local_shape;
  int world = 0;
  // Per world rank: the expected output and input gradient (for the
  // cotangents above); undefined output = zero-volume expected.
  std::vector<at::Tensor> y, dx;
};

// The example's name as a gtest parameter name (alphanumerics and '_').
std::string test_name(const DataExample& e);

// Seed 001's code example, seed 000's three tables, and the reduction
// examples 1-8 that reduce.
std::vector<DataExample> data_examples();

}  // namespace partita::spec

namespace partita::spec {

// docs/design.md's AllGather and ReduceScatter on P_x = 2x2 over workers 0-3
// along partition dimension 1 (teams {0,1} and {2,3}), tensor dimension 0,
// with arange inputs: written out number by number.
//  - all-gather of x_w = arange(6).reshape(2,3) + 1000w: workers 0 and 1 get
//    [[0,1,2],[3,4,5],[1000,1001,1002],[1003,1004,1005]], workers 2 and 3 the
//    same with 2000 and 3000.
//  - reduce-scatter of x_w = arange(10).reshape(5,2) + 1000w: the team sum is
//    2*arange + 1000 (team {0,1}) or + 5000 (team {2,3}); 5 rows over 2
//    workers: the first gets rows 0-2, the second rows 3-4.
at::Tensor expected_all_gather(int worker);
at::Tensor expected_reduce_scatter(int worker);

}  // namespace partita::spec

namespace partita::spec {

// Repartition examples of issue 4, on the global tensor G = arange(volume)
// (float64): P_x's inputs are pieces of G as the example tiles it, P_y's
// outputs the pieces of the balanced decomposition, both written out as
// boxes (start, length per dimension), not computed by partita's code.
struct Box {
  Shape start, len;
};
struct RepartitionExample {
  std::string name;
  Shape global;
  Ranks px_ranks;
  Shape px_shape;
  std::vector<Box> px_boxes;  // per P_x rank
  Ranks py_ranks;
  Shape py_shape;
  std::vector<Box> py_boxes;  // per P_y rank
  int world = 0;
};
std::vector<RepartitionExample> repartition_examples();
at::Tensor piece(const Shape& global, const Box& b, double scale = 1, double shift = 0);

}  // namespace partita::spec

namespace partita::spec {

// Issue 4's halo exchange: G = arange(16) as 4x4 over P_x = 2x2 (workers
// 0-3, bulks 2x2), ghost widths 1 on both sides of both dimensions, so each
// window is 4x4. The input window holds the worker's bulk of G and -1 in
// every ghost. Written out number by number:
//  - halo_output: ghosts inside G take G's values (the corner ghost from the
//    diagonal neighbour), ghosts beyond G's boundary stay -1;
//  - halo_input_grad: the gradient for a cotangent of ones: each bulk
//    element counts itself plus every neighbour's window that holds it as a
//    ghost; ghosts with a neighbour 0; ghosts beyond the boundary 1.
at::Tensor halo_input(int worker);
at::Tensor halo_output(int worker);
at::Tensor halo_input_grad(int worker);

}  // namespace partita::spec
