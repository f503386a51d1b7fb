// Output reuse (docs/output-reuse.md, issue 34 item 1). A primitive's layer
// keeps the small output it returned without an autograd node and writes
// its next output into it when nothing but the layer can reach it any more.
// These tests check, for each of the five team primitives (all-gather along
// a first and a later tensor dimension, which take different paths), at 1,
// 2 and 3 ranks:
// - a dropped output is reused, and the new values are those of a layer
//   that never reused anything;
// - an output the caller still holds, or reaches through a view, a Storage
//   handle, a weak reference to the tensor or to its storage, is left as it
//   was, and the next output is new; so is one the caller made require grad;
// - the layer keeps neither an output with an autograd node (nor, through
//   it, the graph), nor one above the size limit, nor any with the limit 0;
// - inference mode gets an inference tensor, and normal mode a normal one;
// - under torch::NoGradGuard or c10::InferenceMode an input that requires
//   grad gets an output without an autograd node, as LibTorch's own ops
//   give, and that output is reused like any other.
// The communicator's calls that return a new tensor (allreduce, allgather,
// alltoall with its blocks in the output or in a staging buffer, irecv's
// wait) are held to the same rules.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <c10/core/InferenceMode.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include "partita/mpi/buffer_cache.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/functional.hpp"
#include "partita/testing/checks.hpp"

namespace partita::spec {
namespace {

namespace F = partita::nn::functional;
using Layer = std::function<at::Tensor(const at::Tensor&)>;
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }
int rank() { return mpi::world_rank(); }
int size() { return mpi::world_size(); }

// Equal bits, shape and dtype (the testing library's exact comparison).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return testing::compare(a, b, testing::Tolerance::exact()).empty();
}

at::Tensor random(const Shape& shape, int salt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + rank());
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
}

mpi::CartesianPartition row(const Ranks& ranks) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(
      {1, static_cast<int64_t>(ranks.size())});
}

// One primitive: a new layer (plan) on each make(), and this rank's input
// for a salt.
struct Case {
  const char* name;
  std::function<Layer()> make;
  std::function<at::Tensor(int salt)> input;
};

std::vector<Case> cases() {
  Ranks all;
  for (int r = size() - 1; r >= 0; --r) all.push_back(r);  // partition rank != world rank
  std::vector<Case> c;
  c.push_back({"broadcast",
               [all] {
                 const F::BroadcastPlan p(row({0}), row(all));
                 return Layer([p](const at::Tensor& x) { return F::broadcast(x, p); });
               },
               [](int salt) { return rank() == 0 ? random({3, 4}, salt) : at::zeros({0}); }});
  c.push_back({"sum_reduce",
               [all] {
                 const F::SumReducePlan p(row(all), row({0}));
                 return Layer([p](const at::Tensor& x) { return F::sum_reduce(x, p); });
               },
               [](int salt) { return random({3, 4}, salt); }});
  c.push_back({"all_sum_reduce",
               [all] {
                 const F::AllSumReducePlan p(row(all), {1});
                 return Layer([p](const at::Tensor& x) { return F::all_sum_reduce(x, p); });
               },
               [](int salt) { return random({2, 5}, salt); }});
  // Along tensor dimension 0 the blocks arrive in the output itself; along 1
  // they arrive in a staging buffer and are copied into the output.
  c.push_back({"all_gather dim 0",
               [all] {
                 const F::AllGatherPlan p(row(all), 1, 0);
                 return Layer([p](const at::Tensor& x) { return F::all_gather(x, p); });
               },
               [](int salt) { return random({rank() + 1, 3}, salt); }});
  c.push_back({"all_gather dim 1",
               [all] {
                 const F::AllGatherPlan p(row(all), 1, 1);
                 return Layer([p](const at::Tensor& x) { return F::all_gather(x, p); });
               },
               [](int salt) { return random({2, rank() + 1}, salt); }});
  c.push_back({"reduce_scatter",
               [all] {
                 const F::ReduceScatterPlan p(row(all), 1, 1);
                 return Layer([p](const at::Tensor& x) { return F::reduce_scatter(x, p); });
               },
               [](int salt) { return random({3, 5}, salt); }});
  // The communicator's calls that return a new tensor (seed 003), each
  // make() a Communicator of its own (its own slots) on the world.
  c.push_back({"Communicator::allreduce",
               [] {
                 const mpi::Communicator comm = mpi::Communicator::world();
                 return Layer([comm](const at::Tensor& x) { return comm.allreduce(x, ReduceOp::kSum); });
               },
               [](int salt) { return random({2, 5}, salt); }});
  c.push_back({"Communicator::allgather axis 1",
               [] {
                 const mpi::Communicator comm = mpi::Communicator::world();
                 return Layer([comm](const at::Tensor& x) { return comm.allgather(x, 1); });
               },
               [](int salt) { return random({2, rank() + 1}, salt); }});
  // Gathered along axis 0 the blocks arrive in the output; along axis 1,
  // in a staging buffer copied into it.
  c.push_back({"Communicator::alltoall gather 0",
               [] {
                 const mpi::Communicator comm = mpi::Communicator::world();
                 return Layer([comm](const at::Tensor& x) { return comm.alltoall(x, 0, 1, 2); });
               },
               [](int salt) { return random({2, 2 * size()}, salt); }});
  c.push_back({"Communicator::alltoall gather 1",
               [] {
                 const mpi::Communicator comm = mpi::Communicator::world();
                 return Layer([comm](const at::Tensor& x) { return comm.alltoall(x, 1, 0, 2); });
               },
               [](int salt) { return random({2 * size(), 3}, salt); }});
  // irecv's result: each rank receives its left neighbour's tensor (the
  // isend's handle and the irecv's are waited on in the layer).
  c.push_back({"Communicator::irecv (a ring)",
               [] {
                 const mpi::Communicator comm = mpi::Communicator::world();
                 return Layer([comm](const at::Tensor& x) {
                   const int next = (comm.rank() + 1) % comm.size();
                   const int prev = (comm.rank() + comm.size() - 1) % comm.size();
                   auto r = comm.irecv(x, prev, 3);
                   auto h = comm.isend(x, next, 3);
                   at::Tensor y = comm.wait(r);
                   comm.wait(h);
                   return y;
                 });
               },
               [](int salt) { return random({2, 3}, salt); }});
  return c;
}

class OutputReuse : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    limit_ = mpi::output_reuse_limit();
  }
  void TearDown() override { mpi::set_output_reuse_limit(limit_); }
  size_t limit_ = 0;
};

TEST_F(OutputReuse, ADroppedOutputIsReusedWithTheNewValues) {
  for (const auto& c : cases()) {
    const Layer layer = c.make(), check = c.make();
    at::Tensor y = layer(c.input(1));
    const void* data = y.numel() > 0 ? y.data_ptr() : nullptr;
    const c10::TensorImpl* impl = y.unsafeGetTensorImpl();
    y.reset();
    for (int call = 2; call < 5; ++call) {
      const at::Tensor x = c.input(call);
      y = layer(x);
      const at::Tensor expected = check(x);
      bool ok = same_bits(y, expected) && !y.requires_grad() && !y.is_inference();
      // Where this rank's output has elements, it is the first call's tensor.
      if (data) ok = ok && y.data_ptr() == data && y.unsafeGetTensorImpl() == impl;
      EXPECT_TRUE(agreed(ok)) << c.name << ", call " << call << ", rank " << rank() << ": " << y
                              << "\nexpected " << expected;
      // What a partial overwrite would leave shows at the next call.
      if (y.is_floating_point()) y.fill_(std::numeric_limits<float>::quiet_NaN());
      y.reset();
    }
  }
}

// A dropped output whose strides the caller changed in place (column-major
// over the same memory, as t_() leaves a square matrix) is not handed out
// again as if it were laid out by rows: the next result is right.
TEST_F(OutputReuse, ADroppedOutputWithOtherStridesIsNotReadTheOldWay) {
  for (const auto& c : cases()) {
    const Layer layer = c.make(), check = c.make();
    for (int call = 1; call < 4; ++call) {
      const at::Tensor x = c.input(call);
      at::Tensor y = layer(x);
      const at::Tensor expected = check(x);
      EXPECT_TRUE(agreed(same_bits(y, expected))) << c.name << ", call " << call << ", rank " << rank() << ": " << y
                                                   << "\nexpected " << expected;
      if (y.dim() == 2 && y.size(0) > 1 && y.size(1) > 1) y.as_strided_(y.sizes(), {1, y.size(0)});
      y.reset();
    }
  }
}

TEST_F(OutputReuse, AnOutputTheCallerHoldsIsLeftAlone) {
  for (const auto& c : cases()) {
    const Layer layer = c.make(), check = c.make();
    const at::Tensor y1 = layer(c.input(1));
    const at::Tensor before = y1.clone();
    const at::Tensor x2 = c.input(2);
    const at::Tensor y2 = layer(x2);
    bool ok = same_bits(y1, before) && same_bits(y2, check(x2));
    if (y1.numel() > 0) ok = ok && y1.data_ptr() != y2.data_ptr();
    EXPECT_TRUE(agreed(ok)) << c.name << ", rank " << rank();
  }
}

// What the caller keeps of a dropped output: each way of reaching it.
struct Holder {
  const char* name;
  // Takes hold of y; returns a check, after the next call, that what it
  // holds still has the values `before` (y's at the time) and was not handed
  // out as the next output `next`.
  std::function<std::function<bool(const at::Tensor& next)>(const at::Tensor& y, const at::Tensor& before)> hold;
};

std::vector<Holder> holders() {
  std::vector<Holder> h;
  h.push_back({"a view", [](const at::Tensor& y, const at::Tensor& before) {
                 const at::Tensor v = y.view({-1});
                 return std::function<bool(const at::Tensor&)>([v, before](const at::Tensor& next) {
                   return same_bits(v, before.view({-1})) &&
                          (v.numel() == 0 || next.storage().data() != v.storage().data());
                 });
               }});
  h.push_back({"a Storage handle", [](const at::Tensor& y, const at::Tensor& before) {
                 const c10::Storage s = y.storage();
                 return std::function<bool(const at::Tensor&)>([s, before](const at::Tensor& next) {
                   return (before.numel() == 0 ||
                           std::memcmp(s.data(), before.data_ptr(), before.nbytes()) == 0) &&
                          (before.numel() == 0 || next.storage().data() != s.data());
                 });
               }});
  h.push_back({"a weak reference to the tensor", [](const at::Tensor& y, const at::Tensor&) {
                 const auto w = std::make_shared<WeakTensor>(y.getIntrusivePtr());
                 return std::function<bool(const at::Tensor&)>([w](const at::Tensor& next) {
                   // Released (the layer let it go), not handed out again.
                   return w->use_count() == 0 || next.unsafeGetTensorImpl() != w->_unsafe_get_target();
                 });
               }});
  h.push_back({"a weak reference to the storage", [](const at::Tensor& y, const at::Tensor&) {
                 const auto w = std::make_shared<c10::weak_intrusive_ptr<c10::StorageImpl>>(
                     y.storage().getWeakStorageImpl());
                 return std::function<bool(const at::Tensor&)>([w](const at::Tensor& next) {
                   return w->use_count() == 0 ||
                          next.storage().unsafeGetStorageImpl() != w->_unsafe_get_target();
                 });
               }});
  h.push_back({"requires_grad_ on it", [](const at::Tensor& y, const at::Tensor&) {
                 if (y.is_floating_point()) y.requires_grad_(true);
                 return std::function<bool(const at::Tensor&)>([](const at::Tensor& next) {
                   return !next.requires_grad() && next.grad_fn() == nullptr;
                 });
               }});
  return h;
}

TEST_F(OutputReuse, AnOutputReachedAnotherWayIsLeftAlone) {
  for (const auto& c : cases())
    for (const auto& h : holders()) {
      const Layer layer = c.make(), check = c.make();
      at::Tensor y1 = layer(c.input(1));
      const auto still = h.hold(y1, y1.detach().clone());
      y1.reset();
      const at::Tensor x2 = c.input(2);
      const at::Tensor y2 = layer(x2);
      const bool ok = same_bits(y2, check(x2)) && still(y2);
      EXPECT_TRUE(agreed(ok)) << c.name << " through " << h.name << ", rank " << rank();
    }
}

// Whether the layer still holds the output the caller dropped.
bool kept_after_drop(at::Tensor& y) {
  const WeakTensor w(y.getIntrusivePtr());
  y.reset();
  return w.use_count() > 0;
}

TEST_F(OutputReuse, WhatALayerKeeps) {
  for (const auto& c : cases()) {
    const Layer layer = c.make();
    // A small output without a node: kept (where it has elements).
    at::Tensor y = layer(c.input(1));
    const bool has_elements = y.numel() > 0;
    EXPECT_TRUE(agreed(kept_after_drop(y) == has_elements)) << c.name << ", rank " << rank();

    // With an autograd node: neither the output nor its graph.
    const at::Tensor leaf = c.input(2).requires_grad_(true);
    y = layer(leaf * 1);
    const std::weak_ptr<torch::autograd::Node> node = y.grad_fn();
    bool ok = !node.expired() && !kept_after_drop(y) && node.expired();
    EXPECT_TRUE(agreed(ok)) << c.name << " with a node, rank " << rank();

    // Only up to the limit (40 bytes: some outputs fit at each world size,
    // some do not), and none with 0.
    for (size_t limit : {size_t{40}, size_t{0}}) {
      mpi::set_output_reuse_limit(limit);
      y = layer(c.input(3));
      const bool fits = y.numel() > 0 && static_cast<size_t>(y.nbytes()) <= limit;
      ok = kept_after_drop(y) == fits;
      EXPECT_TRUE(agreed(ok)) << c.name << ", limit " << limit << ", rank " << rank();
    }
    mpi::set_output_reuse_limit(limit_);
  }
}

// A kept output of another shape or dtype than the next call's is not
// reused (the same number of elements in another shape included), and
// lowering the limit stops reuse at the next call.
TEST_F(OutputReuse, AnotherShapeOrDtypeOrALowerLimitGetsAFreshOutput) {
  const Layer layer = cases()[2].make();  // all_sum_reduce, one shape everywhere
  const Layer check = cases()[2].make();
  at::Tensor y = layer(random({2, 5}, 1));
  const c10::TensorImpl* first = y.unsafeGetTensorImpl();
  const WeakTensor w(y.getIntrusivePtr());
  y.reset();
  struct Next {
    Shape shape;
    at::ScalarType dtype;
  };
  for (const Next& n : {Next{{5, 2}, at::kFloat}, Next{{2, 5}, at::kDouble}}) {
    const at::Tensor x = random(n.shape, 2).to(n.dtype);
    y = layer(x);
    const at::Tensor expected = check(x);
    const bool ok = same_bits(y, expected) && w.use_count() == 0 && y.unsafeGetTensorImpl() != first;
    EXPECT_TRUE(agreed(ok)) << "shape " << y.sizes() << " " << y.scalar_type() << ", rank " << rank();
    y.reset();
  }
  // A double {2, 5} output (80 bytes) is kept; with the limit lowered to 8
  // the next call releases it instead of reusing it, and keeps nothing.
  y = layer(random({2, 5}, 3).to(at::kDouble));
  const WeakTensor last(y.getIntrusivePtr());
  y.reset();
  bool ok = last.use_count() == 1;
  mpi::set_output_reuse_limit(8);
  const at::Tensor x4 = random({2, 5}, 4).to(at::kDouble);
  y = layer(x4);
  ok = ok && last.use_count() == 0 && same_bits(y, check(x4));
  ok = ok && !kept_after_drop(y);
  EXPECT_TRUE(agreed(ok)) << "lower limit, rank " << rank();
  mpi::set_output_reuse_limit(limit_);
}

TEST_F(OutputReuse, InferenceModeGetsAnInferenceTensor) {
  for (const auto& c : cases()) {
    const Layer layer = c.make(), check = c.make();
    layer(c.input(1));  // dropped: kept by the layer
    at::Tensor inside, expected;
    {
      c10::InferenceMode guard;
      const at::Tensor x = c.input(2);
      inside = layer(x);
      expected = check(x);
    }
    bool ok = same_bits(inside, expected) && (inside.numel() == 0 || inside.is_inference());
    inside.reset();
    const at::Tensor x3 = c.input(3);
    const at::Tensor outside = layer(x3);
    ok = ok && same_bits(outside, check(x3)) && !outside.is_inference();
    EXPECT_TRUE(agreed(ok)) << c.name << ", rank " << rank();
  }
}

TEST_F(OutputReuse, GradModeOffGivesNoNodeAndReuses) {
  for (const auto& c : cases()) {
    const Layer layer = c.make(), check = c.make();
    bool ok = true;
    {
      at::NoGradGuard no_grad;
      at::Tensor y = layer(c.input(1).requires_grad_(true));
      ok = ok && !y.requires_grad() && !y.grad_fn();
      const void* data = y.numel() > 0 ? y.data_ptr() : nullptr;
      y.reset();
      const at::Tensor x2 = c.input(2).requires_grad_(true);
      y = layer(x2);
      ok = ok && !y.requires_grad() && same_bits(y, check(x2.detach()));
      if (data) ok = ok && y.data_ptr() == data;  // the dropped output, reused
    }
    {
      const at::Tensor x3 = c.input(3).requires_grad_(true);
      c10::InferenceMode guard;
      const at::Tensor y = layer(x3);
      ok = ok && !y.requires_grad() && !y.grad_fn();
    }
    // With grad mode on, the node is there again.
    const at::Tensor y4 = layer(c.input(4).requires_grad_(true));
    ok = ok && (y4.numel() == 0 || y4.requires_grad());
    EXPECT_TRUE(agreed(ok)) << c.name << ", rank " << rank();
  }
}

}  // namespace
}  // namespace partita::spec
