// Seed 003's Isend-Recv-Wait ring in C++ with partita's differentiable
// communicator: every rank sends a = 1 + rank to the right and receives b
// from the left; res = a + b. The gradient of the sum of all res with
// respect to a rank's a is 2 (a appears in its own res and in the right
// neighbour's). Without dummies the graph of each rank is cut where the
// communication is, and backward gives the documented wrong answer 1; with
// join_dummies / join_dummies_handle it gives 2.
//
//   mpiexec.mpich -n 4 build/examples/ring
//
// Exits 0 when every rank saw 1 without and 2 with the dummies.
#include <torch/torch.h>

#include <cstdio>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"

namespace mpi = partita::mpi;

// The seed's code, line by line; returns a.grad.
double ring(const mpi::Communicator& comm, bool with_dummies) {
  const int next = (comm.rank() + 1) % comm.size();
  const int prev = (comm.rank() - 1 + comm.size()) % comm.size();
  torch::Tensor a = torch::tensor({1.0 + comm.rank()}).requires_grad_();
  torch::Tensor res;
  if (!with_dummies) {
    auto handle = comm.isend(a, next, 0);
    torch::Tensor b = comm.recv(torch::empty_like(a), prev, 0);
    comm.wait(handle);
    res = a + b;
  } else {
    auto handle = comm.isend(a, next, 0);
    torch::Tensor recvbuffer = mpi::join_dummies(torch::empty_like(a), {handle.dummy()});
    torch::Tensor b = comm.recv(recvbuffer, prev, 0);
    torch::Tensor wait_ret = comm.wait(mpi::join_dummies_handle(handle, {b}));
    res = mpi::join_dummies(a + b, {wait_ret});
  }
  std::printf("rank %d: res = %g\n", comm.rank(), res.item<double>());
  res.backward();
  return a.grad().item<double>();
}

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  // Without dummies the gradient message of the receive's backward is never
  // received: a communicator of its own keeps it from the second run.
  const double without = ring(mpi::Communicator::world().dup(), false);
  const double with = ring(mpi::Communicator::world().dup(), true);
  const int rank = mpi::world_rank();
  std::printf("rank %d: a.grad without dummies = %g (seed 003: 1), with dummies = %g (2)\n",
              rank, without, with);
  const bool ok = without == 1.0 && with == 2.0;
  const bool all = mpi::all_true(ok, mpi::world_comm());
  if (rank == 0) std::printf("%s\n", all ? "ring: as the seed says on every rank" : "ring: WRONG");
  return all ? 0 : 1;
}
