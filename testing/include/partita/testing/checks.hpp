// partita::testing's checks for any differentiable distributed function
// (docs/testing-library.md): the user's MPI code against a serial twin, the
// adjoint (dot-product) identity, outputs that do not reach the loss, and
// finite differences where no twin exists.
//
// The function under test is described once, as a DistributedFunction: what
// one rank runs on its local input, the serial twin that maps every rank's
// input to every rank's output on one process, and each rank's input shape.
// Every rank draws every rank's input from (seed, rank), so each rank runs
// the twin on the whole list itself and compares its own output: nothing is
// gathered.
//
// Each check_* is collective over the world (every rank calls it with the
// same arguments, in the same order) and returns this rank's verdict: "" when
// it passed, otherwise what differed. Verdicts differ between ranks until
// they are agreed: inside check_lockstep the harness agrees them; in a plain
// GoogleTest use PARTITA_EXPECT_AGREED (or agree()), so that every rank
// passes or fails together.
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "partita/arg.hpp"

namespace partita::testing {

class Verdict;

using Tensors = std::vector<at::Tensor>;
using Shape = std::vector<int64_t>;

// A distributed function under test.
struct DistributedFunction {
  std::string name;
  // What this rank computes from its local input. Collective: every rank of
  // the world calls it (a rank with no part holds a zero-volume input).
  std::function<at::Tensor(const at::Tensor& x)> run;
  // The serial twin, on one process: the list of every rank's input (in
  // world rank order) to the list of every rank's output. Differentiable
  // (the checks take its gradients with autograd); written the obvious way
  // from the global semantics, never by calling the code under test.
  std::function<Tensors(const Tensors& inputs)> twin;
  // Rank r's input shape.
  std::function<Shape(int rank)> input_shape;
};

// How close a float result must be to its twin's: |got - want| <= bound *
// max(1, max |want|), per dtype; `bitwise` asks for equal bits (integer
// dtypes are always compared exactly).
// Set in LibTorch's style: Tolerance().float32(1e-4).
struct Tolerance {
  PARTITA_ARG(double, float64) = 8e-12;
  PARTITA_ARG(double, float32) = 8e-5;
  PARTITA_ARG(double, float16) = 0.24;  // float16 and bfloat16
  PARTITA_ARG(bool, bitwise) = false;

 public:
  static Tolerance exact() { return Tolerance().bitwise(true); }
  double of(at::ScalarType t) const;
};

// Rank `rank`'s tensor drawn from `seed`: normal values for floats, integers
// in [0, high) (0..7 by default), random booleans; never all zeros (all
// false) for a non-empty shape unless high is 1 (an all-zero check proves
// nothing); drawn from (seed, rank), so each rank's is its own draw (two
// small integer tensors may still come out equal).
at::Tensor rank_input(uint64_t seed, int rank, const Shape& shape, at::ScalarType dtype, int64_t high = 8);

// "" when `got` equals `want` within `tol` (shape and dtype too); otherwise
// what differed. An all-zero `got` where `want` is not zero within the
// tolerance fails too.
std::string compare(const at::Tensor& got, const at::Tensor& want, const Tolerance& tol = {});

// Forward: this rank's output of `f.run` against the twin's output for this
// rank, inputs of `dtype` drawn from `seed`.
std::string check_forward(const DistributedFunction& f, at::ScalarType dtype, uint64_t seed,
                          const Tolerance& tol = {});

// Input gradient: with random cotangents v_r, the gradient of
// sum_r <f(x)_r, v_r> with respect to this rank's input, from backward
// through `f.run`, against the twin's through autograd (float dtypes).
// `unused` (world ranks): there the output does not reach the loss; backward
// gets an undefined gradient, the twin a zero cotangent.
std::string check_backward(const DistributedFunction& f, at::ScalarType dtype, uint64_t seed,
                           const std::vector<int>& unused = {}, const Tolerance& tol = {});

// The adjoint identity <F x, y> == <x, F* y>, inner products summed over
// the world, float64, x and y random and rank-dependent; F* y by backward.
// Also fails when backward changed the cotangent its caller holds, and when
// the same cotangent arriving from inside the graph ((F(x) * y).sum(), a
// gradient only the node holds, which it may reuse in place) gives another
// gradient. `relative_gap` receives |lhs - rhs| / (norms).
std::string check_adjoint(const DistributedFunction& f, uint64_t seed,
                          double* relative_gap = nullptr, double bound = 1e-10);

// Outputs that reach no loss on any rank: backward through a loss whose
// gradient comes back undefined must leave every input that requires grad
// with a gradient of zeros (as PyTorch's custom Functions and so DistDL's
// layers do), not ones, not garbage and, with `require_defined`, not
// undefined.
std::string check_unused_output(const DistributedFunction& f, uint64_t seed,
                                bool require_defined = true);

// Central finite differences (eps 1e-6) of L(x) = sum_r <f(x)_r, v_r> with
// respect to every element of every rank's input against backward, with
// gradcheck's tolerances (atol 1e-5, rtol 1e-3), float64; needs no twin.
std::string check_finite_differences(const DistributedFunction& f, uint64_t seed,
                                     int cotangents = 1);

// Which checks check_all runs.
// Set in LibTorch's style: CheckOptions().dtypes({at::kDouble}).finite_differences(true).
struct CheckOptions {
  PARTITA_ARG(std::vector<at::ScalarType>, dtypes) = {at::kDouble, at::kFloat};
  PARTITA_ARG(Tolerance, tolerance);
  PARTITA_ARG(bool, forward) = true;
  PARTITA_ARG(bool, backward) = true;
  PARTITA_ARG(bool, adjoint) = true;
  PARTITA_ARG(bool, unused_output) = true;
  PARTITA_ARG(bool, finite_differences) = false;  // costs two calls of f per input element
};

// Every selected check for one seed, each failure recorded in `v`.
void check_all(const DistributedFunction& f, uint64_t seed, Verdict& v,
               const CheckOptions& options = {});

// A scalar loss that passes `y` on but whose gradient comes back undefined:
// what a layer's backward sees on a rank whose output does not reach the loss.
at::Tensor loss_without_gradient(const at::Tensor& y);

// Agreement over the world, for test bodies and fixtures: collective (every
// rank calls the same helper in the same order), on a communicator of their
// own (checks_comm()), under partita's waiting policy, deadline and
// watchdog. Use them instead of raw MPI collectives in a test: a rank whose
// peer has left the test by an exception then fails with a DeadlineError
// within the deadline instead of waiting forever (docs/testing-library.md,
// "No test can hang").
double sum_over_ranks(double local);
std::vector<double> sum_over_ranks(std::vector<double> local);  // elementwise
double min_over_ranks(double local);
double max_over_ranks(double local);
bool all_ranks(bool local_ok);
void sync_ranks();  // a barrier
// The helpers' communicator: a duplicate of the world that nothing else
// uses, made at the first call of any helper, of harness_comm() or of
// partita::testing's main(), and replaced by renew_after_missed_deadline().
MPI_Comm checks_comm();
// After a missed deadline (operations abandoned on partita's world
// communicator and on the helpers'): replaces both by fresh duplicates.
// Collective over the world. partita::testing's main() does it between
// tests, the lockstep harness between cases.
void renew_after_missed_deadline();
// "" on every rank when `local` is "" on every rank; otherwise, on every
// rank, one line per failing rank ("rank r: ...").
std::string agree(const std::string& local);

}  // namespace partita::testing

// In a GoogleTest body: the verdict of a check, agreed by every rank, so that
// all ranks pass or fail the test together and each prints every failure.
#define PARTITA_EXPECT_AGREED(verdict_expr)                                   \
  do {                                                                         \
    const std::string partita_agreed_ = ::partita::testing::agree(verdict_expr); \
    EXPECT_TRUE(partita_agreed_.empty()) << partita_agreed_;                   \
  } while (0)
