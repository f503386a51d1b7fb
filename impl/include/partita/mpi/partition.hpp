// Partitions over MPI: the seed's Partition and CartesianPartition, seen from
// the calling rank.
//
// Every rank that holds a Partition object knows the partition's team (world
// ranks, in partition-rank order) and shape, whether or not it is a member;
// only members are `active` and own a communicator. An inactive rank never
// communicates through the partition. The null partition (the seed's "n/a",
// e.g. P_send of a worker outside P_x) has no team at all.
//
// Who must call what (collective semantics, docs/partitions.md):
//  - create_partition_inclusive, create_cartesian_subtopology_partition,
//    create_allreduction_partition, broadcast_data, allgather_data:
//    every active member of the calling partition (inactive callers return
//    at once without communicating);
//  - create_partition_union, create_broadcast_partition_to,
//    create_reduction_partition_to: every rank of the world, as every rank
//    builds every DistDL layer;
//  - create_cartesian_topology_partition and the queries: local.
// Arguments are checked to agree across the ranks of the collective; a
// disagreement or a rule violation raises PartitionError on all of them.
#pragma once

#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "partita/shape.hpp"

namespace at {
class Tensor;
}

namespace partita::mpi {

using Bytes = std::string;

class CartesianPartition;

class Partition {
 public:
  Partition();  // the null partition
  // The whole world (partita's duplicate of MPI_COMM_WORLD), unstructured.
  static Partition world();

  bool is_null() const;
  bool active() const;
  int size() const;
  int rank() const;  // -1 when inactive
  const Shape& shape() const;
  Index index() const;  // all -1 when inactive
  bool cartesian() const;
  const Ranks& workers() const;  // world ranks, in partition-rank order
  MPI_Comm comm() const;         // MPI_COMM_NULL when inactive

  // The Cartesian queries. A partition without topology answers them as a
  // 1-D Cartesian one of shape {size} (seed 000): the index of rank r is
  // {r}, its neighbours r-1 and r+1, and its only sub-topologies the whole
  // team (remain {true}) or the worker alone (remain {false}).
  Index cartesian_index(int rank) const;
  // Per dimension {left, right} neighbour ranks, -1 on a boundary.
  std::vector<std::pair<int, int>> neighbor_ranks(int rank) const;
  // MPI_Cart_sub: this rank's sub-grid along the kept dimensions.
  CartesianPartition create_cartesian_subtopology_partition(
      const std::vector<bool>& remain) const;

  Partition create_partition_inclusive(const Ranks& ranks) const;
  Partition create_partition_union(const Partition& other) const;
  CartesianPartition create_cartesian_topology_partition(const Shape& shape) const;
  Partition create_allreduction_partition(const std::vector<int>& axes) const;
  // {P_send, P_recv}; roots are rank 0 of their partitions.
  std::pair<Partition, Partition> create_broadcast_partition_to(
      const Partition& P_y, bool transpose_src = false, bool transpose_dest = false) const;
  std::pair<Partition, Partition> create_reduction_partition_to(
      const Partition& P_y, bool transpose_src = false, bool transpose_dest = false) const;

  bool operator==(const Partition& other) const;
  bool operator!=(const Partition& other) const { return !(*this == other); }

  // Inactive ranks get an empty result without communicating.
  Bytes broadcast_data(const Bytes& data, int root = 0) const;
  // Second mode: the root is rank `root` of P_data (a sub-partition of this
  // one); found by a reduction, so ranks outside P_data may pass any view.
  Bytes broadcast_data(const Bytes& data, int root, const Partition& P_data) const;
  std::vector<Bytes> allgather_data(const Bytes& data) const;
  // The same for tensors (seed 000: the data carry their own dtype and
  // shape): the receivers learn the root's dtype and shape with
  // its values, whatever they passed (any tensor, or an undefined one).
  // Inactive ranks get an undefined tensor (allgather: an empty list)
  // without communicating. Defined in tensor_data.cpp.
  at::Tensor broadcast_data(const at::Tensor& data, int root = 0) const;
  at::Tensor broadcast_data(const at::Tensor& data, int root, const Partition& P_data) const;
  std::vector<at::Tensor> allgather_data(const at::Tensor& data) const;

  std::string describe() const;

  // Implementation detail (team, shape, communicator): partitions are made
  // by world() and the create_* members, not from a State by users.
  struct State;
  explicit Partition(std::shared_ptr<const State> s);

 protected:
  std::shared_ptr<const State> s_;
};

class CartesianPartition : public Partition {
 public:
  CartesianPartition() = default;

 private:
  friend class Partition;
  explicit CartesianPartition(std::shared_ptr<const State> s) : Partition(std::move(s)) {}
};

// One team of a broadcast or sum-reduce, in world ranks: the root (the P_x
// worker with the data for a broadcast, the P_y destination for a
// sum-reduce) and the workers of the other partition paired with it, in
// their partition's rank order (the root may be one of them).
struct Team {
  int root = -1;
  Ranks paired;
  Ranks workers() const;  // root first, then `paired` without the root
};

// All teams, labelled P_0, P_1, ... in the order of the roots' partition.
// Pure functions of the partitions' metadata (no communication); throw
// PartitionError when the pair breaks the rules.
std::vector<Team> broadcast_teams(const Partition& P_x, const Partition& P_y,
                                  bool transpose_src, bool transpose_dest);
std::vector<Team> reduction_teams(const Partition& P_x, const Partition& P_y,
                                  bool transpose_src, bool transpose_dest);

// Typed helpers for broadcast_data / allgather_data payloads.
template <typename T>
Bytes pack(const std::vector<T>& values) {
  return Bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}
template <typename T>
std::vector<T> unpack(const Bytes& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace partita::mpi
