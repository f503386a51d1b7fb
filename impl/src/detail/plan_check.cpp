#include "detail/plan_check.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "detail/agreement.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::mpi::detail {

namespace {

bool initial_mode() {
  const char* v = std::getenv("PARTITA_CHECKED");
  return !(v && std::string(v) == "0");
}
bool g_checked = initial_mode();

}  // namespace

bool checked_mode() { return g_checked; }
void set_checked_mode(bool on) { g_checked = on; }

uint64_t team_fingerprint(const Ranks& members) {
  Fingerprint f;
  f.add(members);
  return f.h | 1;  // never 0 (0 means "no team")
}

int rank_in(const Partition& P, int w) {
  const auto& ws = P.workers();
  for (size_t i = 0; i < ws.size(); ++i)
    if (ws[i] == w) return static_cast<int>(i);
  return -1;
}

void add_team_claims(std::vector<PeerClaim>& claims, const Partition& P, const Ranks& team,
                     const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                     int64_t dtype) {
  const uint64_t fp = team_fingerprint(team);
  for (size_t i = 0; i < team.size(); ++i) {
    if (team[i] == world_rank()) continue;
    PeerClaim& c = claims.at(rank_in(P, team[i]));
    c.messages += 1;
    c.team += fp;  // a sum: both sides add the same fingerprints in any order
    c.send += send[i];
    c.recv += recv[i];
    c.dtype = dtype;
  }
}

void check_counts(const Partition& P, const std::string& what, int64_t largest) {
  if (!P.active()) return;
  LocalError error;
  if (largest > INT_MAX) {
    error.text = what + ": worker " + std::to_string(world_rank()) + " would pass MPI a count of " +
                 std::to_string(largest) +
                 " elements, above the MPI count limit (INT_MAX = 2147483647); nothing was sent";
    error.kind = ErrorKind::Shape;
    error.rule = rule_code::kCountOverflow;
  }
  agree(P.comm(), (what + " count check").c_str(), Fingerprint{}, error);
}

void check_plan(const Partition& P, const std::string& what, const std::vector<PeerClaim>& claims) {
  if (!g_checked || !P.active()) return;
  const int n = P.size(), me = P.rank();
  constexpr int k = sizeof(PeerClaim) / sizeof(int64_t);
  static_assert(sizeof(PeerClaim) == 5 * sizeof(int64_t), "PeerClaim is sent as int64 words");
  // Both buffers on the heap, kept where the wait gives the exchange up.
  const auto held = std::make_shared<std::pair<std::vector<PeerClaim>, std::vector<PeerClaim>>>(claims, std::vector<PeerClaim>(n));
  const std::vector<PeerClaim>& theirs = held->second;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ialltoall(held->first.data(), k, MPI_INT64_T, held->second.data(), k, MPI_INT64_T,
                                  P.comm(), &req));
  wait_holding(req, (what + " plan check").c_str(), held);
  std::string error;
  for (int p = 0; p < n && error.empty(); ++p) {
    if (p == me) continue;
    // Said from the lower worker's side, so both sides word it the same.
    const bool low = me < p;
    const PeerClaim& a = low ? claims[p] : theirs[p];  // the lower worker's claim about the higher
    const PeerClaim& b = low ? theirs[p] : claims[p];
    const std::string wa = "worker " + std::to_string(P.workers()[std::min(me, p)]);
    const std::string wb = "worker " + std::to_string(P.workers()[std::max(me, p)]);
    auto elements = [](int64_t count, int64_t dtype) {
      std::string t = std::to_string(count) + " elements";
      if (dtype >= 0) t += " of " + dtype_string(static_cast<at::ScalarType>(dtype));
      return t;
    };
    std::vector<std::string> diffs;
    if (a.send != b.recv)
      diffs.push_back(wa + " sends " + elements(a.send, a.dtype) + " to " + wb + ", which expects " +
                      std::to_string(b.recv));
    if (b.send != a.recv)
      diffs.push_back(wb + " sends " + elements(b.send, b.dtype) + " to " + wa + ", which expects " +
                      std::to_string(a.recv));
    if (a.messages != b.messages)
      diffs.push_back(wa + " plans " + std::to_string(a.messages) + " message(s) with " + wb +
                      ", which plans " + std::to_string(b.messages));
    if (a.team != b.team)
      diffs.push_back("they hold different member lists for the team(s) they share");
    if (diffs.empty() && a.dtype >= 0 && b.dtype >= 0 && a.dtype != b.dtype &&
        (a.send || a.recv))
      diffs.push_back(wa + " moves " + dtype_string(static_cast<at::ScalarType>(a.dtype)) + ", " +
                      wb + " " + dtype_string(static_cast<at::ScalarType>(b.dtype)));
    if (diffs.empty()) continue;
    error = what + ": workers " + std::to_string(P.workers()[std::min(me, p)]) + " and " +
            std::to_string(P.workers()[std::max(me, p)]) + " disagree about the plan: ";
    for (size_t i = 0; i < diffs.size(); ++i) error += (i ? "; " : "") + diffs[i];
  }
  Fingerprint none;
  agree(P.comm(), (what + " plan check").c_str(), none,
        {error, ErrorKind::Partition, error.empty() ? "" : rule_code::kPlanDiffers});
}

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

namespace {

std::vector<int64_t> serialize(const std::vector<Ranks>& teams) {
  std::vector<int64_t> out{static_cast<int64_t>(teams.size())};
  for (const auto& t : teams) {
    out.push_back(static_cast<int64_t>(t.size()));
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

std::vector<Ranks> deserialize(const std::vector<int64_t>& v) {
  std::vector<Ranks> teams(static_cast<size_t>(v.at(0)));
  size_t i = 1;
  for (auto& t : teams) {
    const auto n = static_cast<size_t>(v.at(i++));
    for (size_t j = 0; j < n; ++j) t.push_back(static_cast<int>(v.at(i++)));
  }
  return teams;
}

std::vector<int64_t> bcast_from(MPI_Comm comm, int root, std::vector<int64_t> v, const char* what) {
  // On the heap, kept where a wait gives its broadcast up.
  const auto held = std::make_shared<std::pair<int64_t, std::vector<int64_t>>>(static_cast<int64_t>(v.size()), std::move(v));
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibcast(&held->first, 1, MPI_INT64_T, root, comm, &req));
  wait_holding(req, what, held);
  held->second.resize(static_cast<size_t>(held->first));
  PARTITA_MPI_CHECK(MPI_Ibcast(held->second.data(), static_cast<int>(held->first), MPI_INT64_T, root, comm, &req));
  wait_holding(req, what, held);
  return held->second;
}

}  // namespace

void agree_on_teams(MPI_Comm comm, const std::string& what, const std::vector<Ranks>& teams) {
  if (!g_checked) return;
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  const auto mine = serialize(teams);
  Fingerprint f;
  f.add(mine);
  const auto held = std::make_shared<std::pair<int64_t, std::vector<int64_t>>>(static_cast<int64_t>(f.h),
                                                                              std::vector<int64_t>(static_cast<size_t>(n)));
  const std::vector<int64_t>& all = held->second;
  MPI_Request req;
  const std::string label = what + " team check";
  PARTITA_MPI_CHECK(MPI_Iallgather(&held->first, 1, MPI_INT64_T, held->second.data(), 1, MPI_INT64_T, comm, &req));
  wait_holding(req, label.c_str(), held);
  int other = -1;
  for (int r = 1; r < n && other < 0; ++r)
    if (all[r] != all[0]) other = r;
  if (other < 0) return;
  // Every rank learns the two tables and says the same thing.
  const auto first = deserialize(bcast_from(comm, 0, mine, label.c_str()));
  const auto second = deserialize(bcast_from(comm, other, mine, label.c_str()));
  int w0 = 0, w1 = other;  // world ranks of the two
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(world_comm(), &wg);
  int in[2] = {0, other}, out[2] = {0, other};
  MPI_Group_translate_ranks(g, 2, in, wg, out);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  w0 = out[0];
  w1 = out[1];
  std::string diff = "they hold " + std::to_string(first.size()) + " and " +
                     std::to_string(second.size()) + " teams";
  for (size_t t = 0; t < std::min(first.size(), second.size()); ++t)
    if (first[t] != second[t]) {
      diff = "team " + std::to_string(t) + " is [" + list_string(first[t]) + "] on worker " +
             std::to_string(w0) + " and [" + list_string(second[t]) + "] on worker " +
             std::to_string(w1);
      break;
    }
  throw PartitionError(what + ": workers " + std::to_string(w0) + " and " + std::to_string(w1) +
                       " computed different teams: " + diff,
                       rule_code::kPlanDiffers);
}

}  // namespace partita::mpi::detail
