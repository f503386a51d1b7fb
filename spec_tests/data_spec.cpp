#include "data_spec.hpp"

#include <algorithm>
#include <cctype>

namespace partita::spec {

at::Tensor arange_input(int w, const Shape& shape) {
  return (at::arange(volume(shape), at::kDouble) + 1000.0 * w).reshape(shape);
}

at::Tensor arange_cotangent(int w, const Shape& shape) {
  return (at::arange(volume(shape), at::kDouble) + 2000.0 * w).reshape(shape);
}

namespace {

Ranks iota(int n) {
  Ranks r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

int label_index(const std::string& label) { return label == "n/a" ? -1 : std::stoi(label.substr(2)); }

// A seed table as data movement: in a broadcast the root of P_l (first in
// the seed's list) sends to every worker whose P_recv is P_l; in a
// sum-reduce every worker whose P_send is P_l sends to the root.
DataExample from_table(const SeedTable& t, bool broadcast, const Shape& local) {
  DataExample e;
  e.name = t.name;
  e.primitive = broadcast ? "broadcast" : "sum_reduce";
  e.px_ranks = t.px_ranks;
  e.px_shape = t.px_shape;
  e.py_ranks = t.py_ranks;
  e.py_shape = t.py_shape;
  e.local_shape = local;
  e.world = 12;
  e.y.resize(12);
  e.dx.resize(12);
  for (const auto& w : t.workers) {
    const int send = label_index(w.send), recv = label_index(w.recv);
    if (broadcast && recv >= 0) e.y[w.worker] = arange_input(t.partitions[recv].workers[0], local);
    if (!broadcast && send >= 0) {
      const int root = t.partitions[send].workers[0];
      e.dx[w.worker] = arange_cotangent(root, local);
    }
  }
  for (size_t l = 0; l < t.partitions.size(); ++l) {
    const int root = t.partitions[l].workers[0];
    at::Tensor sum = at::zeros(local, at::kDouble);
    for (const auto& w : t.workers) {
      const int from = broadcast ? label_index(w.recv) : label_index(w.send);
      if (from == static_cast<int>(l))
        sum = sum + (broadcast ? arange_cotangent(w.worker, local) : arange_input(w.worker, local));
    }
    (broadcast ? e.dx : e.y)[root] = sum;
  }
  return e;
}

}  // namespace

std::string test_name(const DataExample& e) {
  std::string n = e.name;
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

std::vector<DataExample> data_examples() {
  std::vector<DataExample> out;

  // Seed 001: "To reduce a 2-dimensional tensor that is partitioned by a
  // 4 x 3 partition onto a 1 x 3 partition ... each subtensor of y is the
  // sum of 4 subtensors of x." P_y worker j sums column j: ranks j, 3+j,
  // 6+j, 9+j; the cotangent of worker j comes back to all four.
  {
    DataExample e;
    e.name = "seed001_4x3_to_1x3";
    e.primitive = "sum_reduce";
    e.px_ranks = iota(12);
    e.px_shape = {4, 3};
    e.py_ranks = iota(3);
    e.py_shape = {1, 3};
    e.preserve_batch = false;
    e.local_shape = {7, 5};
    e.world = 12;
    e.y.resize(12);
    e.dx.resize(12);
    for (int j = 0; j < 3; ++j) {
      e.y[j] = 4 * at::arange(35, at::kDouble).reshape({7, 5}) + 1000.0 * (4 * j + 18);
      for (int i = 0; i < 4; ++i) e.dx[3 * i + j] = arange_cotangent(j, {7, 5});
    }
    out.push_back(e);
  }

  out.push_back(from_table(kBroadcastTable, true, {2, 3}));
  out.push_back(from_table(kSumReduceTable, false, {2, 3}));

  // Seed 000, all-sum-reduce over dimensions {0, 2} of 2x3x2: every worker
  // ends with the sum over its partition P_0, P_1 or P_2; self-adjoint.
  {
    DataExample e;
    e.name = "seed000_all_sum_reduce_2x3x2_axes_0_2";
    e.primitive = "all_sum_reduce";
    e.px_ranks = iota(12);
    e.px_shape = kAllReduceShape;
    e.axes = kAllReduceAxes;
    e.local_shape = {3, 2};
    e.world = 12;
    e.y.resize(12);
    e.dx.resize(12);
    for (const auto& p : kAllReducePartitions) {
      at::Tensor sx = at::zeros({3, 2}, at::kDouble), sdy = at::zeros({3, 2}, at::kDouble);
      for (int w : p.workers) {
        sx = sx + arange_input(w, {3, 2});
        sdy = sdy + arange_cotangent(w, {3, 2});
      }
      for (int w : p.workers) {
        e.y[w] = sx;
        e.dx[w] = sdy;
      }
    }
    out.push_back(e);
  }

  // Seed 001, examples 1-8 that reduce: P_x on ranks 0..|P_x|-1, P_y on
  // 0..|P_y|-1; the target of each P_x worker as seed_tables.cpp states it.
  for (const auto& ex : kReductionExamples) {
    if (!ex.reduces) continue;
    DataExample e;
    e.name = ex.name;
    e.primitive = "sum_reduce";
    const int nx = static_cast<int>(volume(ex.px)), ny = static_cast<int>(volume(ex.py));
    e.px_ranks = iota(nx);
    e.px_shape = ex.px;
    e.py_ranks = iota(ny);
    e.py_shape = ex.py;
    e.transpose_src = ex.transpose_src;
    e.transpose_dest = ex.transpose_dest;
    e.local_shape = {2, 3};
    e.world = std::max(nx, ny);
    e.y.assign(e.world, at::Tensor());
    e.dx.assign(e.world, at::Tensor());
    for (int t = 0; t < ny; ++t) e.y[t] = at::zeros({2, 3}, at::kDouble);
    for (int r = 0; r < nx; ++r) {
      const int t = expected_reduction_target(ex, unravel(r, ex.px));
      e.y[t] = e.y[t] + arange_input(r, {2, 3});
      e.dx[r] = arange_cotangent(t, {2, 3});
    }
    out.push_back(e);
  }
  return out;
}

}  // namespace partita::spec

namespace partita::spec {

at::Tensor expected_all_gather(int worker) {
  const double a = worker < 2 ? 0 : 2000, b = worker < 2 ? 1000 : 3000;
  return at::tensor({0 + a, 1 + a, 2 + a, 3 + a, 4 + a, 5 + a, 0 + b, 1 + b, 2 + b, 3 + b, 4 + b, 5 + b},
                    at::kDouble)
      .reshape({4, 3});
}

at::Tensor expected_reduce_scatter(int worker) {
  const double base = worker < 2 ? 1000 : 5000;
  if (worker % 2 == 0)
    return at::tensor({0 + base, 2 + base, 4 + base, 6 + base, 8 + base, 10 + base}, at::kDouble)
        .reshape({3, 2});
  return at::tensor({12 + base, 14 + base, 16 + base, 18 + base}, at::kDouble).reshape({2, 2});
}

}  // namespace partita::spec

namespace partita::spec {

at::Tensor piece(const Shape& global, const Box& b, double scale, double shift) {
  at::Tensor t = at::arange(volume(global), at::kDouble).reshape(global) * scale + shift;
  for (size_t k = 0; k < global.size(); ++k)
    t = t.narrow(static_cast<int64_t>(k), b.start[k], b.len[k]);
  return t.clone();
}

std::vector<RepartitionExample> repartition_examples() {
  std::vector<RepartitionExample> out;
  // A 16-element all-to-all: G = arange(16) as 4x4, rows on P_x = 4x1
  // (workers 0-3), columns on P_y = 1x4 (workers 0-3).
  {
    RepartitionExample e{"all_to_all_4x1_to_1x4", {4, 4}, {0, 1, 2, 3}, {4, 1}, {}, {0, 1, 2, 3}, {1, 4}, {}, 4};
    for (int64_t i = 0; i < 4; ++i) e.px_boxes.push_back({{i, 0}, {1, 4}});
    for (int64_t j = 0; j < 4; ++j) e.py_boxes.push_back({{0, j}, {4, 1}});
    out.push_back(e);
  }
  // Scatter from one worker (a 1-worker partition, padded to 1x1x1) to
  // 1x2x3 on workers 0-5: G is 2x4x6; worker (0,a,b) gets rows 2a..2a+1 of
  // dimension 1 and 2b..2b+1 of dimension 2.
  RepartitionExample scatter{"scatter_1_to_1x2x3", {2, 4, 6}, {0}, {1}, {{{0, 0, 0}, {2, 4, 6}}},
                             {0, 1, 2, 3, 4, 5}, {1, 2, 3}, {}, 6};
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b) scatter.py_boxes.push_back({{0, 2 * a, 2 * b}, {2, 2, 2}});
  out.push_back(scatter);
  // ... and the gather back, to worker 5.
  RepartitionExample gather{"gather_1x2x3_to_1", {2, 4, 6}, {0, 1, 2, 3, 4, 5}, {1, 2, 3},
                            scatter.py_boxes, {5}, {1}, {{{0, 0, 0}, {2, 4, 6}}}, 6};
  out.push_back(gather);
  // 3x3 -> 4x4 with uneven pieces: G is 10x7; P_x (workers 0-8) is tiled
  // with the remainder on the first worker of each dimension (rows 4,3,3;
  // columns 3,2,2); P_y (workers 0-15) is balanced (rows 3,3,2,2; columns
  // 2,2,2,1).
  {
    RepartitionExample e{"uneven_3x3_to_4x4", {10, 7}, {}, {3, 3}, {}, {}, {4, 4}, {}, 16};
    const int64_t rs[] = {0, 4, 7}, rl[] = {4, 3, 3}, cs[] = {0, 3, 5}, cl[] = {3, 2, 2};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        e.px_ranks.push_back(3 * i + j);
        e.px_boxes.push_back({{rs[i], cs[j]}, {rl[i], cl[j]}});
      }
    const int64_t ys[] = {0, 3, 6, 8}, yl[] = {3, 3, 2, 2}, xs[] = {0, 2, 4, 6}, xl[] = {2, 2, 2, 1};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        e.py_ranks.push_back(4 * i + j);
        e.py_boxes.push_back({{ys[i], xs[j]}, {yl[i], xl[j]}});
      }
    out.push_back(e);
  }
  return out;
}

}  // namespace partita::spec

namespace partita::spec {

namespace {
at::Tensor grid4(std::initializer_list<double> v) { return at::tensor(v, at::kDouble).reshape({4, 4}); }
}  // namespace

at::Tensor halo_input(int worker) {
  at::Tensor w = at::full({4, 4}, -1.0, at::kDouble);
  const int64_t r0 = worker / 2 * 2, c0 = worker % 2 * 2;
  w.narrow(0, 1, 2).narrow(1, 1, 2).copy_(
      at::arange(16, at::kDouble).reshape({4, 4}).narrow(0, r0, 2).narrow(1, c0, 2));
  return w;
}

at::Tensor halo_output(int worker) {
  switch (worker) {
    case 0:  // global rows -1..2, columns -1..2; (2,2) = 10 from worker 3
      return grid4({-1, -1, -1, -1,  //
                    -1, 0, 1, 2,     //
                    -1, 4, 5, 6,     //
                    -1, 8, 9, 10});
    case 1:  // rows -1..2, columns 1..4; (2,1) = 9 from worker 2
      return grid4({-1, -1, -1, -1,  //
                    1, 2, 3, -1,     //
                    5, 6, 7, -1,     //
                    9, 10, 11, -1});
    case 2:  // rows 1..4, columns -1..2; (1,2) = 6 from worker 1
      return grid4({-1, 4, 5, 6,     //
                    -1, 8, 9, 10,    //
                    -1, 12, 13, 14,  //
                    -1, -1, -1, -1});
    default:  // rows 1..4, columns 1..4; (1,1) = 5 from worker 0
      return grid4({5, 6, 7, -1,     //
                    9, 10, 11, -1,   //
                    13, 14, 15, -1,  //
                    -1, -1, -1, -1});
  }
}

at::Tensor halo_input_grad(int worker) {
  switch (worker) {
    case 0:
      return grid4({1, 1, 1, 1,  //
                    1, 1, 2, 0,  //
                    1, 2, 4, 0,  //
                    1, 0, 0, 0});
    case 1:
      return grid4({1, 1, 1, 1,  //
                    0, 2, 1, 1,  //
                    0, 4, 2, 1,  //
                    0, 0, 0, 1});
    case 2:
      return grid4({1, 0, 0, 0,  //
                    1, 2, 4, 0,  //
                    1, 1, 2, 0,  //
                    1, 1, 1, 1});
    default:
      return grid4({0, 0, 0, 1,  //
                    0, 4, 2, 1,  //
                    0, 2, 1, 1,  //
                    1, 1, 1, 1});
  }
}

}  // namespace partita::spec
