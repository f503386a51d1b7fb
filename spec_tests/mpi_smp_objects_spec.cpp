// Seed 004's object communication over MPI (partita::smp): broadcast with
// recv_from in every group and from every root, send/recv_from between every
// pair named by world, mp and dp ranks, allgather in group-rank order,
// barriers, the seed's synchronous semantics (send and broadcast return only
// after the receivers matched them), typed overloads, wrong types, corrupted
// bytes on the wire, unencodable objects and misuse, each raising on every
// rank involved.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <thread>

#include "expect_raises.hpp"
#include "partita/testing/ivalue_compare.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/message.hpp"

namespace partita::spec {
namespace {

using testing::ivalue_difference;


// A nested object that differs from rank to rank in every part.
c10::IValue object_of(int r) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("rank", r);
  d.insert("half", 0.5 * r);
  d.insert("ids", std::vector<int64_t>{r, r + 1, r + 2});
  const at::Tensor t = at::arange(6 * r, 6 * r + 6, at::kDouble).reshape({2, 3}) / 4 + r;
  return c10::ivalue::Tuple::create(
      {c10::IValue(static_cast<int64_t>(r)), c10::IValue("from rank " + std::to_string(r)), c10::IValue(t),
       c10::IValue(d), c10::IValue(), c10::IValue(r % 2 == 0), c10::IValue(at::arange(r + 1, at::kInt))});
}

std::vector<int> partition_counts(int n) {
  std::vector<int> out;
  for (int p = 1; p <= n; ++p)
    if (n % p == 0) out.push_back(p);
  return out;
}

void init_partitions(int p) {
  smp::Config c;
  c.partitions(p);
  smp::init(c);
}

smp::RankType rank_type_of(smp::CommGroup g) {
  return g == smp::WORLD ? smp::WORLD_RANK : g == smp::MP_GROUP ? smp::MP_RANK : smp::DP_RANK;
}

std::vector<int> members(smp::CommGroup g) {
  return g == smp::WORLD ? smp::layout().members(smp::rank(), g)
                         : g == smp::MP_GROUP ? smp::get_mp_group() : smp::get_dp_group();
}

const smp::CommGroup kGroups[] = {smp::WORLD, smp::MP_GROUP, smp::DP_GROUP};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// --- broadcast, send, allgather, barrier ------------------------------------------

TEST(SmpObjects, BroadcastFromEveryRootOfEveryGroup) {
  for (int p : partition_counts(mpi::world_size())) {
    init_partitions(p);
    for (smp::CommGroup g : kGroups) {
      const auto m = members(g);
      for (size_t root = 0; root < m.size(); ++root) {
        const std::string where = "partitions " + std::to_string(p) + ", " + smp::name(g) + ", root " +
                                  std::to_string(root) + ", rank " + std::to_string(smp::rank());
        if (m[root] == smp::rank()) {
          smp::broadcast(object_of(smp::rank()), g);
        } else {
          const c10::IValue got = smp::recv_from(static_cast<int>(root), rank_type_of(g));
          EXPECT_EQ(ivalue_difference(got, object_of(m[root])), "") << where;
        }
      }
    }
  }
}

// The receiver may name the sender by any rank type: a dp-group broadcast
// received by world rank.
TEST(SmpObjects, BroadcastReceivedByWorldRank) {
  const int n = mpi::world_size();
  init_partitions(n % 2 == 0 ? 2 : 1);
  const auto dp = smp::get_dp_group();
  if (smp::dp_rank() == 0) smp::broadcast(object_of(smp::rank()), smp::DP_GROUP);
  else EXPECT_EQ(ivalue_difference(smp::recv_from(dp[0], smp::WORLD_RANK), object_of(dp[0])), "");
}

// Every ordered pair, one message at a time; each side names the other by
// the first rank type that reaches it (mp, then dp, then world; the sender
// prefers dp).
TEST(SmpObjects, SendBetweenEveryPairByAnyRankType) {
  const int n = mpi::world_size();
  for (int p : partition_counts(n)) {
    init_partitions(p);
    const auto& l = smp::layout();
    auto name_as = [&](int other, bool prefer_dp) -> std::pair<int, smp::RankType> {
      const auto me = l.place(smp::rank()), it = l.place(other);
      const bool same_mp = me.dp_rank == it.dp_rank, same_dp = me.mp_rank == it.mp_rank;
      if (prefer_dp && same_dp) return {it.dp_rank, smp::DP_RANK};
      if (same_mp) return {it.mp_rank, smp::MP_RANK};
      if (same_dp) return {it.dp_rank, smp::DP_RANK};
      return {other, smp::WORLD_RANK};
    };
    for (int src = 0; src < n; ++src)
      for (int dst = 0; dst < n; ++dst) {
        if (src == dst) continue;
        if (smp::rank() == src) {
          const auto [r, t] = name_as(dst, true);
          smp::send(object_of(src * 100 + dst), r, t);
        } else if (smp::rank() == dst) {
          const auto [r, t] = name_as(src, false);
          EXPECT_EQ(ivalue_difference(smp::recv_from(r, t), object_of(src * 100 + dst)), "")
              << "partitions " << p << ", " << src << " -> " << dst;
        }
      }
  }
}

TEST(SmpObjects, AllgatherInGroupRankOrder) {
  for (int p : partition_counts(mpi::world_size())) {
    init_partitions(p);
    for (smp::CommGroup g : kGroups) {
      const auto m = members(g);
      const auto got = smp::allgather(object_of(smp::rank()), g);
      ASSERT_EQ(got.size(), m.size());
      for (size_t i = 0; i < m.size(); ++i)
        EXPECT_EQ(ivalue_difference(got[i], object_of(m[i])), "") << smp::name(g) << " member " << i;
      const auto ints = smp::allgather<int64_t>(10 * smp::rank() + 1, g);
      const auto texts = smp::allgather(std::string(static_cast<size_t>(smp::rank()), 'x') + "!", g);
      ASSERT_EQ(ints.size(), m.size());
      ASSERT_EQ(texts.size(), m.size());
      for (size_t i = 0; i < m.size(); ++i) {
        EXPECT_EQ(ints[i], 10 * m[i] + 1);
        EXPECT_EQ(texts[i], std::string(static_cast<size_t>(m[i]), 'x') + "!");
      }
    }
  }
}

// The seed's synchronous semantics: a send returns only after the receiver
// called recv_from (a plain MPI_Send of a small message would return at once).
TEST(SmpObjects, SendAndBroadcastWaitForTheReceiver) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  init_partitions(1);
  const double delay = 0.3;
  smp::barrier();
  if (smp::rank() == 0) {
    const auto t = std::chrono::steady_clock::now();
    smp::send(int64_t{42}, 1, smp::WORLD_RANK);
    EXPECT_GE(seconds_since(t), delay * 0.8) << "send returned before the receiver called recv_from";
  } else if (smp::rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    EXPECT_EQ(smp::recv_from<int64_t>(0, smp::WORLD_RANK), 42);
  }
  smp::barrier();
  if (smp::rank() == 0) {
    const auto t = std::chrono::steady_clock::now();
    smp::broadcast(std::string("late"), smp::WORLD);
    EXPECT_GE(seconds_since(t), delay * 0.8) << "broadcast returned before the last receiver called recv_from";
  } else {
    if (smp::rank() == n - 1) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    EXPECT_EQ(smp::recv_from<std::string>(0, smp::WORLD_RANK), "late");
  }
}

// A barrier holds every member until the last one arrives.
TEST(SmpObjects, BarrierWaitsForTheGroup) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const double delay = 0.3;
  for (int p : partition_counts(n)) {
    init_partitions(p);
    for (smp::CommGroup g : kGroups) {
      const auto m = members(g);
      if (m.size() < 2) continue;
      smp::barrier();
      const auto t = std::chrono::steady_clock::now();
      if (m[0] == smp::rank()) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      if (g == smp::MP_GROUP) smp::mp_barrier();
      else if (g == smp::DP_GROUP) smp::dp_barrier();
      else smp::barrier(g);
      if (m[0] != smp::rank()) {
        EXPECT_GE(seconds_since(t), delay * 0.8) << smp::name(g) << " barrier did not wait for its first member";
      }
    }
  }
  smp::barrier();
}

// Seed 004: with smp.MP_GROUP "each process only waits until the other process
// of its own mp_group reaches that point. It does not wait for processes
// outside that mp_group." The group holding rank 0 passes its barrier while
// every other rank is held in a receive that only rank 0, after that barrier,
// releases: a barrier that waited for the world (or for the wrong group)
// would meet its deadline on the group and the receive's on the others.
TEST(SmpObjects, BarrierDoesNotWaitForRanksOutsideTheGroup) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const double old = mpi::deadline();
  mpi::set_deadline(mpi::scaled_for_ranks(2.0));
  int checked = 0;
  for (int p : partition_counts(n)) {
    init_partitions(p);
    for (smp::CommGroup g : {smp::MP_GROUP, smp::DP_GROUP}) {
      const auto first = smp::layout().members(0, g);  // the group of world rank 0
      if (static_cast<int>(first.size()) == n) continue;  // the group is the world
      ++checked;
      smp::barrier();
      const bool inside = std::find(first.begin(), first.end(), smp::rank()) != first.end();
      auto group_barrier = [g] { g == smp::MP_GROUP ? smp::mp_barrier() : smp::dp_barrier(); };
      if (inside) {
        EXPECT_NO_THROW(group_barrier()) << smp::name(g) << " barrier with " << p << " partitions";
        if (smp::rank() == 0)
          for (int r = 0; r < n; ++r)
            if (std::find(first.begin(), first.end(), r) == first.end()) smp::send(int64_t{r}, r, smp::WORLD_RANK);
      } else {
        int64_t token = -1;
        EXPECT_NO_THROW(token = smp::recv_from<int64_t>(0, smp::WORLD_RANK))
            << "world rank " << smp::rank() << " was not released: the " << smp::name(g) << " barrier of rank 0's "
            << "group waited for ranks outside it (" << p << " partitions)";
        EXPECT_EQ(token, smp::rank());
        // Then this rank's own group meets at its barrier, without rank 0's group.
        EXPECT_NO_THROW(group_barrier()) << smp::name(g) << " barrier with " << p << " partitions";
      }
    }
  }
  mpi::set_deadline(old);
  EXPECT_GT(checked, 0) << "no layout at " << n << " ranks has a group smaller than the world";
  smp::barrier();
}

// --- typed overloads and wrong types -------------------------------------------------

struct Pod {
  int32_t a;
  double b;
  char c[3];
};

TEST(SmpObjects, TypedOverloads) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  init_partitions(1);
  if (smp::rank() == 0) {
    smp::send(Pod{7, 2.5, {'a', 'b', 'c'}}, 1, smp::WORLD_RANK);
    smp::send(std::string("hello\0world", 11), 1, smp::WORLD_RANK);
    smp::send(3.75, 1, smp::WORLD_RANK);
  } else if (smp::rank() == 1) {
    const Pod p = smp::recv_from<Pod>(0, smp::WORLD_RANK);
    EXPECT_EQ(p.a, 7);
    EXPECT_EQ(p.b, 2.5);
    EXPECT_EQ(std::string(p.c, 3), "abc");
    EXPECT_EQ(smp::recv_from<std::string>(0, smp::WORLD_RANK), std::string("hello\0world", 11));
    EXPECT_EQ(smp::recv_from<double>(0, smp::WORLD_RANK), 3.75);
  }
  if (smp::rank() == n - 1) smp::broadcast(std::string("bye"), smp::WORLD);
  else EXPECT_EQ(smp::recv_from<std::string>(n - 1, smp::WORLD_RANK), "bye");
}

TEST(SmpObjects, WrongTypeRequestedIsAClearError) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  init_partitions(1);
  if (smp::rank() == 0) {
    smp::send(int32_t{5}, 1, smp::WORLD_RANK);
    smp::send(std::string("text"), 1, smp::WORLD_RANK);
    smp::send(object_of(0), 1, smp::WORLD_RANK);
    smp::send(object_of(0), 1, smp::WORLD_RANK);
  } else if (smp::rank() == 1) {
    EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from<double>(0, smp::WORLD_RANK); }),
                    "smp::recv_from(src 0, WORLD_RANK) on world rank 1 from world rank 0: wrong type requested: "
                    "the message holds int (4 bytes), double (8 bytes) was asked for");
    EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from(0, smp::WORLD_RANK); }),
                    "wrong type requested: a message holding a std::string, an IValue was asked for");
    EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from<std::string>(0, smp::WORLD_RANK); }),
                    "wrong type requested: a message holding an IValue, a std::string was asked for");
    EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from<Pod>(0, smp::WORLD_RANK); }),
                    "a message holding an IValue, partita::spec::(anonymous namespace)::Pod (24 bytes) was asked for");
  }
  // allgather of mixed types: every member raises, naming the member.
  const std::string mixed = raised<smp::MessageError>([] {
    if (smp::rank() == 0) smp::allgather(std::string("zero"), smp::WORLD);
    else smp::allgather<int64_t>(smp::rank(), smp::WORLD);
  });
  EXPECT_CONTAINS(mixed, "smp::allgather(WORLD) on world rank " + std::to_string(smp::rank()) + ", member ");
  EXPECT_CONTAINS(mixed, "wrong type requested");
}

// An object LibTorch's pickler or partita cannot send: the sender and every
// receiver raise, nobody waits.
TEST(SmpObjects, UnencodableObjectRaisesEverywhere) {
  init_partitions(1);
  const c10::IValue sparse(at::eye(3, at::kDouble).to_sparse());
  const int n = mpi::world_size();
  if (n > 1) {
    if (smp::rank() == 0) {
      EXPECT_CONTAINS(raised<smp::MessageError>([&] { smp::broadcast(sparse, smp::WORLD); }),
                      "smp::broadcast(WORLD): smp: cannot send the tensor at the object: only dense CPU tensors travel");
    } else {
      EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from(0, smp::WORLD_RANK); }),
                      "from world rank 0: the sender could not encode its object: smp: cannot send the tensor");
    }
  }
  const std::string all = raised<smp::MessageError>([&] {
    smp::allgather(smp::rank() == n - 1 ? sparse : object_of(smp::rank()), smp::WORLD);
  });
  EXPECT_CONTAINS(all, "member " + std::to_string(n - 1) + ": the sender could not encode its object");
}

// An object whose message would pass MPI's count (INT_MAX bytes) travels as
// an error frame, as an unencodable one above: the rule, on sizes (an
// object of 2 GiB would take 4 GiB per rank to encode in a test).
TEST(SmpObjects, MessagesAboveMpisCountLimitAreRefused) {
  const auto limit = static_cast<std::size_t>(INT_MAX);
  EXPECT_EQ(smp::message::too_large_for_one_message(limit, limit), "");
  EXPECT_EQ(smp::message::too_large_for_one_message(0, limit), "");
  EXPECT_CONTAINS(smp::message::too_large_for_one_message(limit + 1, limit),
                  "the object's message is 2147483648 bytes, above MPI's count limit (2147483647 bytes");
  EXPECT_CONTAINS(smp::message::too_large_for_one_message(65, 64), "65 bytes");
  EXPECT_EQ(smp::message::too_large_for_one_message(limit), "");  // the default limit is MPI's
  EXPECT_NE(smp::message::too_large_for_one_message(limit + 1), "");
  // What a sender posts (objects and the pipeline's returned values): its
  // frame when it fits; otherwise an error frame whose decoding raises the
  // reason, with the context, on every receiver, and that reason to raise.
  const std::string frame = smp::message::encode_ivalue(c10::IValue(int64_t{7}));
  const auto fits = smp::message::one_message(frame, "ctx: ", frame.size());
  EXPECT_EQ(fits.frame, frame);
  EXPECT_EQ(fits.error, "");
  const auto refused = smp::message::one_message(frame, "ctx: ", frame.size() - 1);
  EXPECT_CONTAINS(refused.error, "ctx: the object's message is " + std::to_string(frame.size()) + " bytes");
  EXPECT_CONTAINS(raised<smp::MessageError>([&] {
                    smp::message::decode_ivalue(refused.frame.data(), refused.frame.size());
                  }),
                  "the sender could not encode its object: " + refused.error);
}

// --- bytes that are not a message --------------------------------------------------------

// Raw bytes put on smp's wire by hand: the receiver raises MessageError.
TEST(SmpObjects, CorruptedBytesOnTheWire) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  init_partitions(1);
  const std::string good = smp::message::encode_ivalue(object_of(3));
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;
  // A valid frame whose pickle is garbage.
  std::string garbage_payload(8, '\0');
  garbage_payload[0] = 6;
  garbage_payload += "\x80\x02garb";
  garbage_payload += std::string(8, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, good.size() - 5), "truncated: the header announces"},
      {flipped, "corrupted: checksum mismatch"},
      {"0123456789", "shorter than the 32-byte header"},
      {std::string(40, 'x'), "bad magic"},
      {smp::message::frame(smp::message::Kind::IValue, 0, garbage_payload), "the pickle is not a valid object"},
  };
  for (const auto& [bytes, expect] : cases) {
    if (smp::rank() == 0) {
      MPI_Request r;
      MPI_Issend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 1, smp::kObjectTag,
                 smp::communicator(smp::WORLD), &r);
      mpi::wait(r, "test: raw send");
    } else if (smp::rank() == 1) {
      EXPECT_CONTAINS(raised<smp::MessageError>([] { smp::recv_from(0, smp::WORLD_RANK); }), expect);
    }
  }
  // The good frame still decodes after all that.
  if (smp::rank() == 0) smp::send(object_of(3), 1, smp::WORLD_RANK);
  else if (smp::rank() == 1) {
    EXPECT_EQ(ivalue_difference(smp::recv_from(0, smp::WORLD_RANK), object_of(3)), "");
  }
}

// The decoder on every truncation and every single-bit flip of a frame
// (locally, on every rank): always MessageError, never a crash.
TEST(SmpObjects, DecoderRejectsEveryTruncationAndFlip) {
  const std::string good = smp::message::encode_ivalue(object_of(2));
  EXPECT_EQ(ivalue_difference(smp::message::decode_ivalue(good.data(), good.size()), object_of(2)), "");
  for (size_t k = 0; k < good.size(); ++k)
    EXPECT_THROW(smp::message::decode_ivalue(good.data(), k), smp::MessageError) << "truncated to " << k;
  for (size_t k = 0; k < good.size(); ++k) {
    std::string bad = good;
    bad[k] ^= static_cast<char>(1 << (k % 8));
    EXPECT_THROW(smp::message::decode_ivalue(bad.data(), bad.size()), smp::MessageError) << "bit flipped at " << k;
  }
  // Past the checksum: every truncation of the payload.
  const auto c = smp::message::check(good.data(), good.size());
  for (size_t k = 0; k < c.length; ++k)
    EXPECT_THROW(smp::message::decode_ivalue_payload(c.payload, k), smp::MessageError) << "payload cut at " << k;
}

// Tuples nested a million deep in a valid frame of about a megabyte: the
// unpickler would build them, and destroying the object would overflow
// the receiver's stack. Refused as MessageError; 900 levels decode.
TEST(SmpObjects, DecoderRefusesObjectsNestedTooDeep) {
  const auto frame_of = [](size_t levels) {
    const std::string pickle = std::string("\x80\x02)") + std::string(levels, '\x85') + ".";
    std::string payload(8, '\0');
    for (int b = 0; b < 8; ++b) payload[b] = static_cast<char>((pickle.size() >> (8 * b)) & 0xff);
    payload += pickle + std::string(8, '\0');  // no tensors
    return smp::message::frame(smp::message::Kind::IValue, 0, payload);
  };
  const std::string deep = frame_of(size_t{1} << 20);
  EXPECT_CONTAINS(raised<smp::MessageError>([&] { smp::message::decode_ivalue(deep.data(), deep.size()); }),
                  "objects nested deeper than 1000 levels");
  const std::string fine = frame_of(900);
  c10::IValue v = smp::message::decode_ivalue(fine.data(), fine.size());
  int depth = 0;
  while (v.isTuple() && !v.toTupleRef().elements().empty()) {
    c10::IValue inner = v.toTupleRef().elements()[0];
    v = inner;
    ++depth;
  }
  EXPECT_EQ(depth, 900);  // 900 tuples around the empty one
}

// --- misuse ---------------------------------------------------------------------------

TEST(SmpObjects, RecvFromWithNoSenderFailsWithinTheDeadline) {
  const int n = mpi::world_size();
  init_partitions(1);
  if (n < 2) {
    EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::recv_from(0, smp::WORLD_RANK); }),
                    "the source is this rank itself");
    return;
  }
  const double old = mpi::deadline();
  const double limit = mpi::scaled_for_ranks(1.0);
  mpi::set_deadline(limit);
  const long misses = mpi::deadline_misses();
  const int from = (smp::rank() + 1) % n;
  const auto t = std::chrono::steady_clock::now();
  const std::string e = raised<DeadlineError>([&] { smp::recv_from(from, smp::WORLD_RANK); });
  const double took = seconds_since(t);
  mpi::set_deadline(old);
  EXPECT_CONTAINS(e, "smp::recv_from(src " + std::to_string(from) + ", WORLD_RANK) on world rank " +
                         std::to_string(smp::rank()) + ", waiting for a send or broadcast from world rank " +
                         std::to_string(from) + " did not finish within");
  EXPECT_GE(took, limit * 0.9);
  EXPECT_LT(took, limit + 3.0);
  EXPECT_EQ(mpi::deadline_misses(), misses) << "a probe abandons nothing: not a deadline miss";
  smp::barrier();
}

TEST(SmpObjects, RanksOutsideTheGroupAreUsageErrors) {
  const int n = mpi::world_size();
  init_partitions(n);  // one mp group of n ranks, dp groups of one
  const c10::IValue obj(int64_t{1});
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::send(obj, n, smp::MP_RANK); }),
                  "smp: MP_RANK " + std::to_string(n) + " does not exist (the mp group has " + std::to_string(n) +
                      " ranks)");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::recv_from(1, smp::DP_RANK); }),
                  "smp: DP_RANK 1 does not exist (the dp group has 1 ranks)");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::recv_from(-1, smp::WORLD_RANK); }),
                  "smp: WORLD_RANK -1 does not exist");
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::send(obj, smp::rank(), smp::WORLD_RANK); }),
                  "the destination is this rank itself");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::recv_from(0, smp::DP_RANK); }),
                  "the source is this rank itself");
  // A broadcast to a group of one has no receiver and returns at once.
  smp::broadcast(obj, smp::DP_GROUP);
  smp::barrier();
}

}  // namespace
}  // namespace partita::spec
