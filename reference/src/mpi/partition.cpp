#include "partita/reference/partition.hpp"

#include <algorithm>
#include <set>

#include "partita/errors.hpp"

namespace partita::reference {

int Family::label_of(int worker) const {
  for (size_t l = 0; l < parts.size(); ++l)
    if (parts[l].active(worker)) return static_cast<int>(l);
  return -1;
}

const Partition& Family::of(int worker) const {
  static const Partition none;
  const int l = label_of(worker);
  return l < 0 ? none : parts[l];
}

Partition SendRecv::send(int worker) const {
  const int l = send_label.at(worker);
  return l < 0 ? Partition() : parts[l];
}

Partition SendRecv::recv(int worker) const {
  const int l = recv_label.at(worker);
  return l < 0 ? Partition() : parts[l];
}

Partition::Partition(int world_size, Ranks workers, Shape shape, bool cartesian)
    : world_size_(world_size),
      workers_(std::move(workers)),
      shape_(std::move(shape)),
      cartesian_(cartesian) {
  std::set<int> seen;
  for (int w : workers_) {
    if (w < 0 || w >= world_size_)
      throw PartitionError("partition: worker " + std::to_string(w) +
                           " is outside a world of " + std::to_string(world_size_), rule_code::kWorkerRange);
    if (!seen.insert(w).second)
      throw PartitionError("partition: worker " + std::to_string(w) +
                           " listed twice in [" + workers_string(workers_) + "]", rule_code::kWorkerRepeated);
  }
  if (volume(shape_) != static_cast<int64_t>(workers_.size()))
    throw PartitionError("partition: shape " + shape_string(shape_) + " does not fit " +
                         std::to_string(workers_.size()) + " workers", rule_code::kShapeVolume);
}

Partition Partition::world(int world_size) {
  Ranks all(world_size);
  for (int i = 0; i < world_size; ++i) all[i] = i;
  return Partition(world_size, all, {world_size}, false);
}

bool Partition::active(int worker) const { return rank(worker) >= 0; }

int Partition::rank(int worker) const {
  for (size_t i = 0; i < workers_.size(); ++i)
    if (workers_[i] == worker) return static_cast<int>(i);
  return -1;
}

Index Partition::index(int worker) const {
  const int r = rank(worker);
  if (r < 0) return Index(shape_.size(), -1);
  return cartesian_index(r);
}

Index Partition::cartesian_index(int rank) const {
  if (rank < 0 || rank >= size())
    throw PartitionError("cartesian_index: rank " + std::to_string(rank) +
                         " outside " + describe(), rule_code::kWorkerRange);
  // Count through the grid in row-major order until we reach `rank`.
  Index idx(shape_.size(), 0);
  for (int r = 0; r < rank; ++r) {
    for (size_t d = shape_.size(); d-- > 0;) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
  return idx;
}

std::vector<std::pair<int, int>> Partition::neighbor_ranks(int rank) const {
  const Index me = cartesian_index(rank);
  std::vector<std::pair<int, int>> out(shape_.size(), {-1, -1});
  // Look at every worker: a neighbour differs by exactly one step in one
  // dimension and agrees everywhere else.
  for (int r = 0; r < size(); ++r) {
    const Index other = cartesian_index(r);
    for (size_t d = 0; d < shape_.size(); ++d) {
      bool same_elsewhere = true;
      for (size_t e = 0; e < shape_.size(); ++e)
        if (e != d && other[e] != me[e]) same_elsewhere = false;
      if (!same_elsewhere) continue;
      if (other[d] == me[d] - 1) out[d].first = r;
      if (other[d] == me[d] + 1) out[d].second = r;
    }
  }
  return out;
}

Partition Partition::create_partition_inclusive(const Ranks& ranks) const {
  Ranks team;
  for (int r : ranks) {
    if (r < 0 || r >= size())
      throw PartitionError("create_partition_inclusive: rank " + std::to_string(r) +
                           " is not in " + describe(), rule_code::kWorkerRange);
    team.push_back(workers_[r]);
  }
  if (team.empty())
    throw PartitionError("create_partition_inclusive: empty rank list", rule_code::kEmptyTeam);
  return Partition(world_size_, team, {static_cast<int64_t>(team.size())}, false);
}

Partition Partition::create_partition_union(const Partition& other) const {
  Ranks team = workers_;
  for (int w : other.workers_)
    if (std::find(team.begin(), team.end(), w) == team.end()) team.push_back(w);
  if (team.empty()) return Partition();
  return Partition(std::max(world_size_, other.world_size_), team,
                   {static_cast<int64_t>(team.size())}, false);
}

Partition Partition::create_cartesian_topology_partition(const Shape& shape) const {
  // A grid of workers: no extent below 1, and as many cells as workers
  // (counted in 128 bits, where no product of these extents overflows).
  bool fits = !shape.empty();
  __int128 cells = 1;
  for (int64_t s : shape) {
    if (s < 1) fits = false;
    else if (cells <= size()) cells *= s;
  }
  if (!fits || cells != size())
    throw PartitionError("create_cartesian_topology_partition: shape " +
                         shape_string(shape) + " does not fit " + describe(), rule_code::kShapeVolume);
  return Partition(world_size_, workers_, shape, true);
}

Family Partition::create_cartesian_subtopology_partition(
    const std::vector<bool>& remain) const {
  if (remain.size() != shape_.size())
    throw PartitionError("create_cartesian_subtopology_partition: " +
                         std::to_string(remain.size()) + " flags for " + describe(), rule_code::kAxisRange);
  Shape sub_shape;
  for (size_t d = 0; d < shape_.size(); ++d)
    if (remain[d]) sub_shape.push_back(shape_[d]);
  if (sub_shape.empty()) sub_shape = {1};
  // Key of a worker: its index along the dropped dimensions. Workers with the
  // same key form one sub-grid; sub-grids are labelled in order of their
  // first worker, members kept in partition-rank order.
  std::vector<Index> keys;
  std::vector<Ranks> teams;
  for (int r = 0; r < size(); ++r) {
    const Index idx = cartesian_index(r);
    Index key;
    for (size_t d = 0; d < shape_.size(); ++d)
      if (!remain[d]) key.push_back(idx[d]);
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      teams.push_back({workers_[r]});
    } else {
      teams[it - keys.begin()].push_back(workers_[r]);
    }
  }
  Family f;
  for (auto& t : teams) f.parts.emplace_back(world_size_, t, sub_shape, true);
  return f;
}

Family Partition::create_allreduction_partition(const std::vector<int>& axes) const {
  std::vector<bool> remain(shape_.size(), false);
  for (int a : axes) {
    if (a < 0 || a >= static_cast<int>(shape_.size()))
      throw PartitionError("create_allreduction_partition: axis " + std::to_string(a) +
                           " outside " + describe(), rule_code::kAxisRange);
    remain[a] = true;
  }
  Family f = create_cartesian_subtopology_partition(remain);
  // The seed: the all-reduction teams have no topology.
  for (auto& p : f.parts)
    p = Partition(world_size_, p.workers(), {p.size()}, false);
  return f;
}

namespace {

// Seed 001's rules, restated here on purpose (the MPI side has its own
// statement in common/): a partition's shape as the other side sees it is
// reversed when transposed, and the partition of fewer dimensions is padded
// on the left with ones.
Shape seen_as(Shape s, bool transposed, size_t dims) {
  if (transposed) std::reverse(s.begin(), s.end());
  while (s.size() < dims) s.insert(s.begin(), 1);
  return s;
}

std::string pair_string(const Shape& px, bool ts, const Shape& py, bool td) {
  return "P_x " + shape_string(px) + (ts ? " (transposed)" : "") + " and P_y " +
         shape_string(py) + (td ? " (transposed)" : "");
}

// `narrow` (P_x of a broadcast, P_y of a reduction) may hold a 1 where
// `wide` does not, nowhere else, and has no more dimensions. Returns the two
// seen shapes, narrow first.
std::pair<Shape, Shape> check_rules(const std::string& what, const Shape& narrow,
                                    bool narrow_t, const Shape& wide, bool wide_t,
                                    const std::string& pair, const char* narrow_name) {
  if (narrow.size() > wide.size())
    throw PartitionError(what + ": " + pair + " break the " + what + " rules: dim(" +
                         narrow_name + ") must not exceed the other's",
                         what == "broadcast" ? rule_code::kBroadcastDims : rule_code::kReductionDims);
  const Shape n = seen_as(narrow, narrow_t, wide.size()), w = seen_as(wide, wide_t, wide.size());
  for (size_t d = 0; d < w.size(); ++d)
    if (n[d] != 1 && n[d] != w[d])
      throw PartitionError(what + ": " + pair + " break the " + what + " rules: effective shapes " +
                           shape_string(n) + " and " + shape_string(w) + " differ in dimension " +
                           std::to_string(d) + " where " + narrow_name + " is not 1",
                           what == "broadcast" ? rule_code::kBroadcastShape : rule_code::kReductionShape);
  return {n, w};
}

// DistDL's pairing (docs/partitions.md), written out literally: list the
// dimensions where the seen shapes agree; a worker's coordinates along them,
// taken in the seen order for a partition that is not transposed and in its
// own (unreversed) order for one that is, numbered in row-major order over
// the extents in that same order. Workers with the same number pair.
int64_t matched_number(const Index& own_index, bool transposed, const Shape& seen,
                       const Shape& other_seen) {
  Index seen_index = own_index;
  if (transposed) std::reverse(seen_index.begin(), seen_index.end());
  while (seen_index.size() < seen.size()) seen_index.insert(seen_index.begin(), 0);
  std::vector<std::pair<int64_t, int64_t>> coords;  // (coordinate, extent)
  for (size_t d = 0; d < seen.size(); ++d)
    if (seen[d] == other_seen[d]) coords.push_back({seen_index[d], seen[d]});
  if (transposed) std::reverse(coords.begin(), coords.end());
  int64_t number = 0;
  for (const auto& [c, n] : coords) number = number * n + c;
  return number;
}

// One team per root worker (in root-partition rank order): the root, then
// every paired worker of `others` in its own rank order, the root skipped.
SendRecv root_teams(const Partition& roots, bool roots_transposed, const Shape& roots_seen,
                    const Partition& others, bool others_transposed, const Shape& others_seen,
                    bool roots_send) {
  const int n = std::max(roots.world_size(), others.world_size());
  SendRecv out;
  out.send_label.assign(n, -1);
  out.recv_label.assign(n, -1);
  for (int r = 0; r < roots.size(); ++r) {
    const int root = roots.workers()[r];
    const int64_t key =
        matched_number(roots.cartesian_index(r), roots_transposed, roots_seen, others_seen);
    Ranks team{root};
    for (int o = 0; o < others.size(); ++o) {
      const int w = others.workers()[o];
      if (matched_number(others.cartesian_index(o), others_transposed, others_seen,
                         roots_seen) != key)
        continue;
      (roots_send ? out.recv_label : out.send_label)[w] = static_cast<int>(out.parts.size());
      if (w != root) team.push_back(w);
    }
    (roots_send ? out.send_label : out.recv_label)[root] =
        static_cast<int>(out.parts.size());
    out.parts.emplace_back(n, team, Shape{static_cast<int64_t>(team.size())}, false);
  }
  return out;
}

}  // namespace

SendRecv Partition::create_broadcast_partition_to(const Partition& P_y,
                                                  bool transpose_src,
                                                  bool transpose_dest) const {
  const auto [x, y] = check_rules("broadcast", shape_, transpose_src, P_y.shape_, transpose_dest,
                                  pair_string(shape_, transpose_src, P_y.shape_, transpose_dest), "P_x");
  return root_teams(*this, transpose_src, x, P_y, transpose_dest, y, true);
}

SendRecv Partition::create_reduction_partition_to(const Partition& P_y,
                                                  bool transpose_src,
                                                  bool transpose_dest) const {
  const auto [y, x] = check_rules("reduction", P_y.shape_, transpose_dest, shape_, transpose_src,
                                  pair_string(shape_, transpose_src, P_y.shape_, transpose_dest), "P_y");
  return root_teams(P_y, transpose_dest, y, *this, transpose_src, x, false);
}

bool Partition::operator==(const Partition& other) const {
  return workers_ == other.workers_ && shape_ == other.shape_ &&
         cartesian_ == other.cartesian_;
}

std::map<int, Bytes> Partition::broadcast_data(const std::map<int, Bytes>& data,
                                               int root) const {
  if (root < 0 || root >= size())
    throw PartitionError("broadcast_data: root " + std::to_string(root) +
                         " outside " + describe(), rule_code::kRootRange);
  const auto it = data.find(workers_[root]);
  if (it == data.end())
    throw PartitionError("broadcast_data: the root worker " +
                         std::to_string(workers_[root]) + " provided no data", rule_code::kRootRange);
  std::map<int, Bytes> out;
  for (int w : workers_) out[w] = it->second;
  return out;
}

std::map<int, Bytes> Partition::broadcast_data(const std::map<int, Bytes>& data,
                                               int root,
                                               const Partition& P_data) const {
  if (root < 0 || root >= P_data.size())
    throw PartitionError("broadcast_data: root " + std::to_string(root) +
                         " outside P_data " + P_data.describe(), rule_code::kRootRange);
  const int source = P_data.workers_[root];
  if (!active(source))
    throw PartitionError("broadcast_data: rank " + std::to_string(root) +
                         " of P_data is not a member of " + describe(), rule_code::kRootRange);
  return broadcast_data(data, rank(source));
}

std::map<int, std::vector<Bytes>> Partition::allgather_data(
    const std::map<int, Bytes>& data) const {
  std::vector<Bytes> all;
  for (int w : workers_) {
    const auto it = data.find(w);
    if (it == data.end())
      throw PartitionError("allgather_data: worker " + std::to_string(w) +
                           " provided no data", rule_code::kWorkerRange);
    all.push_back(it->second);
  }
  std::map<int, std::vector<Bytes>> out;
  for (int w : workers_) out[w] = all;
  return out;
}

std::string Partition::describe() const {
  if (is_null()) return "the null partition";
  return shape_string(shape_) + " on workers [" + workers_string(workers_) + "]";
}

}  // namespace partita::reference
