// Lockstep properties: for random partition pairs, every rank's MPI
// partitions (membership, roots, ranks, indices, neighbours, derived
// partitions and partition data) equal the reference's view for that rank.
#include <gtest/gtest.h>

#include <sstream>

#include "partita/testing/lockstep.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/reference/partition.hpp"
#include "partita/testing/partition_cases.hpp"

namespace partita::testing {
namespace {

namespace ref = partita::reference;

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << "[" << list_string(v) << "]";
  return os.str();
}

// The MPI view of a partition on this rank against the reference's.
void same_view(Verdict& v, const std::string& what, const mpi::Partition& m,
               const ref::Partition& r) {
  const int me = mpi::world_rank();
  if (r.is_null()) {
    v.expect(m.is_null(), what + ": expected n/a, MPI has " + m.describe());
    return;
  }
  v.expect(m.workers() == r.workers(),
           what + ": workers " + str(m.workers()) + " != reference " + str(r.workers()));
  v.expect(m.shape() == r.shape(),
           what + ": shape " + shape_string(m.shape()) + " != " + shape_string(r.shape()));
  v.expect(m.active() == r.active(me), what + ": active differs");
  v.expect(m.rank() == r.rank(me), what + ": rank " + std::to_string(m.rank()) +
                                       " != reference " + std::to_string(r.rank(me)));
  v.expect(m.size() == r.size(), what + ": size differs");
  v.expect(m.cartesian() == r.cartesian(), what + ": Cartesian on one side only");
  v.expect(m.index() == r.index(me),
           what + ": index " + str(m.index()) + " != reference " + str(r.index(me)));
  if (m.active()) {
    int n = 0;
    MPI_Comm_size(m.comm(), &n);
    int cr = -1;
    MPI_Comm_rank(m.comm(), &cr);
    v.expect(n == m.size() && cr == m.rank(), what + ": communicator does not match the team");
  } else {
    v.expect(m.comm() == MPI_COMM_NULL, what + ": inactive rank holds a communicator");
  }
}

// Runs `mpi_op` and `ref_op`; both must throw PartitionError naming the same
// rule (issue 9), or neither. Returns true when both succeeded.
template <typename M, typename R>
bool both_or_neither(Verdict& v, const std::string& what, M&& mpi_op, R&& ref_op) {
  std::string merr, rerr, mrule, rrule;
  try {
    mpi_op();
  } catch (const PartitionError& e) {
    merr = e.what();
    mrule = e.rule();
  }
  try {
    ref_op();
  } catch (const PartitionError& e) {
    rerr = e.what();
    rrule = e.rule();
  }
  v.expect(merr.empty() == rerr.empty() && mrule == rrule && (merr.empty() || !mrule.empty()),
           what + ": MPI " + (merr.empty() ? "succeeded" : "threw [" + mrule + "] '" + merr + "'") +
               ", reference " + (rerr.empty() ? "succeeded" : "threw [" + rrule + "] '" + rerr + "'"));
  return merr.empty() && rerr.empty();
}

struct Built {
  mpi::CartesianPartition px, py;
  ref::Partition rx, ry;
};

Built build(const PartitionCase& c) {
  const auto world = mpi::Partition::world();
  const auto rworld = ref::Partition::world(c.world);
  return {world.create_partition_inclusive(c.px_ranks).create_cartesian_topology_partition(c.px_shape),
          world.create_partition_inclusive(c.py_ranks).create_cartesian_topology_partition(c.py_shape),
          rworld.create_partition_inclusive(c.px_ranks).create_cartesian_topology_partition(c.px_shape),
          rworld.create_partition_inclusive(c.py_ranks).create_cartesian_topology_partition(c.py_shape)};
}

TEST(PartitionProperty, BroadcastAndReductionTeamsMatchReference) {
  const bool ok = check_lockstep<PartitionCase>(
      "broadcast and reduction teams", gen_partition_case(mpi::world_size()),
      [](const PartitionCase& c, Verdict& v) {
        const int me = mpi::world_rank();
        const Built b = build(c);
        same_view(v, "P_x", b.px, b.rx);
        same_view(v, "P_y", b.py, b.ry);
        std::pair<mpi::Partition, mpi::Partition> m;
        ref::SendRecv r;
        if (both_or_neither(
                v, "broadcast",
                [&] { m = b.px.create_broadcast_partition_to(b.py, c.transpose_src, c.transpose_dest); },
                [&] { r = b.rx.create_broadcast_partition_to(b.ry, c.transpose_src, c.transpose_dest); })) {
          same_view(v, "broadcast P_send", m.first, r.send(me));
          same_view(v, "broadcast P_recv", m.second, r.recv(me));
        }
        // The mirror: P_y sum-reduces to P_x (transposes follow their partitions).
        if (both_or_neither(
                v, "reduction",
                [&] { m = b.py.create_reduction_partition_to(b.px, c.transpose_dest, c.transpose_src); },
                [&] { r = b.ry.create_reduction_partition_to(b.rx, c.transpose_dest, c.transpose_src); })) {
          same_view(v, "reduction P_send", m.first, r.send(me));
          same_view(v, "reduction P_recv", m.second, r.recv(me));
        }
      });
  EXPECT_TRUE(ok);
}

TEST(PartitionProperty, CartesianStructureMatchesReference) {
  const bool ok = check_lockstep<PartitionCase>(
      "cartesian structure", gen_partition_case(mpi::world_size()),
      [](const PartitionCase& c, Verdict& v) {
        const int me = mpi::world_rank();
        const Built b = build(c);
        for (int r = 0; r < b.px.size(); ++r) {
          v.expect(b.px.cartesian_index(r) == b.rx.cartesian_index(r),
                   "cartesian_index(" + std::to_string(r) + ")");
          v.expect(b.px.neighbor_ranks(r) == b.rx.neighbor_ranks(r),
                   "neighbor_ranks(" + std::to_string(r) + ")");
        }
        same_view(v, "union", b.px.create_partition_union(b.py),
                  b.rx.create_partition_union(b.ry));
        same_view(v, "allreduction", b.px.create_allreduction_partition(c.axes),
                  b.rx.active(me) ? b.rx.create_allreduction_partition(c.axes).of(me)
                                  : ref::Partition());
        same_view(v, "subtopology", b.py.create_cartesian_subtopology_partition(c.remain),
                  b.ry.active(me) ? b.ry.create_cartesian_subtopology_partition(c.remain).of(me)
                                  : ref::Partition());
        // The same team without topology answers as a 1-D Cartesian
        // partition (seed 000): shape {size}, index {rank}, neighbours,
        // and the two sub-topologies a 1-D grid has.
        const auto flat = mpi::Partition::world().create_partition_inclusive(c.px_ranks);
        const auto rflat = ref::Partition::world(c.world).create_partition_inclusive(c.px_ranks);
        same_view(v, "unstructured P_x", flat, rflat);
        for (int r = 0; r < flat.size(); ++r) {
          v.expect(flat.cartesian_index(r) == rflat.cartesian_index(r),
                   "unstructured cartesian_index(" + std::to_string(r) + ")");
          v.expect(flat.neighbor_ranks(r) == rflat.neighbor_ranks(r),
                   "unstructured neighbor_ranks(" + std::to_string(r) + ")");
        }
        for (bool keep : {true, false})
          same_view(v, keep ? "unstructured subtopology {true}" : "unstructured subtopology {false}",
                    flat.create_cartesian_subtopology_partition({keep}),
                    rflat.active(me) ? rflat.create_cartesian_subtopology_partition({keep}).of(me)
                                     : ref::Partition());
        const auto& again = flat;
        v.expect((again == b.px) == (b.rx.create_cartesian_topology_partition({b.rx.size()}) ==
                                     ref::Partition::world(c.world).create_partition_inclusive(c.px_ranks)) &&
                     (b.px == b.py) == (b.rx == b.ry),
                 "operator== disagrees with the reference");
      });
  EXPECT_TRUE(ok);
}

TEST(PartitionProperty, PartitionDataMatchesReference) {
  const bool ok = check_lockstep<PartitionCase>(
      "partition data", gen_partition_case(mpi::world_size()),
      [](const PartitionCase& c, Verdict& v) {
        const int me = mpi::world_rank();
        const Built b = build(c);
        // Rank-dependent payloads of rank-dependent length (some empty).
        auto payload = [](int w) { return std::string(static_cast<size_t>(w % 4), char('a' + w)); };
        std::map<int, ref::Bytes> data;
        for (int w = 0; w < c.world; ++w) data[w] = payload(w);
        const auto got = b.px.broadcast_data(payload(me), c.data_root);
        if (b.rx.active(me))
          v.expect(got == b.rx.broadcast_data(data, c.data_root).at(me), "broadcast_data");
        // Second mode: P_x's root broadcasts to the union of P_x and P_y.
        const auto u = b.px.create_partition_union(b.py);
        const auto ru = b.rx.create_partition_union(b.ry);
        const auto got2 = u.broadcast_data(payload(me), c.data_root, b.px);
        if (ru.active(me))
          v.expect(got2 == ru.broadcast_data(data, c.data_root, b.rx).at(me),
                   "broadcast_data from P_data");
        else
          v.expect(got2.empty(), "broadcast_data on a rank outside the union");
        const auto all = b.py.allgather_data(payload(me));
        if (b.ry.active(me)) v.expect(all == b.ry.allgather_data(data).at(me), "allgather_data");
        else v.expect(all.empty(), "allgather_data on an inactive rank");
      });
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace partita::testing
