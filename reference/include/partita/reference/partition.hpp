// The executable specification of partitions: a World of N virtual workers
// in one process. A reference Partition is a global object, a list of world
// ranks (the team, in partition-rank order) and a shape; the seed's per-worker
// members (rank, active, index) take the worker's world rank as an argument.
//
// Written for obviousness: every derived partition is found by looking at
// every worker and asking whether it belongs, never by index arithmetic that
// the MPI implementation could share a bug with.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "partita/shape.hpp"

namespace partita::reference {

using Bytes = std::string;

class Partition;

// A set of disjoint sub-partitions labelled P_0, P_1, ... in the order the
// seed's tables use.
struct Family {
  std::vector<Partition> parts;
  int label_of(int worker) const;  // -1: the worker is in none of them
  // The worker's sub-partition (a reference into `parts`, or to a static
  // null partition when it is in none), so that `of(w).workers()` is safe.
  const Partition& of(int worker) const;
};

// The partitions of a broadcast or sum-reduce. parts[l].workers()[0] is the
// root of P_l (the source of a broadcast, the destination of a reduction).
struct SendRecv {
  std::vector<Partition> parts;
  std::vector<int> send_label;  // per world rank, -1 for n/a
  std::vector<int> recv_label;
  Partition send(int worker) const;
  Partition recv(int worker) const;
};

class Partition {
 public:
  // The null partition: no team at all (P_send of a worker outside P_x).
  Partition() = default;
  Partition(int world_size, Ranks workers, Shape shape, bool cartesian);

  // The whole world as an unstructured partition.
  static Partition world(int world_size);

  bool is_null() const { return workers_.empty(); }
  int world_size() const { return world_size_; }
  int size() const { return static_cast<int>(workers_.size()); }
  const Shape& shape() const { return shape_; }
  bool cartesian() const { return cartesian_; }
  const Ranks& workers() const { return workers_; }

  // The seed's members, seen by worker `worker` (a world rank).
  bool active(int worker) const;
  int rank(int worker) const;      // -1 when inactive
  Index index(int worker) const;   // all -1 when inactive

  // Cartesian members (unstructured partitions are 1-D Cartesian).
  Index cartesian_index(int rank) const;
  // Per dimension, the ranks of the left and right neighbours; -1 where the
  // worker sits on the boundary (no periodicity).
  std::vector<std::pair<int, int>> neighbor_ranks(int rank) const;

  // `ranks` are ranks of this partition; the new team keeps their order.
  Partition create_partition_inclusive(const Ranks& ranks) const;
  // This team first, then the workers of `other` not already in it.
  Partition create_partition_union(const Partition& other) const;
  Partition create_cartesian_topology_partition(const Shape& shape) const;
  // MPI_Cart_sub: one sub-grid per combination of the dropped dimensions.
  Family create_cartesian_subtopology_partition(const std::vector<bool>& remain) const;
  // The all-sum-reduce teams: workers that differ only along `axes`.
  Family create_allreduction_partition(const std::vector<int>& axes) const;
  SendRecv create_broadcast_partition_to(const Partition& P_y,
                                         bool transpose_src = false,
                                         bool transpose_dest = false) const;
  SendRecv create_reduction_partition_to(const Partition& P_y,
                                         bool transpose_src = false,
                                         bool transpose_dest = false) const;

  // Same team in the same order, same shape and structure.
  bool operator==(const Partition& other) const;
  bool operator!=(const Partition& other) const { return !(*this == other); }

  // Data. `data` maps a world rank to what that worker contributes; the
  // result maps every active worker to what it ends with.
  std::map<int, Bytes> broadcast_data(const std::map<int, Bytes>& data,
                                      int root = 0) const;
  // Second mode: the root is rank `root` of P_data, which must be a member
  // of this partition.
  std::map<int, Bytes> broadcast_data(const std::map<int, Bytes>& data, int root,
                                      const Partition& P_data) const;
  std::map<int, std::vector<Bytes>> allgather_data(
      const std::map<int, Bytes>& data) const;

  std::string describe() const;  // "2x3x2 on [0,1,...]"

 private:
  int world_size_ = 0;
  Ranks workers_;
  Shape shape_;
  bool cartesian_ = false;
};

}  // namespace partita::reference
