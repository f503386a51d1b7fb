// The header board (docs/mpi-runtime.md, "The header board"): the layers'
// per-call header exchange through shared memory when every rank of the
// partition runs on one node, through MPI_Allgather when they span nodes.
// These tests run on one node (mpirun on this machine, at 2, 3 and 4 ranks)
// and across simulated nodes (tools/simnodes.sh: 2 nodes of 2 ranks, 4 of
// 1), and check that
// - every rank gets what MPI_Allgather of the same headers gives, call
//   after call, on partitions whose rank order is not the world's, and on
//   communicators exchanged on in turn: the world, the world reversed, all
//   but the last rank (across 2 nodes of 2: two ranks of one node and one of
//   the other) and the ranks of this rank's node;
// - each call took the path its communicator's nodes say, counted (an
//   MPI_Allgather or MPI_Iallgather of the headers, counted through MPI's
//   profiling interface, or none and a board): node-local communicators of
//   two ranks or more the board, communicators that span nodes MPI, every
//   rank of them alike;
// - the communicator's calls (seed 003) exchange their records on the same
//   paths, interleaved with the layers' header exchanges on one
//   communicator, and compute what they should;
// - one rank that refuses boards makes every rank use MPI, with the same
//   results, for the layers' headers and the communicator's records alike;
// - a rank whose waits were abandoned (missed deadlines) catches up: the
//   others read the header it posted, its next try posts nothing until they
//   have, and the exchanges after it are right;
// - a board leaves no name in /dev/shm, and boards of freed partitions are
//   released (made and freed thirty times).
// The last three run on the ranks of each node (the whole world on one
// node), and skip where nodes have one rank each.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "detail/header_board.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/checks.hpp"
#include "partita/testing/lockstep.hpp"

// The header exchange's MPI path, counted: the test's own MPI_Allgather
// calls go to PMPI_ directly.
std::atomic<long> g_header_allgathers{0};
extern "C" {
int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                  MPI_Comm c) {
  ++g_header_allgathers;
  return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                   MPI_Comm c, MPI_Request* q) {
  ++g_header_allgathers;
  return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
}
}

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
  EXPECT_EQ(PMPI_Iallgather(&mine, n, MPI_INT64_T, all.data(), n, MPI_INT64_T, P.comm(), &req), MPI_SUCCESS);
  mpi::wait(req, "the headers' MPI_Iallgather");
  return all;
}

// The world's ranks in reverse: P's rank i is world rank size-1-i.
mpi::Partition reversed() {
  Ranks r;
  for (int i = size() - 1; i >= 0; --i) r.push_back(i);
  return mpi::Partition::world().create_partition_inclusive(r);
}

// Every world rank's node, named by its lowest world rank
// (MPI_COMM_TYPE_SHARED), the same on every rank.
const std::vector<int>& node_of() {
  static std::vector<int> nodes;
  if (!nodes.empty()) return nodes;
  MPI_Comm node = MPI_COMM_NULL;
  // raw-mpi-ok: no posted form; every rank reaches this at its first test
  EXPECT_EQ(MPI_Comm_split_type(mpi::world_comm(), MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node),
            MPI_SUCCESS);
  int first = rank();
  MPI_Request req;
  EXPECT_EQ(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, node, &req), MPI_SUCCESS);
  mpi::wait(req, "the node's lowest rank");
  MPI_Comm_free(&node);
  nodes.resize(static_cast<size_t>(size()));
  EXPECT_EQ(PMPI_Iallgather(&first, 1, MPI_INT, nodes.data(), 1, MPI_INT, mpi::world_comm(), &req),
            MPI_SUCCESS);
  mpi::wait(req, "every rank's node");
  return nodes;
}

bool spans_nodes(const mpi::Partition& P) {
  for (int w : P.workers())
    if (node_of()[static_cast<size_t>(w)] != node_of()[static_cast<size_t>(P.workers()[0])]) return true;
  return false;
}

// The ranks of this rank's node, in reverse order (on one node, the world
// reversed). Collective over the world: one partition per node is made.
mpi::Partition node_partition() {
  std::optional<mpi::Partition> mine;
  const std::vector<int>& nodes = node_of();
  for (int n = 0; n < size(); ++n) {
    if (nodes[static_cast<size_t>(n)] != n) continue;  // n is not a node's lowest rank
    Ranks members;
    for (int r = size() - 1; r >= 0; --r)
      if (nodes[static_cast<size_t>(r)] == n) members.push_back(r);
    mpi::Partition q = mpi::Partition::world().create_partition_inclusive(members);
    if (q.active()) mine = q;
  }
  return *mine;
}

// The fewest ranks any node has.
int smallest_node() {
  int fewest = size();
  for (int n = 0; n < size(); ++n) {
    if (node_of()[static_cast<size_t>(n)] != n) continue;
    int k = 0;
    for (int w : node_of()) k += w == n ? 1 : 0;
    fewest = std::min(fewest, k);
  }
  return fewest;
}

// The pids of this job's processes (collective over the world).
const std::vector<long>& job_pids() {
  static std::vector<long> pids;
  if (pids.empty()) {
    pids.resize(static_cast<size_t>(size()));
    long mine = static_cast<long>(getpid());
    MPI_Request req;
    EXPECT_EQ(PMPI_Iallgather(&mine, 1, MPI_LONG, pids.data(), 1, MPI_LONG, mpi::world_comm(), &req), MPI_SUCCESS);
    mpi::wait(req, "every rank's pid");
  }
  return pids;
}

bool shm_name_exists(const std::string& name) {  // name without the leading '/'
  return access(("/dev/shm/" + name).c_str(), F_OK) == 0;
}

// Names of board segments in this node's /dev/shm made by this job's
// processes (a name carries its creator's pid): none should last. Other
// jobs' names (ctest -j, a job killed earlier) are not this job's to count.
int board_names() {
  const std::vector<long>& pids = job_pids();
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (const dirent* e = readdir(d)) {
      long pid = 0;
      if (std::sscanf(e->d_name, "partita-board-%ld-", &pid) == 1 &&
          std::find(pids.begin(), pids.end(), pid) != pids.end())
        ++n;
    }
    closedir(d);
  }
  return n;
}

// The four communicators the path tests exchange on in turn, made in this
// order on every rank: the world, the world reversed, all but the last rank
// (at 3 ranks and more, its last member's comm rank is not its world rank
// either) and the ranks of this rank's node.
struct FourPartitions {
  mpi::Partition world = mpi::Partition::world();
  mpi::Partition back = reversed();
  mpi::Partition part = all_but_last();
  mpi::Partition local = node_partition();
  std::vector<const mpi::Partition*> all() const { return {&world, &back, &part, &local}; }
  static constexpr const char* kNames[] = {"the world", "the world reversed", "all but the last rank",
                                           "this node's ranks"};

  static mpi::Partition all_but_last() {
    Ranks some;
    for (int i = size() - 2; i >= 0; --i) some.push_back(i);
    return mpi::Partition::world().create_partition_inclusive(some);
  }
};

// Every call of every rank on the path of its communicator's nodes, as
// counted (`by_mpi[p]`, `by_board[p]` of `calls` on partition p): the board
// where all its ranks share a node (one rank alone takes neither), MPI where
// they span nodes; and every rank alike.
void expect_paths(const FourPartitions& four, const std::vector<int>& by_mpi, const std::vector<int>& by_board,
                  int calls, const std::string& exchange) {
  const auto partitions = four.all();
  for (size_t p = 0; p < partitions.size(); ++p) {
    const mpi::Partition& P = *partitions[p];
    bool right = true;
    if (P.active() && P.size() >= 2) {
      const bool spans = spans_nodes(P);
      right = by_mpi[p] == (spans ? calls : 0) && by_board[p] == (spans ? 0 : calls);
      EXPECT_TRUE(right) << FourPartitions::kNames[p]
                         << (spans ? " spans nodes: every " + exchange + " by MPI"
                                   : " is on one node: every " + exchange + " by its board")
                         << "; here " << by_mpi[p] << " by MPI, " << by_board[p] << " by a board, of " << calls;
    }
    EXPECT_TRUE(agreed(right)) << FourPartitions::kNames[p] << ": some rank's calls took another path";
  }
}

// Counts one exchange on P by its path: one MPI_Allgather (or its posted
// form) and no board, or none and a board.
void count_path(const mpi::Partition& P, long mpi_calls, int& by_mpi, int& by_board) {
  if (mpi_calls == 1 && !has_header_board(P.comm())) ++by_mpi;
  if (mpi_calls == 0 && has_header_board(P.comm())) ++by_board;
}

TEST(HeaderBoard, GathersWhatMpiGathersCallAfterCall) {
  ASSERT_GE(size(), 2) << "run at 2 ranks or more";
  const FourPartitions four;
  const auto partitions = four.all();
  // Per partition, the calls that went by MPI and those that went by a board.
  std::vector<int> by_mpi_calls(partitions.size(), 0), by_board_calls(partitions.size(), 0);
  std::vector<Header> got;
  bool ok = true;
  constexpr int kCalls = 300;
  for (int call = 1; call <= kCalls; ++call) {
    // The communicators in turn, each with its own board or none.
    for (size_t p = 0; p < partitions.size(); ++p) {
      const mpi::Partition& P = *partitions[p];
      if (!P.active()) continue;
      const Header mine = drawn(call, rank());
      const long before = g_header_allgathers.load();
      exchange_headers(P, mine, "HeaderBoard test", got);
      count_path(P, g_header_allgathers.load() - before, by_mpi_calls[p], by_board_calls[p]);
      if (!as_drawn(P, call, got)) ok = false;
      const auto expected = by_mpi(P, mine);
      if (std::memcmp(expected.data(), got.data(), expected.size() * sizeof(Header)) != 0) ok = false;
    }
  }
  EXPECT_TRUE(agreed(ok)) << "some exchange differed from MPI_Allgather's";
  expect_paths(four, by_mpi_calls, by_board_calls, kCalls, "call");
}

// One call of a communicator `comm` made from `P`, whether it gave the
// right result: on an even call an allreduce of every member's
// (world rank + 1) * call, on an odd one a broadcast from P's rank
// call % size of its world rank + `offset`; `n` elements.
bool alternating_call(const mpi::Communicator& comm, const mpi::Partition& P, int call, int64_t n,
                      double offset) {
  at::Tensor y, want;
  if (call % 2 == 0) {
    y = comm.allreduce(at::full({n}, (rank() + 1.0) * call, at::kDouble), ReduceOp::kSum);
    double sum = 0;
    for (int w : P.workers()) sum += (w + 1.0) * call;
    want = at::full({n}, sum, at::kDouble);
  } else {
    const int root = call % P.size();
    y = comm.bcast_(at::full({n}, rank() + offset, at::kDouble), root);
    want = at::full({n}, P.workers()[static_cast<size_t>(root)] + offset, at::kDouble);
  }
  return at::equal(y, want);
}

// The communicator's record exchange takes the same path as the layers'
// header exchange on the same communicator, call after call, the two
// interleaved (one board, one sequence of calls): a Communicator made from
// each partition above runs an allreduce or a broadcast between two header
// exchanges. Counted as above: the records' MPI_Allgather, or none and a
// board; the data go by MPI_Allreduce and MPI_Bcast, which are not counted.
TEST(HeaderBoard, CommunicatorCallsTakeTheirCommunicatorsPath) {
  ASSERT_GE(size(), 2) << "run at 2 ranks or more";
  const FourPartitions four;
  const auto partitions = four.all();
  std::vector<mpi::Communicator> comms;
  for (const mpi::Partition* P : partitions) comms.push_back(mpi::Communicator::from(*P));
  std::vector<int> by_mpi_calls(partitions.size(), 0), by_board_calls(partitions.size(), 0);
  std::vector<Header> got;
  bool ok = true;
  std::string why;
  constexpr int kCalls = 100;
  for (int call = 1; call <= kCalls; ++call) {
    for (size_t p = 0; p < partitions.size(); ++p) {
      const mpi::Partition& P = *partitions[p];
      if (!P.active()) continue;
      exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
      if (!as_drawn(P, call, got)) ok = false;
      const long before = g_header_allgathers.load();
      const bool right = alternating_call(comms[p], P, call, 3, 0.5);
      count_path(P, g_header_allgathers.load() - before, by_mpi_calls[p], by_board_calls[p]);
      if (!right) {
        ok = false;
        why = "call " + std::to_string(call) + " on partition " + std::to_string(p) + " gave a wrong result";
      }
    }
  }
  EXPECT_TRUE(ok) << why;
  EXPECT_TRUE(agreed(ok)) << "some communicator call or header exchange went wrong";
  expect_paths(four, by_mpi_calls, by_board_calls, kCalls, "record exchange");
}

// Whether no higher rank shares this rank's node (the rank that refuses
// boards in the tests below).
bool last_of_its_node() {
  const std::vector<int>& nodes = node_of();
  for (int r = rank() + 1; r < size(); ++r)
    if (nodes[static_cast<size_t>(r)] == nodes[static_cast<size_t>(rank())]) return false;
  return true;
}

TEST(HeaderBoard, OneRankRefusingMakesEveryRankUseMpi) {
  if (smallest_node() < 2) GTEST_SKIP() << "a node of one rank has no board to refuse";
  // The highest rank of each node refuses.
  mpi::detail::set_header_board_allowed(!last_of_its_node());
  const mpi::Partition P = node_partition();
  std::vector<Header> got;
  bool ok = true;
  for (int call = 1; call <= 50; ++call) {
    exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
    if (!as_drawn(P, call, got)) ok = false;
  }
  mpi::detail::set_header_board_allowed(true);
  EXPECT_TRUE(agreed(ok));
  EXPECT_TRUE(agreed(!has_header_board(P.comm()))) << "a rank has a board the last rank refused";
  // And a partition made after it is allowed again has one, where its ranks
  // share a node.
  const mpi::Partition Q = node_partition();
  exchange_headers(Q, drawn(1, rank()), "HeaderBoard test", got);
  EXPECT_TRUE(agreed(as_drawn(Q, 1, got) && (Q.size() < 2 || has_header_board(Q.comm()))));
}

// The communicator's record exchange follows the same agreement: on a node's
// ranks where one of them refuses boards, every call's records go by one
// MPI_Allgather on every rank, and the calls compute what they should.
TEST(HeaderBoard, OneRankRefusingSendsCommunicatorRecordsByMpi) {
  if (smallest_node() < 2) GTEST_SKIP() << "a node of one rank has no board to refuse";
  mpi::detail::set_header_board_allowed(!last_of_its_node());
  const mpi::Partition P = node_partition();
  const mpi::Communicator comm = mpi::Communicator::from(P);
  constexpr int kCalls = 40;
  int by_mpi_calls = 0, by_board_calls = 0;
  bool ok = true;
  for (int call = 1; call <= kCalls; ++call) {
    const long before = g_header_allgathers.load();
    const bool right = alternating_call(comm, P, call, 5, 0.25);
    count_path(P, g_header_allgathers.load() - before, by_mpi_calls, by_board_calls);
    if (!right) ok = false;
  }
  mpi::detail::set_header_board_allowed(true);
  EXPECT_TRUE(agreed(ok)) << "a communicator call gave a wrong result";
  EXPECT_TRUE(agreed(by_mpi_calls == kCalls && by_board_calls == 0))
      << "a node's communicator with a refusing rank: every record exchange by MPI; here "
      << by_mpi_calls << " by MPI, " << by_board_calls << " by a board, of " << kCalls;
}

TEST(HeaderBoard, AnAbandonedWaitCatchesUp) {
  if (smallest_node() < 2) GTEST_SKIP() << "nodes of one rank have no board";
  const mpi::Partition P = node_partition();
  // The node's lowest rank plays the one that gives up (world rank 0 on one
  // node).
  const bool gives_up = node_of()[static_cast<size_t>(rank())] == rank();
  std::vector<Header> got;
  exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);  // makes the board
  ASSERT_TRUE(agreed(has_header_board(P.comm())));
  const double before = mpi::deadline();
  // Rank 0 gives up on call 2 after 0.3 s, and on its first try at call 3
  // too: before writing, that try waits for the others to post call 2, and
  // gives up, having posted nothing. The others come 1.5 s late and must
  // still read rank 0's header of call 2, then its retried call 3.
  bool ok = true;
  if (gives_up) {
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
  EXPECT_TRUE(agreed(ok)) << "an exchange around the missed deadlines of each node's lowest rank went wrong";
  for (int call = 4; call <= 20; ++call) {
    exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
    ok = ok && as_drawn(P, call, got);
  }
  EXPECT_TRUE(agreed(ok));
}

// The same at a communicator's first exchange, which sets its board up
// (two collectives): the node's lowest rank gives up on the setup's wait;
// its retry must resume that setup, not start another that the late ranks'
// setup would match with the wrong collective.
TEST(HeaderBoard, AnAbandonedSetupCatchesUp) {
  if (smallest_node() < 2) GTEST_SKIP() << "nodes of one rank have no board";
  const mpi::Partition P = node_partition();  // a new communicator: no board yet
  const bool gives_up = node_of()[static_cast<size_t>(rank())] == rank();
  std::vector<Header> got;
  bool ok = true;
  if (gives_up) {
    const testing::ExpectedDeadlineMisses expected;
    const double before = mpi::deadline();
    mpi::set_deadline(0.3);
    bool missed = false;
    try {
      exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);
    } catch (const DeadlineError&) {
      missed = true;
    }
    mpi::set_deadline(before);
    EXPECT_TRUE(missed) << "the node's lowest rank should have missed the setup's deadline";
    exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);  // call 1 again
    ok = missed && as_drawn(P, 1, got);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);
    ok = as_drawn(P, 1, got);
  }
  EXPECT_TRUE(agreed(ok)) << "the first exchange around an abandoned setup went wrong";
  for (int call = 2; call <= 12; ++call) {
    exchange_headers(P, drawn(call, rank()), "HeaderBoard test", got);
    ok = ok && as_drawn(P, call, got);
  }
  ok = ok && has_header_board(P.comm());
  EXPECT_TRUE(agreed(ok)) << "exchanges after an abandoned setup went wrong (or the board is off)";
}

TEST(HeaderBoard, BoardsOfFreedPartitionsAreReleased) {
  if (smallest_node() < 2) GTEST_SKIP() << "nodes of one rank have no board";
  job_pids();
  // Another job's name (its process alive: this rank's parent, Hydra's
  // proxy) is not this job's leak.
  const bool lowest = node_of()[static_cast<size_t>(rank())] == rank();
  const std::string other = "partita-board-" + std::to_string(static_cast<long>(getppid())) + "-0-0ther0b0";
  if (lowest) close(shm_open(("/" + other).c_str(), O_CREAT | O_RDWR, 0600));
  testing::sync_ranks();
  std::vector<Header> got;
  bool ok = true;
  for (int i = 0; i < 30; ++i) {
    const mpi::Partition P = node_partition();
    exchange_headers(P, drawn(i, rank()), "HeaderBoard test", got);
    ok = ok && as_drawn(P, i, got) && has_header_board(P.comm());
  }
  EXPECT_TRUE(agreed(ok));
  // Each board's rank 0 unlinks its segment once everyone has mapped it.
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
  testing::sync_ranks();
  if (lowest) shm_unlink(("/" + other).c_str());
}

// A job that died between creating a segment and unlinking it (killed by
// the watchdog, say) leaves its name in /dev/shm; the next board made on
// the node unlinks every name whose creator no longer exists, and no other.
TEST(HeaderBoard, NamesOfDeadProcessesAreSwept) {
  if (smallest_node() < 2) GTEST_SKIP() << "nodes of one rank have no board";
  const bool lowest = node_of()[static_cast<size_t>(rank())] == rank();
  // A pid no process can have (above the kernel's pid_max), and a live one.
  long pid_max = 4194304;
  if (FILE* f = std::fopen("/proc/sys/kernel/pid_max", "r")) {
    if (std::fscanf(f, "%ld", &pid_max) != 1) pid_max = 4194304;
    std::fclose(f);
  }
  const std::string dead = "partita-board-" + std::to_string(pid_max + 7) + "-3-deadbeef";
  const std::string alive = "partita-board-" + std::to_string(static_cast<long>(getppid())) + "-3-a11ve000";
  if (lowest)
    for (const std::string& n : {dead, alive}) close(shm_open(("/" + n).c_str(), O_CREAT | O_RDWR, 0600));
  testing::sync_ranks();
  bool ok = true;
  if (lowest) ok = shm_name_exists(dead) && shm_name_exists(alive);
  EXPECT_TRUE(agreed(ok)) << "could not make the test's names";
  // A new partition of the node: its first exchange makes a board.
  const mpi::Partition P = node_partition();
  std::vector<Header> got;
  exchange_headers(P, drawn(1, rank()), "HeaderBoard test", got);
  ok = as_drawn(P, 1, got) && has_header_board(P.comm());
  testing::sync_ranks();
  if (lowest) {
    EXPECT_FALSE(shm_name_exists(dead)) << "the name of a process that no longer exists was left";
    EXPECT_TRUE(shm_name_exists(alive)) << "the name of a live process was unlinked";
    ok = ok && !shm_name_exists(dead) && shm_name_exists(alive);
    shm_unlink(("/" + dead).c_str());
    shm_unlink(("/" + alive).c_str());
  }
  EXPECT_TRUE(agreed(ok));
}

}  // namespace
}  // namespace partita::spec
