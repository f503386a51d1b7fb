// Runs one Case on every rank of the world: the MPI implementation against
// the reference, forward, backward and the adjoint identity. The same code
// serves `partita run`, the property tests and the spec tests.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "partita/errors.hpp"
#include "partita/testing/case.hpp"
#include "partita/testing/checks.hpp"  // loss_without_gradient

namespace partita::testing {

struct CaseOutcome {
  bool ok = true;
  std::string summary;   // one line: what was checked, or what differed
  std::string expected_error;  // set when the reference rejects the case
  at::Tensor x, y, dx;   // this rank's input, output and input gradient
  double adjoint_mpi = 0, adjoint_reference = 0;  // relative adjoint gaps
};

// Collective over the world. Throws partita::Error on every rank when the
// world is smaller than the case needs.
CaseOutcome run_case(const Case& c);

// The verdict on a case the reference rejects, on one rank: the reference
// raised `expected_class` (error_class: "ShapeError[tiling.uneven]"), MPI
// raised `mpi_class` ("" when it raised nothing); `involved`: the rank is a
// worker of one of the case's partitions. Agrees only when MPI raised the
// same class naming the same rule (a reference error without a rule agrees
// with nothing), or when an uninvolved rank raised nothing.
bool rejection_agrees(const std::string& expected_class, const std::string& mpi_class, bool involved);

// The class of a partita error, as a word with its rule, for reports and
// rejection_agrees: "ShapeError[team.shapes]", "DeadlineError[no rule]".
std::string error_class(const Error& e);

// True when a and b are the same tensor bit for bit: dtype, shape and every
// byte (how the runner compares a layer's second call with its first).
bool same_bits(const at::Tensor& a, const at::Tensor& b);

// The inputs and cotangents of the documented scheme (Case::data_seed).
at::Tensor case_input(const Case& c, int worker);
at::Tensor case_cotangent(const Case& c, int worker, at::IntArrayRef shape);

}  // namespace partita::testing
