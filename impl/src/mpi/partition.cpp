#include "partita/mpi/partition.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <functional>
#include <set>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/rules.hpp"
#include "detail/agreement.hpp"
#include "detail/plan_check.hpp"

namespace partita::mpi {

using detail::Fingerprint;
using detail::agree;
using detail::checked;
using detail::PeerClaim;
using detail::agree_on_teams;
using detail::check_plan;
using detail::rank_in;
using detail::team_fingerprint;

namespace {

// Owns a communicator; frees it unless MPI is already finalized.
struct CommHandle {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  ~CommHandle() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
};

}  // namespace

struct Partition::State {
  Ranks workers;
  Shape shape;
  bool cartesian = false;
  int rank = -1;
  std::shared_ptr<CommHandle> comm;  // null when inactive
};

namespace {

using StatePtr = std::shared_ptr<Partition::State>;

int position(const Ranks& team, int worker) {
  const auto it = std::find(team.begin(), team.end(), worker);
  return it == team.end() ? -1 : static_cast<int>(it - team.begin());
}

std::shared_ptr<CommHandle> borrowed(MPI_Comm comm) {
  auto h = std::make_shared<CommHandle>();
  h->comm = comm;
  return h;
}

// Creates the communicator of `team` (world ranks) out of `parent`. Only the
// members call it (MPI_Comm_create_group is collective over the group alone).
std::shared_ptr<CommHandle> create_comm(MPI_Comm parent, const Ranks& team, int tag) {
  MPI_Group world_group, group;
  PARTITA_MPI_CHECK(MPI_Comm_group(world_comm(), &world_group));
  PARTITA_MPI_CHECK(MPI_Group_incl(world_group, static_cast<int>(team.size()),
                                   team.data(), &group));
  auto h = std::make_shared<CommHandle>();
  h->owned = true;
  int code = MPI_SUCCESS;
  {
    const WatchedCall watched("MPI_Comm_create_group (making a partition's communicator)");
    code = MPI_Comm_create_group(parent, group, tag, &h->comm);
  }
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  PARTITA_MPI_CHECK(code);
  MPI_Comm_set_errhandler(h->comm, MPI_ERRORS_RETURN);
  return h;
}

// A view of `team` from this rank, with a communicator if it is a member.
StatePtr make_state(const Ranks& team, const Shape& shape, bool cartesian) {
  auto s = std::make_shared<Partition::State>();
  s->workers = team;
  s->shape = shape;
  s->cartesian = cartesian;
  s->rank = position(team, world_rank());
  return s;
}

// Validates a team before any communicator is built from it.
void check_team(const char* what, const Ranks& team, const Shape& shape) {
  std::set<int> seen;
  for (int w : team) {
    if (w < 0 || w >= world_size())
      throw PartitionError(std::string(what) + ": worker " + std::to_string(w) +
                           " is outside a world of " + std::to_string(world_size()),
                           rule_code::kWorkerRange);
    if (!seen.insert(w).second)
      throw PartitionError(std::string(what) + ": worker " + std::to_string(w) +
                           " listed twice in [" + workers_string(team) + "]", rule_code::kWorkerRepeated);
  }
  if (team.empty()) throw PartitionError(std::string(what) + ": empty team", rule_code::kEmptyTeam);
  if (volume(shape) != static_cast<int64_t>(team.size()))
    throw PartitionError(std::string(what) + ": shape " + shape_string(shape) +
                         " does not fit " + std::to_string(team.size()) + " workers",
                         rule_code::kShapeVolume);
}

}  // namespace

Partition::Partition() = default;
Partition::Partition(std::shared_ptr<const State> s) : s_(std::move(s)) {}

Partition Partition::world() {
  Ranks all(world_size());
  for (int i = 0; i < world_size(); ++i) all[i] = i;
  auto s = make_state(all, {world_size()}, false);
  s->comm = borrowed(world_comm());
  return Partition(s);
}

bool Partition::is_null() const { return !s_; }
bool Partition::active() const { return s_ && s_->rank >= 0; }
int Partition::size() const { return s_ ? static_cast<int>(s_->workers.size()) : 0; }
int Partition::rank() const { return s_ ? s_->rank : -1; }
const Shape& Partition::shape() const {
  static const Shape none;
  return s_ ? s_->shape : none;
}
Index Partition::index() const {
  if (!s_) return {};
  if (s_->rank < 0) return Index(s_->shape.size(), -1);
  return unravel(s_->rank, s_->shape);
}
bool Partition::cartesian() const { return s_ && s_->cartesian; }
const Ranks& Partition::workers() const {
  static const Ranks none;
  return s_ ? s_->workers : none;
}
MPI_Comm Partition::comm() const {
  return active() && s_->comm ? s_->comm->comm : MPI_COMM_NULL;
}

std::string Partition::describe() const {
  if (!s_) return "the null partition";
  return shape_string(s_->shape) + " on workers [" + workers_string(s_->workers) + "]";
}

Partition Partition::create_partition_inclusive(const Ranks& ranks) const {
  if (!s_) throw PartitionError("create_partition_inclusive on the null partition", rule_code::kNullPartition);
  Ranks team;
  auto build = [&] {
    for (int r : ranks) {
      if (r < 0 || r >= size())
        throw PartitionError("create_partition_inclusive: rank " + std::to_string(r) +
                             " is not in " + describe(), rule_code::kWorkerRange);
      team.push_back(s_->workers[r]);
    }
    check_team("create_partition_inclusive", team, {static_cast<int64_t>(team.size())});
  };
  if (!active()) {  // no communication: just the view
    build();
    return Partition(make_state(team, {static_cast<int64_t>(team.size())}, false));
  }
  Fingerprint f;
  f.add(std::string("inclusive"));
  f.add(ranks);
  checked(comm(), "create_partition_inclusive", f, build);
  auto s = make_state(team, {static_cast<int64_t>(team.size())}, false);
  if (s->rank >= 0) s->comm = create_comm(comm(), team, 0);
  return Partition(s);
}

Partition Partition::create_partition_union(const Partition& other) const {
  Ranks team = workers();
  for (int w : other.workers())
    if (position(team, w) < 0) team.push_back(w);
  Fingerprint f;
  f.add(std::string("union"));
  f.add(workers());
  f.add(other.workers());
  checked(world_comm(), "create_partition_union", f, [] {});
  if (team.empty()) return Partition();
  // Same team as one of the two? Share its communicator.
  auto s = make_state(team, {static_cast<int64_t>(team.size())}, false);
  if (s->rank >= 0) {
    if (team == workers() && active()) {
      s->comm = s_->comm;
    } else if (team == other.workers() && other.active()) {
      s->comm = other.s_->comm;
    } else {
      s->comm = create_comm(world_comm(), team, 0);
    }
  }
  return Partition(s);
}

CartesianPartition Partition::create_cartesian_topology_partition(const Shape& shape) const {
  if (!s_) throw PartitionError("create_cartesian_topology_partition on the null partition",
                                       rule_code::kNullPartition);
  // Every extent at least 1, and their product (never past the team's size,
  // so it cannot overflow) the team's size.
  int64_t fitted = shape.empty() ? 0 : 1;
  for (int64_t s : shape) fitted = s < 1 || fitted > size() / s ? 0 : fitted * s;
  if (fitted != size())
    throw PartitionError("create_cartesian_topology_partition: shape " +
                         shape_string(shape) + " does not fit " + describe(), rule_code::kShapeVolume);
  // Same team, same order: the communicator is shared, not duplicated.
  auto s = std::make_shared<State>(*s_);
  s->shape = shape;
  s->cartesian = true;
  return CartesianPartition(s);
}

namespace {

// The sub-grid of `shape` that contains `index` and varies along `remain`:
// its members' ranks in row-major order, found by counting through the
// remaining dimensions with the others held fixed.
std::vector<int64_t> subgrid(const Shape& shape, const Index& index,
                             const std::vector<bool>& remain) {
  Shape sub;
  std::vector<size_t> dims;
  for (size_t d = 0; d < shape.size(); ++d)
    if (remain[d]) {
      sub.push_back(shape[d]);
      dims.push_back(d);
    }
  std::vector<int64_t> out;
  for (int64_t k = 0; k < volume(sub); ++k) {
    Index full = index;
    const Index part = unravel(k, sub);
    for (size_t j = 0; j < dims.size(); ++j) full[dims[j]] = part[j];
    out.push_back(ravel(full, shape));
  }
  return out;
}

// Builds the sub-grid view for this rank: shape kept along `remain` ({1} if
// nothing remains), a communicator among the sub-grid's members.
StatePtr subgrid_state(const Partition& P, MPI_Comm comm, const std::vector<bool>& remain,
                       bool cartesian) {
  const Index me = P.index();
  Ranks team;
  for (auto r : subgrid(P.shape(), me, remain)) team.push_back(P.workers()[r]);
  Shape sub;
  for (size_t d = 0; d < remain.size(); ++d)
    if (remain[d]) sub.push_back(P.shape()[d]);
  if (!cartesian || sub.empty()) sub = {static_cast<int64_t>(team.size())};
  // Checked mode: every member must hold the same member list, or
  // MPI_Comm_create_group below would wait forever.
  std::vector<PeerClaim> claims(P.size());
  const uint64_t fp = team_fingerprint(team);
  for (int w : team) claims[rank_in(P, w)].team = fp;
  check_plan(P, cartesian ? "create_cartesian_subtopology_partition"
                          : "create_allreduction_partition",
             claims);
  auto s = make_state(team, sub, cartesian);
  s->comm = create_comm(comm, team, 0);
  return s;
}

}  // namespace

CartesianPartition Partition::create_cartesian_subtopology_partition(
    const std::vector<bool>& remain) const {
  if (!s_) throw PartitionError("create_cartesian_subtopology_partition on the null partition",
                                       rule_code::kNullPartition);
  if (!active()) return CartesianPartition();
  Fingerprint f;
  f.add(std::string("subtopology"));
  for (bool b : remain) f.add(b ? 1 : 0);
  checked(comm(), "create_cartesian_subtopology_partition", f, [&] {
    if (remain.size() != shape().size())
      throw PartitionError("create_cartesian_subtopology_partition: " +
                           std::to_string(remain.size()) + " flags for " + describe(), rule_code::kAxisRange);
  });
  return CartesianPartition(subgrid_state(*this, comm(), remain, true));
}

Partition Partition::create_allreduction_partition(const std::vector<int>& axes) const {
  if (!s_) throw PartitionError("create_allreduction_partition on the null partition",
                                       rule_code::kNullPartition);
  if (!active()) return Partition();
  std::vector<bool> remain(shape().size(), false);
  Fingerprint f;
  f.add(std::string("allreduction"));
  f.add(std::vector<int64_t>(axes.begin(), axes.end()));
  checked(comm(), "create_allreduction_partition", f, [&] {
    for (int a : axes) {
      if (a < 0 || a >= static_cast<int>(shape().size()))
        throw PartitionError("create_allreduction_partition: axis " + std::to_string(a) +
                             " outside " + describe(), rule_code::kAxisRange);
      remain[a] = true;
    }
  });
  return Partition(subgrid_state(*this, comm(), remain, false));
}

namespace {

// Builds the teams of a broadcast (roots = P_x) or reduction (roots = P_y):
// workers pair by DistDL's key (pairing_key in partita/rules.hpp). Every
// root has a distinct key, since each of its effective dimensions is matched
// or of extent 1.
std::vector<Team> root_teams(const Partition& roots, bool roots_t, const Shape& roots_eff,
                             const Partition& others, bool others_t, const Shape& others_eff) {
  std::vector<Team> teams(roots.size());
  std::vector<int> team_of_key(roots.size(), -1);
  for (int r = 0; r < roots.size(); ++r) {
    teams[r].root = roots.workers()[r];
    const int64_t key = pairing_key(unravel(r, roots.shape()), roots_t, roots_eff, others_eff);
    team_of_key.at(key) = r;
  }
  for (int o = 0; o < others.size(); ++o) {
    const int64_t key = pairing_key(unravel(o, others.shape()), others_t, others_eff, roots_eff);
    teams[team_of_key.at(key)].paired.push_back(others.workers()[o]);
  }
  for (const auto& t : teams)
    check_team("broadcast/reduction team", t.workers(), {static_cast<int64_t>(t.workers().size())});
  return teams;
}

// This rank's labels: where it is the root, where it is paired.
struct Labels {
  int root = -1, paired = -1;
};
Labels labels_of(const std::vector<Team>& teams) {
  Labels l;
  for (size_t i = 0; i < teams.size(); ++i) {
    if (teams[i].root == world_rank()) l.root = static_cast<int>(i);
    for (int w : teams[i].paired)
      if (w == world_rank()) l.paired = static_cast<int>(i);
  }
  return l;
}

// Creates the communicators of this rank's (at most two) teams, in
// increasing label order on every rank so that overlapping creations cannot
// deadlock; a team used for both roles gets one communicator.
std::pair<Partition, Partition> team_partitions(const std::vector<Team>& teams,
                                                bool root_sends) {
  const Labels t = labels_of(teams);
  std::vector<int> labels;
  for (int l : {t.root, t.paired})
    if (l >= 0 && std::find(labels.begin(), labels.end(), l) == labels.end())
      labels.push_back(l);
  std::sort(labels.begin(), labels.end());
  std::vector<Partition> made(teams.size());
  for (int l : labels) {
    const Ranks team = teams[l].workers();
    auto s = make_state(team, {static_cast<int64_t>(team.size())}, false);
    s->comm = create_comm(world_comm(), team, l % 32767);
    made[l] = Partition(s);
  }
  Partition as_root = t.root >= 0 ? made[t.root] : Partition();
  Partition as_paired = t.paired >= 0 ? made[t.paired] : Partition();
  return root_sends ? std::make_pair(as_root, as_paired) : std::make_pair(as_paired, as_root);
}

std::vector<Ranks> members(const std::vector<Team>& teams) {
  std::vector<Ranks> out;
  for (const auto& t : teams) out.push_back(t.workers());
  return out;
}

Fingerprint pair_fingerprint(const char* what, const Partition& a, const Partition& b,
                             bool ts, bool td) {
  Fingerprint f;
  f.add(std::string(what));
  f.add(a.workers());
  f.add(a.shape());
  f.add(b.workers());
  f.add(b.shape());
  f.add(ts ? 1 : 0);
  f.add(td ? 1 : 0);
  return f;
}

}  // namespace

Ranks Team::workers() const {
  Ranks w{root};
  for (int p : paired)
    if (p != root) w.push_back(p);
  return w;
}

std::vector<Team> broadcast_teams(const Partition& P_x, const Partition& P_y,
                                  bool transpose_src, bool transpose_dest) {
  if (P_x.is_null() || P_y.is_null()) throw PartitionError("broadcast: null partition", rule_code::kNullPartition);
  const auto eff = broadcast_shapes(P_x.shape(), P_y.shape(), transpose_src, transpose_dest);
  return root_teams(P_x, transpose_src, eff.src, P_y, transpose_dest, eff.dst);
}

std::vector<Team> reduction_teams(const Partition& P_x, const Partition& P_y,
                                  bool transpose_src, bool transpose_dest) {
  if (P_x.is_null() || P_y.is_null()) throw PartitionError("sum-reduce: null partition", rule_code::kNullPartition);
  const auto eff = reduction_shapes(P_x.shape(), P_y.shape(), transpose_src, transpose_dest);
  return root_teams(P_y, transpose_dest, eff.dst, P_x, transpose_src, eff.src);
}

// Both pair constructions: the teams are computed and validated on every rank
// of the world inside the agreement, so that a bad team (or a rule
// violation) raises on all ranks before any communicator is created; a
// communicator creation that some members never reach would hang.
std::pair<Partition, Partition> Partition::create_broadcast_partition_to(
    const Partition& P_y, bool transpose_src, bool transpose_dest) const {
  std::vector<Team> t;
  checked(world_comm(), "create_broadcast_partition_to",
          pair_fingerprint("broadcast", *this, P_y, transpose_src, transpose_dest),
          [&] { t = broadcast_teams(*this, P_y, transpose_src, transpose_dest); });
  agree_on_teams(world_comm(), "create_broadcast_partition_to", members(t));
  return team_partitions(t, true);
}

std::pair<Partition, Partition> Partition::create_reduction_partition_to(
    const Partition& P_y, bool transpose_src, bool transpose_dest) const {
  std::vector<Team> t;
  checked(world_comm(), "create_reduction_partition_to",
          pair_fingerprint("reduction", *this, P_y, transpose_src, transpose_dest),
          [&] { t = reduction_teams(*this, P_y, transpose_src, transpose_dest); });
  agree_on_teams(world_comm(), "create_reduction_partition_to", members(t));
  return team_partitions(t, false);
}

bool Partition::operator==(const Partition& other) const {
  return workers() == other.workers() && shape() == other.shape() &&
         cartesian() == other.cartesian();
}

Bytes Partition::broadcast_data(const Bytes& data, int root) const {
  if (!active()) return {};
  Fingerprint f;
  f.add(std::string("broadcast_data"));
  f.add(root);
  checked(comm(), "broadcast_data", f, [&] {
    if (root < 0 || root >= size())
      throw PartitionError("broadcast_data: root " + std::to_string(root) + " outside " +
                           describe(), rule_code::kRootRange);
  });
  // Every buffer on the heap, kept where a wait gives its operation up.
  struct Held {
    int64_t len = 0;
    Bytes out;
  };
  const auto h = std::make_shared<Held>();
  h->len = static_cast<int64_t>(data.size());
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibcast(&h->len, 1, MPI_INT64_T, root, comm(), &req));
  wait_holding(req, "broadcast_data", h);
  if (h->len > INT_MAX) throw Error("broadcast_data: payload larger than INT_MAX bytes");
  h->out = rank() == root ? data : Bytes(static_cast<size_t>(h->len), '\0');
  PARTITA_MPI_CHECK(MPI_Ibcast(h->out.data(), static_cast<int>(h->len), MPI_BYTE, root, comm(), &req));
  wait_holding(req, "broadcast_data", h);
  return std::move(h->out);
}

Bytes Partition::broadcast_data(const Bytes& data, int root, const Partition& P_data) const {
  if (!active()) return {};
  // Which of our ranks is rank `root` of P_data? Exactly one member knows.
  const auto ranks = std::make_shared<std::array<int, 2>>();
  (*ranks)[0] = P_data.active() && P_data.rank() == root ? rank() : -1;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(&(*ranks)[0], &(*ranks)[1], 1, MPI_INT, MPI_MAX, comm(), &req));
  wait_holding(req, "broadcast_data", ranks);
  const int found = (*ranks)[1];
  if (found < 0)
    throw PartitionError("broadcast_data: rank " + std::to_string(root) +
                         " of P_data is not a member of " + describe(), rule_code::kRootRange);
  return broadcast_data(data, found);
}

std::vector<Bytes> Partition::allgather_data(const Bytes& data) const {
  if (!active()) return {};
  struct Held {
    int64_t len = 0;
    std::vector<int64_t> lens;
    std::vector<int> counts, displs;
    Bytes sent, all;
  };
  const auto h = std::make_shared<Held>();
  h->len = static_cast<int64_t>(data.size());
  h->lens.resize(size());
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallgather(&h->len, 1, MPI_INT64_T, h->lens.data(), 1, MPI_INT64_T, comm(), &req));
  wait_holding(req, "allgather_data", h);
  // Every rank sees every length: a payload too large on one rank raises
  // on all of them.
  int64_t total = 0;
  for (int i = 0; i < size(); ++i) {
    if (h->lens[i] > INT_MAX)
      throw Error("allgather_data: rank " + std::to_string(i) + "'s payload is larger than INT_MAX bytes");
    h->displs.push_back(static_cast<int>(std::min<int64_t>(total, INT_MAX)));
    h->counts.push_back(static_cast<int>(h->lens[i]));
    total += h->lens[i];
  }
  if (total > INT_MAX) throw Error("allgather_data: gathered payload larger than INT_MAX");
  h->sent = data;
  h->all.assign(static_cast<size_t>(total), '\0');
  PARTITA_MPI_CHECK(MPI_Iallgatherv(h->sent.data(), static_cast<int>(h->len), MPI_BYTE, h->all.data(),
                                    h->counts.data(), h->displs.data(), MPI_BYTE, comm(), &req));
  wait_holding(req, "allgather_data", h);
  std::vector<Bytes> out;
  for (int i = 0; i < size(); ++i) out.push_back(h->all.substr(h->displs[i], h->counts[i]));
  return out;
}

Index Partition::cartesian_index(int rank) const {
  if (rank < 0 || rank >= size())
    throw PartitionError("cartesian_index: rank " + std::to_string(rank) + " outside " +
                         describe(), rule_code::kWorkerRange);
  return unravel(rank, shape());
}

std::vector<std::pair<int, int>> Partition::neighbor_ranks(int rank) const {
  const Index me = cartesian_index(rank);
  std::vector<std::pair<int, int>> out;
  for (size_t d = 0; d < me.size(); ++d) {
    Index lo = me, hi = me;
    --lo[d];
    ++hi[d];
    out.emplace_back(lo[d] >= 0 ? static_cast<int>(ravel(lo, shape())) : -1,
                     hi[d] < shape()[d] ? static_cast<int>(ravel(hi, shape())) : -1);
  }
  return out;
}

}  // namespace partita::mpi
