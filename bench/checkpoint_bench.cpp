// Save and load of a model-sized set of tensors through partita::checkpoint
// (docs/checkpoints.md, "Speed and memory"): 16 float32 matrices of
// --mib/16 MiB each, half split over the ranks by rows and half by
// columns (strided writes), saved --rounds times and loaded back twice:
// from the page cache, as right after the save, and cold, after rank 0
// dropped the file's pages (posix_fadvise DONTNEED; the save flushed them),
// as a resume on a fresh allocation reads. Prints, on rank 0, one line per
// operation: the median seconds, the bytes, the bandwidth, and every rank's
// peak RSS growth over its shards' bytes.
// bench/checkpoint_bandwidth.sh runs it at 1, 2 and 4 ranks beside dd.
//
//   mpiexec -n 2 build/bench/bench_checkpoint --dir /tmp/ckbench --mib 256 --rounds 3
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "partita/checkpoint.hpp"
#include "partita/distribute.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"

namespace mpi = partita::mpi;
namespace checkpoint = partita::checkpoint;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// The page cache's copy of `path` is dropped (its pages are clean: the save
// flushed them), so the next read comes from the disk.
void drop_cached_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  std::string dir = "/tmp/partita-checkpoint-bench";
  int64_t mib = 256;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--mib") mib = std::stoll(v);
    else if (k == "--rounds") rounds = std::stoi(v);
  }
  const int world = mpi::world_size(), me = mpi::world_rank();
  const auto rows = mpi::Partition::world().create_cartesian_topology_partition({world, 1});
  const auto cols = mpi::Partition::world().create_cartesian_topology_partition({1, world});
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(mib << 20) / 16 / 4));
  std::vector<checkpoint::Shard> shards;
  int64_t mine = 0;
  for (int k = 0; k < 16; ++k) {
    const auto& P = k % 2 ? cols : rows;
    // Each rank makes its own block only (never the global tensor).
    const partita::Shape global = {side, side};
    const auto probe = checkpoint::block("t" + std::to_string(k), at::Tensor(), global, P);
    const int64_t r = partita::local_length(side, k % 2 ? 1 : world, k % 2 ? 0 : me);
    const int64_t c = partita::local_length(side, k % 2 ? world : 1, k % 2 ? me : 0);
    at::Tensor local = at::rand({r, c}, at::kFloat);
    mine += local.nbytes();
    shards.push_back({probe.name, local, global, probe.start});
  }
  const long before = peak_rss_kib();
  const double bytes = 16.0 * side * side * 4;
  std::vector<double> save_s, load_s, cold_s;
  for (int round = 0; round < rounds; ++round) {
    const std::string d = dir + "/round-" + std::to_string(round);
    if (me == 0) std::filesystem::remove_all(d);
    MPI_Barrier(mpi::world_comm());
    auto t0 = std::chrono::steady_clock::now();
    checkpoint::save(d, shards);
    save_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    MPI_Barrier(mpi::world_comm());
    t0 = std::chrono::steady_clock::now();
    checkpoint::load(d, shards);
    load_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (me == 0) drop_cached_pages(d + "/model.safetensors");
    MPI_Barrier(mpi::world_comm());
    t0 = std::chrono::steady_clock::now();
    checkpoint::load(d, shards);
    cold_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    MPI_Barrier(mpi::world_comm());
    if (me == 0) std::filesystem::remove_all(d);
  }
  const long growth = peak_rss_kib() - before;
  const auto all = mpi::allgather_strings(std::to_string(growth) + "/" + std::to_string(mine >> 10), mpi::world_comm());
  if (me == 0) {
    std::string rss;
    for (const auto& a : all) rss += " " + a;
    std::printf("save %d ranks: %.3f s median of %d, %.0f MiB, %.0f MiB/s\n", world, median(save_s), rounds,
                bytes / (1 << 20), bytes / (1 << 20) / median(save_s));
    std::printf("load %d ranks: %.3f s median of %d, %.0f MiB, %.0f MiB/s\n", world, median(load_s), rounds,
                bytes / (1 << 20), bytes / (1 << 20) / median(load_s));
    std::printf("cold load %d ranks: %.3f s median of %d, %.0f MiB, %.0f MiB/s\n", world, median(cold_s), rounds,
                bytes / (1 << 20), bytes / (1 << 20) / median(cold_s));
    std::printf("peak RSS growth over the shards, KiB (growth/shards per rank):%s\n", rss.c_str());
  }
  return 0;
}
