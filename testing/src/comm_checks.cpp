// The communicator's checks are partita::testing's generic checks
// (checks.hpp) on a Call bound to its communicator: partita's own suites go
// through the same code a user's do.
#include "partita/testing/comm_checks.hpp"

#include <ATen/core/grad_mode.h>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/checks.hpp"

namespace partita::testing::comm {

namespace {
DistributedFunction bind(const mpi::Communicator& comm, const Call& c) {
  // The generic checks draw one input per world rank.
  if (comm.size() != mpi::world_size())
    throw Error("comm_checks: " + c.name + " needs a communicator over the whole world (" +
                std::to_string(comm.size()) + " of " + std::to_string(mpi::world_size()) + " ranks)");
  return {c.name, [&comm, run = c.run](const at::Tensor& x) { return run(comm, x); }, c.reference,
          c.shape};
}
}  // namespace

at::Tensor input_of(uint64_t seed, int rank, const Shape& shape, at::ScalarType dtype) {
  return rank_input(seed, rank, shape, dtype);
}

double sum_over_ranks(double local) { return testing::sum_over_ranks(local); }

std::string compare(const at::Tensor& got, const at::Tensor& want) { return testing::compare(got, want); }

Tensors reference_outputs(const Call& c, int ranks, at::ScalarType dtype, uint64_t seed) {
  Tensors xs;
  for (int r = 0; r < ranks; ++r) xs.push_back(input_of(seed, r, c.shape(r), dtype));
  at::NoGradGuard no_grad;
  return c.reference(xs);
}

std::string check_forward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                          uint64_t seed, const Tolerance& tol) {
  return testing::check_forward(bind(comm, c), dtype, seed, tol);
}

std::string check_backward(const mpi::Communicator& comm, const Call& c, at::ScalarType dtype,
                           uint64_t seed, const std::vector<int>& unused) {
  return testing::check_backward(bind(comm, c), dtype, seed, unused);
}

std::string check_adjoint(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                          double* relative_gap) {
  return testing::check_adjoint(bind(comm, c), seed, relative_gap);
}

std::string check_gradient(const mpi::Communicator& comm, const Call& c, uint64_t seed,
                           int cotangents) {
  return check_finite_differences(bind(comm, c), seed, cotangents);
}

}  // namespace partita::testing::comm
