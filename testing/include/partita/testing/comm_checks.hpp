// Checks shared by the communicator's spec and property tests: every rank's
// input drawn from (seed, rank) so that each rank can build every rank's
// input and run the serial reference on the whole list; the forward
// comparison, the adjoint identity and the finite-difference gradient
// check, each deciding this rank's verdict (callers agree on it).
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "partita/mpi/communicator.hpp"
#include "partita/testing/checks.hpp"

namespace partita::testing::comm {

using Tensors = std::vector<at::Tensor>;
using Shape = std::vector<int64_t>;

// Rank `rank`'s input: normal values for floats, small integers (0..7, so
// that products stay small and bitwise operations see several bits) for
// integers, random booleans; never all zeros for a non-empty shape.
at::Tensor input_of(uint64_t seed, int rank, const Shape& shape, at::ScalarType dtype);

// A call under test: what one rank runs, and what the reference computes
// from every rank's input.
struct Call {
  std::string name;
  std::function<at::Tensor(const mpi::Communicator&, const at::Tensor&)> run;
  std::function<Tensors(const Tensors&)> reference;
  std::function<Shape(int rank)> shape;  // rank's input shape
};

// Sum over the communicator's ranks of a double (on the harness's
// communicator, not the one under test).
double sum_over_ranks(double local);

// "" when this rank's output equals the reference's for this rank (exact for
// integers and booleans; for floats within the dtype's default Tolerance,
// checks.hpp: |got - want| <= bound x max(1, max |want|)); otherwise what
// differed. An all-zero output from a non-zero reference fails too.
std::string compare(const at::Tensor& got, const at::Tensor& want);

// Forward of `c` on every rank's input (dtype, seed) against the reference,
// within `tol` (Tolerance::exact() for a call that only moves values).
std::string check_forward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                          uint64_t seed, const Tolerance& tol = {});

// <F x, y> == <x, F* y> summed over the ranks, float64, y random per rank;
// F* y from backward. Returns "" or the gap. `relative_gap` gets the gap.
std::string check_adjoint(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                          double* relative_gap = nullptr);

// Finite differences (central, eps 1e-6) of L(x) = sum over ranks of
// <F(x)_r, v_r> with respect to every element of every rank's input, against
// the gradient from backward, with gradcheck's tolerances (atol 1e-5,
// rtol 1e-3), float64, for `cotangents` random v.
std::string check_gradient(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                           int cotangents = 1);

// Backward against the reference's autograd: with random cotangents v_r
// (drawn from seed + 29 per rank), this rank's input gradient of
// sum_r <F(x)_r, v_r> equals the reference's (float dtypes).
// `unused` (world ranks): there the output does not reach the loss; backward
// gets an undefined gradient, the reference a zero cotangent.
std::string check_backward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                           uint64_t seed, const std::vector<int>& unused = {});

// Every rank's reference output of `c` (its inputs drawn as above).
Tensors reference_outputs(const Call& c, int ranks, at::ScalarType dtype, uint64_t seed);

}  // namespace partita::testing::comm
