// Uses an installed partita (examples/consumer): the world's rank 0 holds
// x = [1, 2, 3, 4] on a 1-worker P_x and broadcasts it to a 1 x size P_y;
// backward sum-reduces the gradient back. Every rank checks its values and
// prints one verdict line; exit status 1 when any rank disagrees.
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/broadcast.hpp"

int main(int argc, char** argv) {
  partita::mpi::Environment env(&argc, &argv);
  const int rank = partita::mpi::world_rank(), size = partita::mpi::world_size();
  const auto world = partita::mpi::Partition::world();
  const auto P_x = world.create_partition_inclusive({0}).create_cartesian_topology_partition({1});
  partita::Ranks all;
  for (int r = 0; r < size; ++r) all.push_back(r);
  const auto P_y = world.create_partition_inclusive(all).create_cartesian_topology_partition({size});
  partita::nn::Broadcast broadcast(P_x, P_y);

  const auto want = torch::arange(1, 5, torch::kFloat64);
  // Ranks outside P_x pass a zero-volume input (docs/primitives.md).
  auto x = (P_x.active() ? want.clone() : torch::empty({0}, torch::kFloat64)).requires_grad_();
  const auto y = broadcast(x);
  y.sum().backward();

  bool ok = torch::equal(y.detach(), want);
  // Every one of the `size` copies contributes a gradient of 1 per element.
  if (P_x.active()) ok = ok && torch::equal(x.grad(), torch::full({4}, double(size), torch::kFloat64));
  // One write per line, so the lines of the two ranks do not interleave.
  const std::string line = "rank " + std::to_string(rank) + (ok ? ": OK\n" : ": WRONG\n");
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
  return ok ? 0 : 1;
}
