// c10d::ProcessGroupGloo, made once per benchmark process (docs/benchmarks.md,
// "LibTorch's collectives"). The group meets through a FileStore whose path
// rank 0 draws and broadcasts over MPI; Gloo's transport is TCP over the
// loopback address, which is what a one-host LibTorch C++ job uses.
#include "gloo_peer.hpp"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "partita/mpi/runtime.hpp"

#ifdef PARTITA_BENCH_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <cstdlib>
#include <string>

namespace partita::bench {

#ifdef PARTITA_BENCH_GLOO
namespace {

struct Group {
  std::string path;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  Group() {
    const MPI_Comm comm = partita::mpi::world_comm();
    char name[128] = {0};
    if (partita::mpi::world_rank() == 0)
      std::snprintf(name, sizeof name, "/tmp/partita-bench-gloo-%ld-%ld", static_cast<long>(getpid()),
                    static_cast<long>(std::chrono::steady_clock::now().time_since_epoch().count()));
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
    path = name;
    auto store = c10::make_intrusive<c10d::FileStore>(path, partita::mpi::world_size());
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    options->threads = 1;
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, partita::mpi::world_rank(),
                                                     partita::mpi::world_size(), options);
    MPI_Barrier(comm);  // every rank connected before the store's file goes
    if (partita::mpi::world_rank() == 0) std::remove(path.c_str());
  }
};

c10d::ProcessGroupGloo& group() {
  static Group g;
  return *g.pg;
}

}  // namespace

// PARTITA_BENCH_GLOO=0 leaves the peer out (its store and devices are on
// 127.0.0.1: one node only; bench/multinode_speed.sh sets it).
bool gloo_available() {
  const char* env = std::getenv("PARTITA_BENCH_GLOO");
  return !(env && std::string(env) == "0");
}

std::string gloo_description(const std::string& call) {
  return "c10d::ProcessGroupGloo " + call + " (FileStore, 127.0.0.1, 1 thread)";
}

void gloo_allreduce(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  group().allreduce(v)->wait();
}
void gloo_broadcast(at::Tensor& t, int root) {
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  group().broadcast(v, o)->wait();
}
void gloo_reduce(at::Tensor& t, int root) {
  std::vector<at::Tensor> v{t};
  c10d::ReduceOptions o;
  o.rootRank = root;
  group().reduce(v, o)->wait();
}
void gloo_allgather(std::vector<at::Tensor>& out, at::Tensor& in) {
  std::vector<std::vector<at::Tensor>> outs{out};
  std::vector<at::Tensor> ins{in};
  group().allgather(outs, ins)->wait();
}

#else

bool gloo_available() { return false; }
std::string gloo_description(const std::string&) { return ""; }
[[noreturn]] static void absent() { throw std::logic_error("bench_primitives was built without Gloo"); }
void gloo_allreduce(at::Tensor&) { absent(); }
void gloo_broadcast(at::Tensor&, int) { absent(); }
void gloo_reduce(at::Tensor&, int) { absent(); }
void gloo_allgather(std::vector<at::Tensor>&, at::Tensor&) { absent(); }

#endif

}  // namespace partita::bench
