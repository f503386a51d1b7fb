// The waiting policy's two forms of an MPI operation (issue 34 item 1,
// docs/mpi-runtime.md "Blocking calls"): under the spin policy with no
// deadline and no wait interrupt, partita runs a collective's blocking form
// (MPICH runs those faster, by a margin that depends on the host); otherwise
// it posts the non-blocking form and finishes it in its own waiting loop.
//
// The MPI calls are counted through MPI's profiling interface: this file
// defines the MPI_ entry points the layers use and forwards each to its
// PMPI_ twin, so a test sees which form partita called and how often.
// ctest runs it with the suites' deadline (non-blocking forms) and, as
// spec_mpi_runtime_blocking_np2, with none (blocking forms).
#include <gtest/gtest.h>

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "detail/header_board.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/shape.hpp"
#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/functional.hpp"
#include "partita/nn/sum_reduce.hpp"

namespace {
std::map<std::string, int>& counts() {
  static std::map<std::string, int> c;
  return c;
}
bool g_counting = false;
void count(const char* name) {
  if (g_counting) ++counts()[name];
}
}  // namespace

extern "C" {
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  count("MPI_Allreduce");
  return PMPI_Allreduce(s, r, n, t, op, c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request* q) {
  count("MPI_Iallreduce");
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                  MPI_Comm c) {
  count("MPI_Allgather");
  return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                   MPI_Comm c, MPI_Request* q) {
  count("MPI_Iallgather");
  return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  count("MPI_Bcast");
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {
  count("MPI_Ibcast");
  return PMPI_Ibcast(b, n, t, root, c, q);
}
int MPI_Reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  count("MPI_Reduce");
  return PMPI_Reduce(s, r, n, t, op, root, c);
}
int MPI_Ireduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c,
                MPI_Request* q) {
  count("MPI_Ireduce");
  return PMPI_Ireduce(s, r, n, t, op, root, c, q);
}
int MPI_Wait(MPI_Request* q, MPI_Status* s) {
  count("MPI_Wait");
  return PMPI_Wait(q, s);
}
int MPI_Waitall(int n, MPI_Request* q, MPI_Status* s) {
  count("MPI_Waitall");
  return PMPI_Waitall(n, q, s);
}
}

namespace partita::spec {
namespace {

// What this process's settings say: blocking forms unless PARTITA_BLOCKING=0,
// the yield policy or a deadline (every rank of these tests has the same
// environment, so the start-up agreement changes nothing).
bool expected_blocking() {
  const char* off = std::getenv("PARTITA_BLOCKING");
  return !(off && std::string(off) == "0") && mpi::wait_policy() == mpi::WaitPolicy::Spin &&
         mpi::deadline() == 0;
}

struct Counted {
  Counted() {
    counts().clear();
    g_counting = true;
  }
  ~Counted() { g_counting = false; }
  int operator[](const char* name) const {
    auto it = counts().find(name);
    return it == counts().end() ? 0 : it->second;
  }
};

mpi::CartesianPartition world_line() {
  return mpi::Partition::world().create_cartesian_topology_partition({mpi::world_size()});
}
at::Tensor ramp(int64_t n, double rank_scale) {
  return at::arange(n, at::kDouble) + rank_scale * mpi::world_rank();
}

TEST(WaitingPolicy, BlockingWaitsFollowTheSettings) {
  EXPECT_EQ(mpi::blocking_waits(), expected_blocking())
      << "policy " << mpi::wait_policy_name(mpi::wait_policy()) << ", deadline " << mpi::deadline();
  if (!mpi::blocking_waits()) return;
  // A deadline needs partita's own loop (it abandons the operation and throws).
  mpi::set_deadline(1.0);
  EXPECT_FALSE(mpi::blocking_waits()) << "with a deadline";
  mpi::set_deadline(0);
  EXPECT_TRUE(mpi::blocking_waits());
  // So does an interrupt (the pipeline's step listens for failures).
  {
    const std::function<void()> check = [] {};
    const mpi::ScopedWaitInterrupt interrupt(&check);
    EXPECT_FALSE(mpi::blocking_waits()) << "inside a ScopedWaitInterrupt";
  }
  EXPECT_TRUE(mpi::blocking_waits());
  mpi::set_wait_policy(mpi::WaitPolicy::Yield);
  EXPECT_FALSE(mpi::blocking_waits()) << "under the yield policy";
  mpi::set_wait_policy(mpi::WaitPolicy::Spin);
  EXPECT_TRUE(mpi::blocking_waits());
}

// One forward of each layer runs its header exchange and its data's
// collective in the form the settings say, and nothing of the other form.
TEST(WaitingPolicy, LayersCallTheFormThePolicySays) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "a one-rank layer makes no MPI call";
  const bool blocking = expected_blocking();
  const auto P = world_line();

  nn::AllSumReduce allreduce(P, std::vector<int>{0});
  const at::Tensor x = ramp(64, 100);
  (void)allreduce(x);  // the plan is made on the first call
  // Every rank runs on this one node: the header exchange goes through the
  // header board, with no MPI call, unless PARTITA_HEADER_BOARD=0 (the
  // _blocking variant) turns it off (docs/mpi-runtime.md, "The header board").
  const char* setting = std::getenv("PARTITA_HEADER_BOARD");
  const bool board = !(setting && std::string(setting) == "0");
  EXPECT_EQ(mpi::detail::has_header_board(P.comm()), board);
  const int header_calls = board ? 0 : 1;  // the header exchange's MPI calls
  {
    const Counted c;
    const at::Tensor y = allreduce(x);
    EXPECT_TRUE(at::allclose(y, n * at::arange(64, at::kDouble) + 100.0 * n * (n - 1) / 2));
    EXPECT_EQ(c["MPI_Allgather"], blocking ? header_calls : 0) << "the header exchange";
    EXPECT_EQ(c["MPI_Iallgather"], blocking ? 0 : header_calls) << "the header exchange";
    EXPECT_EQ(c["MPI_Allreduce"], blocking ? 1 : 0);
    EXPECT_EQ(c["MPI_Iallreduce"], blocking ? 0 : 1);
  }

  // Broadcast and sum-reduce from rank 0's one-worker partition: one team
  // operation per rank.
  const auto root = mpi::Partition::world().create_partition_inclusive({0}).create_cartesian_topology_partition({1});
  nn::Broadcast bcast(root, P);
  nn::SumReduce reduce(P, root);
  const at::Tensor b = mpi::world_rank() == 0 ? ramp(32, 0) : at::zeros({0}, at::kDouble);
  (void)bcast(b);
  (void)reduce(x);
  {
    const Counted c;
    const at::Tensor y = bcast(b);
    EXPECT_TRUE(at::equal(y, at::arange(32, at::kDouble)));
    EXPECT_EQ(c["MPI_Bcast"], blocking ? 1 : 0);
    EXPECT_EQ(c["MPI_Ibcast"], blocking ? 0 : 1);
  }
  {
    const Counted c;
    const at::Tensor y = reduce(x);
    if (mpi::world_rank() == 0) {
      EXPECT_TRUE(at::allclose(y, n * at::arange(64, at::kDouble) + 100.0 * n * (n - 1) / 2));
    }
    EXPECT_EQ(c["MPI_Reduce"], blocking ? 1 : 0);
    EXPECT_EQ(c["MPI_Ireduce"], blocking ? 0 : 1);
  }

  // All-gather: equal blocks go by MPI_Allgather (or its posted form).
  nn::AllGather gather(P, 0, 0);
  const at::Tensor piece = ramp(8, 1000);
  (void)gather(piece);
  {
    const Counted c;
    const at::Tensor y = gather(piece);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(at::equal(y.narrow(0, 8 * r, 8), at::arange(8, at::kDouble) + 1000.0 * r));
    EXPECT_EQ(c["MPI_Allgather"], blocking ? header_calls + 1 : 0) << "the headers', then the data's";
    EXPECT_EQ(c["MPI_Iallgather"], blocking ? 0 : header_calls + 1) << "the headers', then the data's";
  }
}

// A rank that is the root of one team and a member of another makes two
// team operations per call; its peers make one. Whatever the form, every
// team must finish (a first version ran the two-team rank's operations
// posted and its peers' blocking, which MPI does not match: this hung).
// Broadcast from P_x = [2] on ranks {0, 1} to P_y = [2] on {1, 2}: rank 1
// roots the team {1, 2} and receives in {0, 1}; SumReduce the mirror; and
// from 4 ranks the layout P_x = [2, 1] on {0, 1} to P_y = [2, 2] on
// {0, 1, 2, 3}. Forward and adjoint, checked against the sums by hand.
TEST(WaitingPolicy, RanksInTwoTeamsFinishEveryTeam) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks, running at " << n;
  const auto world = mpi::Partition::world();
  const auto line = [&](const Ranks& ranks, const Shape& shape) {
    return world.create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
  };
  const auto px = line({0, 1}, {2}), py = line({1, 2}, {2});
  const bool in_x = me <= 1, in_y = me == 1 || me == 2;
  // Rank r of P_x holds r + 1 everywhere; P_y's worker j receives P_x's worker j.
  nn::Broadcast bcast(px, py);
  const at::Tensor x = (in_x ? at::full({5}, me + 1.0, at::kDouble) : at::zeros({0}, at::kDouble))
                           .requires_grad_(true);
  const at::Tensor y = bcast(x);
  if (in_y) {
    EXPECT_TRUE(at::equal(y, at::full({5}, static_cast<double>(me), at::kDouble)))
        << "rank " << me << " received " << y;
  }
  // The adjoint: each P_x worker gets its P_y partner's cotangent (3 * partner rank).
  y.backward(in_y ? at::full(y.sizes(), 3.0 * me, at::kDouble) : at::zeros(y.sizes(), at::kDouble));
  if (in_x) {
    EXPECT_TRUE(at::equal(x.grad(), at::full({5}, 3.0 * (me + 1), at::kDouble)))
        << "rank " << me << "'s gradient " << x.grad();
  }
  // The mirror: P_y's worker j sums into P_x's worker j.
  nn::SumReduce reduce(py, px);
  const at::Tensor z = reduce(in_y ? at::full({4}, me * 10.0, at::kDouble) : at::zeros({0}, at::kDouble));
  if (in_x) {
    EXPECT_TRUE(at::equal(z, at::full({4}, (me + 1) * 10.0, at::kDouble))) << "rank " << me << ": " << z;
  }
  if (n < 4) return;
  // Two teams of two, rank 1 rooting {1, 3} and receiving in {0, 2}.
  const auto px2 = line({0, 1}, {2, 1}), py2 = line({0, 1, 2, 3}, {2, 2});
  nn::Broadcast wide(px2, py2);
  const at::Tensor w = wide(me <= 1 ? at::full({3}, 7.0 + me, at::kDouble) : at::zeros({0}, at::kDouble));
  if (me <= 3) {
    const double expected = 7.0 + me / 2;  // P_y worker (i, j) receives P_x worker i
    EXPECT_TRUE(at::equal(w, at::full({3}, expected, at::kDouble))) << "rank " << me << ": " << w;
  }
}

// Point-to-point waits follow the same choice: MPI_Wait/MPI_Waitall, or
// partita's loop of tests.
TEST(WaitingPolicy, WaitsFinishInMpiOnlyWhenBlocking) {
  const bool blocking = expected_blocking();
  const int me = mpi::world_rank(), n = mpi::world_size();
  double out = me, in = -1;
  MPI_Request reqs[2];
  const Counted c;
  MPI_Irecv(&in, 1, MPI_DOUBLE, (me + n - 1) % n, 7, mpi::world_comm(), &reqs[0]);
  MPI_Isend(&out, 1, MPI_DOUBLE, (me + 1) % n, 7, mpi::world_comm(), &reqs[1]);
  mpi::wait_all(2, reqs, "a ring of one double");
  EXPECT_EQ(in, (me + n - 1) % n);
  EXPECT_EQ(c["MPI_Waitall"], blocking ? 1 : 0);
}

// Rank 0 gives `op` up at a 0.3 s deadline; the other ranks call it 1.5 s
// late, and what `op` returns there (whether its result is right) joins the
// verdict. Right after giving up, rank 0 allocates `numel` doubles of -7 (where
// a freed buffer of the operation would be handed out again), and once the
// late operation has finished into rank 0's buffers, that tensor must be
// untouched.
void expect_late_peer_leaves_new_memory_alone(const std::function<bool()>& op, int64_t numel,
                                              const std::string& what) {
  const bool gives_up = mpi::world_rank() == 0;
  const double before = mpi::deadline();
  mpi::set_deadline(gives_up ? 0.3 : 60);
  const long kept = mpi::kept_forever();
  bool ok = true;
  at::Tensor after;
  if (gives_up) {
    const testing::ExpectedDeadlineMisses expected;
    bool missed = false;
    try {
      (void)op();
    } catch (const DeadlineError&) {
      missed = true;
    }
    after = at::full({numel}, -7.0, at::kDouble);
    EXPECT_TRUE(missed) << "rank 0 should have given the " << what << " up at its deadline";
    EXPECT_GT(mpi::kept_forever(), kept) << "the given-up " << what << "'s buffers were not kept";
    ok = missed;
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ok = op();
  }
  mpi::set_deadline(before);
  // Rank 0 waits here while the late messages arrive in its buffers.
  EXPECT_TRUE(mpi::all_true(ok, mpi::world_comm()));
  if (gives_up) {
    const at::Tensor changed = after.ne(-7.0).nonzero();
    EXPECT_EQ(changed.numel(), 0) << "the late " << what << " wrote into memory handed to a new tensor, at "
                                  << changed.view({-1}).narrow(0, 0, std::min<int64_t>(4, changed.numel()));
  }
}

// An operation whose wait gave up keeps its buffers (docs/mpi-runtime.md,
// "Deadlines"): rank 0 gives up an all-gather at its deadline, rank 1 (and
// the others) join it late, and rank 0 finishes it inside its next wait.
// The output it writes then must not be memory handed to another tensor
// since: rank 0 allocates a tensor of the output's size right after giving
// up (where a freed output would be handed out again) and checks that the
// late all-gather left it alone.
TEST(AbandonedOperations, KeepTheirBuffersForALatePeer) {
  const int me = mpi::world_rank(), n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "one rank waits for no one";
  const mpi::Partition P = world_line();  // a communicator of this test's own
  constexpr int64_t kRows = 2048;
  const at::Tensor x = at::full({kRows}, me + 1.0, at::kDouble);
  const std::vector<int64_t> lengths(static_cast<size_t>(n), kRows);
  // (Every rank posts the non-blocking form: a deadline is set.)
  expect_late_peer_leaves_new_memory_alone(
      [&] {
        const at::Tensor y =
            mpi::detail::allgather_dim(mpi::detail::group_of(P), x, 0, lengths, "an all-gather given up", nullptr);
        bool ok = true;
        for (int r = 0; r < n; ++r) ok = ok && y.narrow(0, r * kRows, kRows).eq(r + 1.0).all().item<bool>();
        EXPECT_TRUE(ok) << "rank " << me << ": the late all-gather's result is wrong";
        return ok;
      },
      n * kRows, "all-gather");
}

// The same for a repartition's point-to-point messages: rank 0 gathers a
// 1-D tensor from every rank (P_x the world's line, P_y rank 0 alone), the
// plan made and pinned in a first call every rank makes in time (static
// shapes: the second call exchanges no header). The pieces of the late
// ranks land where rank 0's output was.
TEST(AbandonedOperations, RepartitionKeepsItsBuffersForALatePeer) {
  const int me = mpi::world_rank(), n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "one rank waits for no one";
  const mpi::Partition P_y =
      mpi::Partition::world().create_partition_inclusive({0}).create_cartesian_topology_partition({1});
  const nn::functional::RepartitionPlan plan(world_line(), P_y, nn::RepartitionExchange::kPointToPoint,
                                         Shapes::kStatic);
  constexpr int64_t kRows = 2048;
  const at::Tensor x = at::full({kRows}, me + 1.0, at::kDouble);
  {
    const at::Tensor y = nn::functional::repartition(x, plan);  // in time: the plan is made and pinned
    bool ok = me != 0 || y.numel() == n * kRows;
    for (int r = 0; ok && me == 0 && r < n; ++r) ok = y.narrow(0, r * kRows, kRows).eq(r + 1.0).all().item<bool>();
    EXPECT_TRUE(ok) << "rank 0 gathered " << y.narrow(0, 0, std::min<int64_t>(4, y.numel()));
  }
  expect_late_peer_leaves_new_memory_alone([&] { return nn::functional::repartition(x, plan).defined(); }, n * kRows,
                                           "repartition");
}

// And for a halo exchange's: rank 0's window (a copy of its input, a ghost
// on each side) waits for rank 1's boundary element.
TEST(AbandonedOperations, HaloExchangeKeepsItsBuffersForALatePeer) {
  const int me = mpi::world_rank(), n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "one rank waits for no one";
  const nn::functional::HaloExchangePlan plan(world_line(), {1}, {1}, Shapes::kStatic);
  constexpr int64_t kWindow = 2050;  // 2048 elements and a ghost on each side
  const at::Tensor x = at::full({kWindow}, me + 1.0, at::kDouble);
  {
    const at::Tensor y = nn::functional::halo_exchange(x, plan);  // in time: the plan is made and pinned
    if (me == 0) EXPECT_EQ(y[kWindow - 1].item<double>(), 2.0) << "rank 1's boundary element";
  }
  expect_late_peer_leaves_new_memory_alone([&] { return nn::functional::halo_exchange(x, plan).defined(); }, kWindow,
                                           "halo exchange");
}

// The same for the collectives of partitions' metadata and of the
// agreements on a call's arguments: allgather_data (its first step, the
// lengths) and broadcast_data (its first step, the agreement on the root).
// Their buffers lived on the stack or in locals, freed when the wait gave
// up. Each takes several collectives: rank 0 gives up the first, the late
// ranks finish it with rank 0 (into rank 0's kept buffers) and give up the
// next one, which rank 0 never joins; every rank checks after that. Each
// runs on a communicator of its own, which it leaves broken.
TEST(AbandonedOperations, MetadataCollectivesKeepTheirBuffersForALatePeer) {
  const int me = mpi::world_rank(), n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "one rank waits for no one";
  constexpr int64_t kBytes = 16384;
  const std::vector<std::pair<std::string, std::function<void(const mpi::Partition&)>>> ops = {
      {"allgather_data", [](const mpi::Partition& P) { (void)P.allgather_data(mpi::Bytes(kBytes, 'a')); }},
      {"broadcast_data", [n](const mpi::Partition& P) { (void)P.broadcast_data(mpi::Bytes(kBytes, 'b'), n - 1); }}};
  Ranks everyone(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) everyone[r] = r;
  for (const auto& [what, op] : ops) {
    const mpi::Partition P = mpi::Partition::world().create_partition_inclusive(everyone);
    const double before = mpi::deadline();
    const long kept = mpi::kept_forever();
    const testing::ExpectedDeadlineMisses expected;
    at::Tensor after;
    bool missed = false;
    if (me == 0) {
      mpi::set_deadline(0.3);
      try {
        op(P);
      } catch (const DeadlineError&) {
        missed = true;
      }
      after = at::full({kBytes / 8}, -7.0, at::kDouble);  // where freed buffers would be handed out again
      EXPECT_TRUE(missed) << "rank 0 should have given the " << what << " up at its deadline";
      EXPECT_GT(mpi::kept_forever(), kept) << "the given-up " << what << "'s buffers were not kept";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      mpi::set_deadline(1.0);
      try {
        op(P);
      } catch (const DeadlineError&) {
      }
    }
    mpi::set_deadline(before);
    // Rank 0 progresses MPI here while the late ranks finish the first step.
    EXPECT_TRUE(mpi::all_true(true, mpi::world_comm()));
    if (me == 0) EXPECT_EQ(after.ne(-7.0).nonzero().numel(), 0) << "the late " << what << " wrote into new memory";
  }
}

}  // namespace
}  // namespace partita::spec
