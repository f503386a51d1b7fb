// partita::testing's checks for a distributed module with parameters
// (docs/testing-library.md, "Checks for a module with parameters"): several
// inputs and outputs per rank, parameters sharded or replicated over the
// ranks, against a serial twin built from the *global* parameters.
//
// The module is described once, as a DistributedModule: this rank's run,
// this rank's parameter shards (where each sits in its global parameter),
// the global parameters' shapes, every rank's input shapes, and the twin.
// The checks draw the global parameters themselves from the seed (the same
// on every rank), copy each rank's slice into its shards, draw every rank's
// inputs, and compare this rank's outputs, input gradients and shard
// gradients with the twin's (a shard's gradient against the same slice of
// the twin's global gradient, so a replicated parameter must hold the whole
// gradient on every rank that holds it). Nothing is gathered: every rank
// runs the twin on the whole problem itself.
//
// Each check is collective over the world and returns this rank's verdict
// ("" or what differed), like the checks of checks.hpp: agree it with
// PARTITA_EXPECT_AGREED, or run it inside check_lockstep.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "partita/arg.hpp"
#include "partita/testing/checks.hpp"

namespace partita::testing {

// One rank's piece of a global parameter.
struct ParameterShard {
  std::string name;  // the global parameter it is a piece of
  at::Tensor tensor;  // the module's own tensor (a leaf that requires grad)
  // Its first element's index in the global parameter, one per dimension;
  // empty: at the origin (a replicated parameter is a shard of the whole).
  std::vector<int64_t> start;
};

using ParameterMap = std::map<std::string, at::Tensor>;

struct DistributedModule {
  std::string name;
  // What this rank computes from its local inputs, with its parameters.
  // Collective: every rank of the world calls it.
  std::function<Tensors(const Tensors& inputs)> run;
  // This rank's shards (none on a rank that holds no parameter). The checks
  // write the drawn values into them and read their gradients.
  std::function<std::vector<ParameterShard>()> shards;
  // Every global parameter's shape (the same on every rank).
  std::map<std::string, Shape> parameters;
  // Rank r's input shapes.
  std::function<std::vector<Shape>(int rank)> input_shapes;
  // The serial twin on one process: every rank's inputs (world rank order)
  // and the global parameters to every rank's outputs. Differentiable in
  // both; written from the global semantics, never by calling the code
  // under test.
  std::function<std::vector<Tensors>(const std::vector<Tensors>& inputs, const ParameterMap& parameters)> twin;
  // The float dtype of the parameters and inputs; inputs listed here are of
  // an integer dtype instead (token ids: no gradient), drawn in [0, high)
  // with high from integer_high (8 for an input not listed there: give a
  // vocabulary's size, so that every worker's rows are looked up).
  at::ScalarType dtype = at::kDouble;
  std::map<int, at::ScalarType> integer_inputs;
  std::map<int, int64_t> integer_high;
};

// Forward: the shards are the slices of the drawn global parameters (every
// element of every parameter held by some rank), and this rank's outputs
// equal the twin's.
std::string check_module_forward(const DistributedModule& m, uint64_t seed, const Tolerance& tol = {});

// Gradients of sum_r sum_j <out_rj, v_rj> (random v): every float input's
// against the twin's, and every shard's against the slice of the twin's
// global parameter gradient. At the ranks in `unused` no output reaches the
// loss.
std::string check_module_backward(const DistributedModule& m, uint64_t seed, const std::vector<int>& unused = {},
                                  const Tolerance& tol = {});

// The adjoint identity <F(u) - F(0), y> == <u, F* y>, inner products over
// the world (a global parameter's elements counted once however many ranks
// hold them), float64, for a module affine in what is varied: its float
// inputs (parameters held at drawn values) or its parameters (inputs held).
enum class Wrt { Inputs, Parameters };
std::string check_module_adjoint(const DistributedModule& m, uint64_t seed, Wrt wrt, double bound = 1e-10);

// Central finite differences (eps 1e-6, gradcheck's atol 1e-5 and rtol
// 1e-3, float64) of sum_r sum_j <out_rj, v_rj> with respect to every element
// of every global parameter (each rank perturbs the shards that hold it)
// and of every rank's float inputs, against backward. Needs no twin.
std::string check_module_finite_differences(const DistributedModule& m, uint64_t seed);

// Which checks check_module_all runs. Set in LibTorch's style:
// ModuleCheckOptions().adjoint_parameters(true).
struct ModuleCheckOptions {
  PARTITA_ARG(Tolerance, tolerance);
  PARTITA_ARG(bool, forward) = true;
  PARTITA_ARG(bool, backward) = true;
  PARTITA_ARG(bool, adjoint_inputs) = false;      // the module is affine in its inputs
  PARTITA_ARG(bool, adjoint_parameters) = false;  // the module is affine in its parameters
  PARTITA_ARG(bool, finite_differences) = false;  // two calls per parameter and input element
};

// Forward, backward (and again with rank 0's outputs unused), the adjoints
// asked for and finite differences on request, each failure recorded in `v`.
void check_module_all(const DistributedModule& m, uint64_t seed, Verdict& v, const ModuleCheckOptions& options = {});

}  // namespace partita::testing
