// The header board where /dev/shm has no room (docs/mpi-runtime.md, "The
// header board"): run by the ctest header_board_full_shm_np2 in a mount
// namespace of its own whose /dev/shm is a small tmpfs. After MPI is up,
// rank 0 fills that tmpfs; a new communicator's first exchange must then
// find no room for its board and take MPI_Allgather, and the layers on it
// must give the right results (the board's first write used to die of
// SIGBUS there). The filler goes, and a later communicator gets its board.
// The test refuses to fill a /dev/shm larger than 256 MiB: it is meant for
// the private one the ctest mounts, never a machine's own.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "detail/header_board.hpp"
#include "detail/team_comm.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/testing/checks.hpp"

namespace partita::spec {
namespace {

constexpr const char* kFiller = "/dev/shm/partita-test-filler";

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

// Rank 0 takes every free byte of /dev/shm; "" or why it could not.
std::string fill_dev_shm() {
  struct statvfs v {};
  if (statvfs("/dev/shm", &v) != 0) return "statvfs(/dev/shm) failed";
  const uint64_t total = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
  if (total > (uint64_t{256} << 20))
    return "/dev/shm holds " + std::to_string(total >> 20) + " MiB: not the private one this test fills";
  const int fd = open(kFiller, O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) return "cannot create the filler";
  // Reserve in 64 KiB steps, then page by page, until the tmpfs refuses.
  off_t at = 0;
  for (const off_t step : {off_t{1} << 16, off_t{4096}})
    while (posix_fallocate(fd, at, step) == 0) at += step;
  close(fd);
  if (statvfs("/dev/shm", &v) != 0 || v.f_bavail != 0) return "/dev/shm still has room";
  return "";
}

// An AllSumReduce over a fresh communicator of every rank: its first call
// makes (or fails to make) the communicator's board.
bool sums_right(const mpi::Partition& P) {
  partita::nn::AllSumReduce reduce(P, std::vector<int>{0});
  const at::Tensor x = at::full({4}, mpi::world_rank() + 1.0, at::kDouble);
  const int n = mpi::world_size();
  const at::Tensor y = reduce(x);
  return at::equal(y, at::full({4}, n * (n + 1) / 2.0, at::kDouble));
}

// A partition of every rank in the order `ranks` (a new communicator each
// time: a partition of the world's ranks in the world's order may share the
// world's).
mpi::Partition ordered(const std::vector<int>& ranks) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(
      {static_cast<int64_t>(ranks.size())});
}

// A header exchange on P itself (its first makes P's board, or not): every
// rank's header arrives, in P's rank order (world ranks `ranks`).
bool exchange_right(const mpi::Partition& P, const std::vector<int>& ranks) {
  mpi::detail::Header mine;
  mine.ndim = 1;
  mine.dims[0] = 100 + mpi::world_rank();
  std::vector<mpi::detail::Header> got;
  mpi::detail::exchange_headers(P, mine, "full /dev/shm test", got);
  bool ok = got.size() == ranks.size();
  for (size_t i = 0; ok && i < got.size(); ++i) ok = got[i].ndim == 1 && got[i].dims[0] == 100 + ranks[i];
  return ok;
}

TEST(HeaderBoardFullShm, AFullDevShmTakesTheMpiPath) {
  ASSERT_GE(mpi::world_size(), 2) << "run at 2 ranks or more";
  std::string why = mpi::world_rank() == 0 ? fill_dev_shm() : "";
  ASSERT_TRUE(agreed(why.empty())) << "rank " << mpi::world_rank() << ": " << why;

  std::vector<int> up, down;
  for (int r = 0; r < mpi::world_size(); ++r) up.push_back(r);
  down.assign(up.rbegin(), up.rend());
  const mpi::Partition full = ordered(down);
  for (int call = 0; call < 3; ++call)
    EXPECT_TRUE(agreed(exchange_right(full, down))) << "exchange " << call << " on a communicator without room for its board";
  EXPECT_TRUE(agreed(!mpi::detail::has_header_board(full.comm()))) << "a board was made with no room for it";
  // A layer, whose team makes its own communicator (and so its own attempt).
  EXPECT_TRUE(agreed(sums_right(full))) << "the sum over a communicator without room for its board";

  if (mpi::world_rank() == 0) unlink(kFiller);
  testing::sync_ranks();
  std::vector<int> rotated(up.begin() + 1, up.end());
  rotated.push_back(0);
  const mpi::Partition later = ordered(rotated);
  EXPECT_TRUE(agreed(exchange_right(later, rotated)));
  EXPECT_TRUE(agreed(mpi::detail::has_header_board(later.comm()))) << "room again, but no board";
  EXPECT_TRUE(agreed(sums_right(later)));
}

}  // namespace
}  // namespace partita::spec
