// The header board (docs/mpi-runtime.md, "The header board"): the layers'
// per-call header exchange through shared memory when every rank of the
// partition runs on one node. These tests run on one node (mpirun on this
// machine), at 2, 3 and 4 ranks, and check that
// - every rank gets what MPI_Allgather of the same headers gives, call
//   after call, on partitions whose rank order is not the world's, and on
//   two communicators exchanged on in turn;
// - one rank that refuses boards makes every rank use MPI, with the same
//   results;
// - a rank whose waits were abandoned (missed deadlines) catches up: the
//   others read the header it posted, its next try posts nothing until they
//   have, and the exchanges after it are right;
// - a board leaves no name in /dev/shm, and boards of freed partitions are
//   released (made and freed thirty times).
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "detail/header_board.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/checks.hpp"
#include "partita/testing/lockstep.hpp"

namespace partita::spec {
namespace {

using mpi::detail::exchange_headers;
using mpi::detail::has_header_board;
using mpi::detail::Header;

int rank() { return mpi::world_rank(); }
int size() { return mpi::world_size(); }
bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

// A header with every field drawn from (call, rank): a wrong block, a stale
// call's or another rank's, shows.
Header drawn(int call, int worker) {
  std::mt19937_64 gen(static_cast<uint64_t>(call) * 1000003u + static_cast<uint64_t>(worker));
  Header h;
  h.status = static_cast<int64_t>(gen() % 4);
  h.dtype = static_cast<int64_t>(gen() % 12);
  h.requires_grad = static_cast<int64_t>(gen() % 2);
  h.static_shapes = static_cast<int64_t>(gen() % 2);
  h.ndim = static_cast<int64_t>(gen() % (kMaxTensorDims + 1));
  for (int d = 0; d < kMaxTensorDims; ++d) h.dims[d] = static_cast<int64_t>(gen() >> 8);
  return h;
}

// What every rank of P should get: each member's drawn header, in P's
// rank order.
bool as_drawn(const mpi::Partition& P, int call, const std::vector<Header>& got) {
  if (got.size() != static_cast<size_t>(P.size())) return false;
  for (int i = 0; i < P.size(); ++i) {
    const Header want = drawn(call, P.workers()[static_cast<size_t>(i)]);
    if (std::memcmp(&want, &got[static_cast<size_t>(i)], sizeof(Header)) != 0) return false;
  }
  return true;
}

// MPI_Allgather of the same headers, for comparison.
std::vector<Header> by_mpi(const mpi::Partition& P, const Header& mine) {
  std::vector<Header> all(static_cast<size_t>(P.size()));
  constexpr int n = sizeof(Header) / sizeof(int64_t);
  MPI_Request req;
  EXPECT_EQ(MPI_Iallgather(&mine, n, MPI_INT64_T, all.data(), n, MPI_INT64_T, P.comm(), &req), MPI_SUCCESS);
  mpi::wait(req, "the headers' MPI_Iallgather");
  return all;
}

// The world's ranks in reverse: P's rank i is world rank size-1-i.
mpi::Partition reversed() {
  Ranks r;
  for (int i = size() - 1; i >= 0; --i) r.push_back(i);
  return mpi::Partition::world().create_partition_inclusive(r);
}

// Names of this machine's board segments in /dev/shm (none should last).
int board_names() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (const dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "partita-board-", 14) == 0) ++n;
    closedir(d);
  }
  return n;
}

TEST(HeaderBoard, GathersWhatMpiGathersCallAfterCall) {
  ASSERT_GE(size(), 2) << "run at 2 ranks or more";
  const mpi::Partition world = mpi::Partition::world();
  const mpi::Partition back = reversed();
  // A partition of all but the last rank (at 3 ranks and more), whose last
  // member's comm rank is not its world rank either.
  Ranks some;
  for (int i = size() - 2; i >= 0; --i) some.push_back(i);
  const mpi::Partition part = mpi::Partition::world().create_partition_inclusive(some);
  std::vector<Header> got;
  bool ok = true;
  for (int call = 1; call <= 300; ++call) {
    // Two or three communicators in turn, each with its own board.
    for (const mpi::Partition* P : {&world, &back, &part}) {
      if (!P->active()) continue;
      const Header mine = drawn(call, rank());
      exchange_headers(*P, mine, "HeaderBoard test", got);
      if (!as_drawn(*P, call, got)) ok = false;
      const auto expected = by_mpi(*P, mine);
      if (std::memcmp(expected.data(), got.data(), expected.size() * sizeof(Header)) != 0) ok = false;
    }
  }
  EXPECT_TRUE(agreed(ok)) << "some exchange differed from MPI_Allgather's";
  EXPECT_TRUE(agreed(has_header_board(world.comm()) && has_header_board(back.comm())))
      << "every rank is on one node: the exchanges should have gone through a board";
  if (part.active() && part.size() >= 2) EXPECT_TRUE(has_header_board(part.comm()));
}

TEST(HeaderBoard, OneRankRefusingMakesEveryRankUseMpi) {
  mpi::detail::set_header_board_allowed(rank() != size() - 1);
  const mpi::Partition P = reversed();
  std::vector<Header> got;
  bool ok = true;
  for (int call = 1; call <= 50; ++call) {
    exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
    if (!as_drawn(P, call, got)) ok = false;
  }
  mpi::detail::set_header_board_allowed(true);
  EXPECT_TRUE(agreed(ok));
  EXPECT_TRUE(agreed(!has_header_board(P.comm()))) << "a rank has a board the last rank refused";
  // And a partition made after it is allowed again has one.
  const mpi::Partition Q = reversed();
  exchange_headers(Q, drawn(1, rank()), "HeaderBoard test", got);
  EXPECT_TRUE(agreed(as_drawn(Q, 1, got) && has_header_board(Q.comm())));
}

TEST(HeaderBoard, AnAbandonedWaitCatchesUp) {
  const mpi::Partition P = reversed();
  std::vector<Header> got;
  exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);  // makes the board
  ASSERT_TRUE(agreed(has_header_board(P.comm())));
  const double before = mpi::deadline();
  // Rank 0 gives up on call 2 after 0.3 s, and on its first try at call 3
  // too: before writing, that try waits for the others to post call 2, and
  // gives up, having posted nothing. The others come 1.5 s late and must
  // still read rank 0's header of call 2, then its retried call 3.
  bool ok = true;
  if (rank() == 0) {
    // Counted as missed deadlines (the world is renewed after this test):
    // expected here.
    const testing::ExpectedDeadlineMisses expected;
    mpi::set_deadline(0.3);
    int missed = 0;
    for (int call : {2, 3}) try {
        exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
      } catch (const DeadlineError&) {
        ++missed;
      }
    mpi::set_deadline(before);
    EXPECT_EQ(missed, 2) << "rank 0 should have missed both deadlines";
    ok = missed == 2;
    exchange_headers(P, drawn(3, rank()), "HeaderBoard test", got);  // call 3 again
    ok = ok && as_drawn(P, 3, got);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    for (int call : {2, 3}) {
      exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
      ok = ok && as_drawn(P, call, got);
    }
  }
  EXPECT_TRUE(agreed(ok)) << "an exchange around rank 0's missed deadlines went wrong";
  for (int call = 4; call <= 20; ++call) {
    exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
    ok = ok && as_drawn(P, call, got);
  }
  EXPECT_TRUE(agreed(ok));
}

TEST(HeaderBoard, BoardsOfFreedPartitionsAreReleased) {
  std::vector<Header> got;
  bool ok = true;
  for (int i = 0; i < 30; ++i) {
    const mpi::Partition P = reversed();
    exchange_headers(P, drawn(i, rank()), "HeaderBoard test", got);
    ok = ok && as_drawn(P, i, got) && has_header_board(P.comm());
  }
  EXPECT_TRUE(agreed(ok));
  // Rank 0 unlinks each segment once everyone has mapped it.
  testing::sync_ranks();
  EXPECT_EQ(board_names(), 0) << "a board's segment is still named in /dev/shm";
  // Each process maps its boards' segments: none of the thirty is left.
  int mapped = 0;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::strstr(line, "/partita-board-")) ++mapped;
    std::fclose(f);
  }
  EXPECT_LE(mapped, 8) << "boards of freed partitions are still mapped";
}

}  // namespace
}  // namespace partita::spec
