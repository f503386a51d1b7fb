// Pipeline schedules as data: the built-ins, the CSV format, the verifier
// and the simulator (schedule.hpp, docs/pipeline.md). Pure code: no MPI, no
// LibTorch; the executor (pipeline.cpp) runs what these functions produce.
#include "partita/smp/schedule.hpp"

#include "partita/smp.hpp"  // canonical_pipeline

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace partita::smp {

namespace {

using K = ActionKind;

[[noreturn]] void fail(const std::string& what) { throw ScheduleError("pipeline schedule: " + what); }

std::string where(int rank, int index, const Action& a) {
  return "rank " + std::to_string(rank) + ", action " + std::to_string(index) + " (" + to_string(a) + ")";
}

bool is_backward(K k) { return k == K::kBackwardInput || k == K::kFullBackward; }

}  // namespace

// --- actions ------------------------------------------------------------------

const char* letters(ActionKind k) {
  switch (k) {
    case K::kForward: return "F";
    case K::kBackwardInput: return "I";
    case K::kBackwardWeight: return "W";
    case K::kFullBackward: return "B";
    case K::kSendF: return "SEND_F";
    case K::kRecvF: return "RECV_F";
    case K::kSendB: return "SEND_B";
    case K::kRecvB: return "RECV_B";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return std::to_string(a.stage) + letters(a.kind) + std::to_string(a.microbatch);
}

Action parse_action(const std::string& text) {
  // [stage][type][microbatch], e.g. 2F0, 3SEND_F1; spaces around are allowed.
  size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  const std::string t = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  auto bad = [&](const std::string& why) -> Action {
    fail("cannot read the action \"" + t + "\": " + why +
         " (expected [stage][F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B][microbatch], e.g. 2F0)");
  };
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0) return bad("no stage number");
  size_t j = i;
  while (j < t.size() && !std::isdigit(static_cast<unsigned char>(t[j]))) ++j;
  const std::string type = t.substr(i, j - i);
  size_t k = j;
  while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k;
  if (k != t.size()) return bad("trailing characters");
  if (j == t.size()) return bad("no microbatch number (partita runs no per-stage actions such as UNSHARD)");
  if (i > 6 || k - j > 7) return bad("a number too large");
  Action a;
  a.stage = std::stoi(t.substr(0, i));
  a.microbatch = std::stoi(t.substr(j, k - j));
  static const std::pair<const char*, K> kinds[] = {
      {"F", K::kForward},     {"I", K::kBackwardInput}, {"W", K::kBackwardWeight}, {"B", K::kFullBackward},
      {"SEND_F", K::kSendF},  {"RECV_F", K::kRecvF},    {"SEND_B", K::kSendB},     {"RECV_B", K::kRecvB}};
  for (const auto& [name, kind] : kinds)
    if (type == name) {
      a.kind = kind;
      return a;
    }
  return bad("unknown type \"" + type + "\"");
}

// --- the schedule ---------------------------------------------------------------

std::vector<int> Schedule::stage_ranks() const {
  std::vector<int> owner(std::max(stages, 0), -1);
  for (int r = 0; r < static_cast<int>(actions.size()); ++r)
    for (int i = 0; i < static_cast<int>(actions[r].size()); ++i) {
      const Action& a = actions[r][i];
      if (a.stage < 0 || a.stage >= stages)
        fail(where(r, i, a) + ": stage " + std::to_string(a.stage) + " is outside 0.." + std::to_string(stages - 1));
      if (!a.is_compute()) continue;
      if (owner[a.stage] == -1) owner[a.stage] = r;
      else if (owner[a.stage] != r)
        fail(where(r, i, a) + ": stage " + std::to_string(a.stage) + " runs on rank " + std::to_string(owner[a.stage]) +
             " and on rank " + std::to_string(r) + " (a stage lives on one rank)");
    }
  for (int s = 0; s < stages; ++s)
    if (owner[s] == -1) fail("stage " + std::to_string(s) + " has no computation on any rank");
  return owner;
}

bool Schedule::has_comms() const {
  for (const auto& row : actions)
    for (const auto& a : row)
      if (!a.is_compute()) return true;
  return false;
}

// --- built-ins ------------------------------------------------------------------

namespace {

void check_counts(const char* name, int ranks, int microbatches) {
  if (ranks < 1) fail(std::string(name) + ": " + std::to_string(ranks) + " ranks (at least 1)");
  if (microbatches < 1) fail(std::string(name) + ": " + std::to_string(microbatches) + " microbatches (at least 1)");
}

Schedule empty(const char* name, int ranks, int stages, int microbatches) {
  Schedule s;
  s.name = name;
  s.ranks = ranks;
  s.stages = stages;
  s.microbatches = microbatches;
  s.actions.assign(ranks, {});
  s.live_bound.assign(ranks, 0);
  return s;
}

}  // namespace

Schedule gpipe(int p, int m) {
  check_counts("gpipe", p, m);
  Schedule s = empty("gpipe", p, p, m);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.actions[r].push_back({K::kForward, r, i});
    for (int i = 0; i < m; ++i) s.actions[r].push_back({K::kFullBackward, r, i});
    s.live_bound[r] = m;
  }
  return s;
}

Schedule one_f_one_b(int p, int m) {
  check_counts("1f1b", p, m);
  Schedule s = empty("1f1b", p, p, m);
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    const int warm = std::min(p - 1 - r, m);
    for (int i = 0; i < warm; ++i) out.push_back({K::kForward, r, i});
    for (int i = warm; i < m; ++i) {
      out.push_back({K::kForward, r, i});
      out.push_back({K::kFullBackward, r, i - warm});
    }
    for (int i = m - warm; i < m; ++i) out.push_back({K::kFullBackward, r, i});
    s.live_bound[r] = std::min(p - r, m);
  }
  return s;
}

Schedule interleaved_1f1b(int p, int m, int v) {
  check_counts("interleaved_1f1b", p, m);
  if (v < 1) fail("interleaved_1f1b: " + std::to_string(v) + " virtual stages per rank (at least 1)");
  if (v == 1) {
    Schedule s = one_f_one_b(p, m);
    s.name = "interleaved_1f1b";
    return s;
  }
  if (m % p != 0)
    fail("interleaved_1f1b cannot take " + std::to_string(m) + " microbatches on " + std::to_string(p) +
         " ranks: with virtual stages the microbatches must be a multiple of the ranks (Megatron-LM's rule)");
  Schedule s = empty("interleaved_1f1b", p, p * v, m);
  const int total = m * v;
  // The k-th forward of a rank runs chunk (k mod pv) / p of microbatch
  // (k / pv) p + k mod p: groups of p microbatches go through one chunk, then
  // the next; the k-th backward goes through the chunks in reverse.
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    auto fwd = [&](int k) { return Action{K::kForward, ((k % (p * v)) / p) * p + r, mb_of(k)}; };
    auto bwd = [&](int k) { return Action{K::kFullBackward, (v - 1 - (k % (p * v)) / p) * p + r, mb_of(k)}; };
    const int warm = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto& out = s.actions[r];
    for (int k = 0; k < warm; ++k) out.push_back(fwd(k));
    for (int i = 0; i < total - warm; ++i) {
      out.push_back(fwd(warm + i));
      out.push_back(bwd(i));
    }
    for (int i = total - warm; i < total; ++i) out.push_back(bwd(i));
    s.live_bound[r] = std::min(warm + 1, total);
  }
  return s;
}

Schedule zb_h1(int p, int m) {
  check_counts("zb_h1", p, m);
  Schedule s = empty("zb_h1", p, p, m);
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    const int warm = std::min(p - 1 - r, m);
    int w = 0, j = 0;
    auto maybe_w = [&] {
      if (j++ >= r && w < m) out.push_back({K::kBackwardWeight, r, w++});
    };
    for (int i = 0; i < warm; ++i) out.push_back({K::kForward, r, i});
    for (int i = warm; i < m; ++i) {
      out.push_back({K::kForward, r, i});
      out.push_back({K::kBackwardInput, r, i - warm});
      maybe_w();
    }
    for (int i = m - warm; i < m; ++i) {
      out.push_back({K::kBackwardInput, r, i});
      maybe_w();
    }
    while (w < m) out.push_back({K::kBackwardWeight, r, w++});
    // A graph stays alive until its W: rank r holds its 1F1B count plus
    // the r weight gradients it postponed, i.e. p (1F1B's rank 0) everywhere.
    s.live_bound[r] = std::min(p, m);
  }
  return s;
}

namespace {
struct Named {
  const char* name;
  const char* builtin;
};
const Named kNames[] = {{"gpipe", "gpipe"},
                        {"1f1b", "1f1b"},
                        {"interleaved_1f1b", "interleaved_1f1b"},
                        {"zb_h1", "zb_h1"},
                        {"simple", "gpipe"},
                        {"interleaved", "1f1b"},
                        {"interleaved_virtual", "interleaved_1f1b"},
                        {"zero_bubble", "zb_h1"}};

// A builtin's own name, or any name smp::Config takes (smp's and
// torch.distributed.pipelining's, either case: canonical_pipeline).
std::string builtin_of(const std::string& name) {
  const std::string smp_name = canonical_pipeline(name);
  for (const auto& n : kNames)
    if (name == n.name || smp_name == n.name) return n.builtin;
  std::string known;
  for (const auto& n : kNames) known += (known.empty() ? "" : ", ") + std::string(n.name);
  fail("unknown schedule \"" + name + "\" (expected one of " + known + ", or torch.distributed.pipelining's "
       "GPipe, 1F1B, Interleaved1F1B, ZBH1)");
}
}  // namespace

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& n : kNames) out.push_back(n.name);
  return out;
}

bool schedule_takes_virtual_stages(const std::string& name) { return builtin_of(name) == "interleaved_1f1b"; }

namespace {
// Bounds on what is built and drawn: computations of each kind in a
// built-in schedule, the text timeline's cells (ranks x time units) and
// the SVG's boxes.
constexpr int64_t kMaxScheduleComputations = int64_t{1} << 24;
constexpr double kMaxTimelineCells = 1 << 22;
constexpr size_t kMaxTimelineBoxes = size_t{1} << 18;
}  // namespace

Schedule build_schedule(const std::string& name, int ranks, int microbatches, int v) {
  const std::string b = builtin_of(name);
  if (b != "interleaved_1f1b" && v != 1)
    fail(name + " has one stage per rank; it cannot take " + std::to_string(v) +
         " virtual stages per rank (interleaved_1f1b can)");
  // The whole schedule is held on every rank (and drawn by explain).
  if (ranks > 0 && microbatches > 0 && v > 0 &&
      static_cast<int64_t>(ranks) * microbatches * v > kMaxScheduleComputations)
    fail(name + ": " + std::to_string(ranks) + " ranks x " + std::to_string(microbatches) + " microbatches x " +
         std::to_string(v) + " virtual stages is above 2^24 computations of each kind");
  if (b == "gpipe") return gpipe(ranks, microbatches);
  if (b == "1f1b") return one_f_one_b(ranks, microbatches);
  if (b == "zb_h1") return zb_h1(ranks, microbatches);
  return interleaved_1f1b(ranks, microbatches, v);
}

namespace {
// with_comms, and for every action of the result its index in the given
// list (-1 for a message it added), so that errors name the user's actions.
Schedule lower(Schedule s, std::vector<std::vector<int>>* origin) {
  if (origin) origin->assign(s.actions.size(), {});
  if (s.has_comms()) {
    if (origin)
      for (size_t r = 0; r < s.actions.size(); ++r)
        for (size_t i = 0; i < s.actions[r].size(); ++i) (*origin)[r].push_back(static_cast<int>(i));
    return s;
  }
  const std::vector<int> owner = s.stage_ranks();
  for (int r = 0; r < static_cast<int>(s.actions.size()); ++r) {
    std::vector<Action> out;
    auto add = [&](const Action& a, int from) {
      out.push_back(a);
      if (origin) (*origin)[r].push_back(from);
    };
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      const bool prev_away = a.stage > 0 && owner[a.stage - 1] != r;
      const bool next_away = a.stage < s.stages - 1 && owner[a.stage + 1] != r;
      if (a.kind == K::kForward) {
        if (prev_away) add({K::kRecvF, a.stage, a.microbatch}, -1);
        add(a, i);
        if (next_away) add({K::kSendF, a.stage, a.microbatch}, -1);
      } else if (is_backward(a.kind)) {
        if (next_away) add({K::kRecvB, a.stage, a.microbatch}, -1);
        add(a, i);
        if (prev_away) add({K::kSendB, a.stage, a.microbatch}, -1);
      } else {
        add(a, i);
      }
    }
    s.actions[r] = std::move(out);
  }
  return s;
}
}  // namespace

Schedule with_comms(Schedule s) { return lower(std::move(s), nullptr); }

// --- CSV --------------------------------------------------------------------------

std::string to_csv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.actions) {
    for (size_t i = 0; i < row.size(); ++i) out += (i ? "," : "") + to_string(row[i]);
    out += "\n";
  }
  return out;
}

Schedule schedule_from_csv(const std::string& text, int microbatches, int stages, const std::string& name) {
  Schedule s;
  s.name = name;
  std::istringstream in(text);
  std::string line;
  int max_stage = -1, max_mb = -1, row = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<Action> actions;
    std::string cell;
    std::istringstream cells(line);
    int col = 0;
    while (std::getline(cells, cell, ',')) {
      if (cell.find_first_not_of(" \t") != std::string::npos) {
        try {
          actions.push_back(parse_action(cell));
        } catch (const ScheduleError& e) {
          fail("CSV row " + std::to_string(row) + " (rank " + std::to_string(row) + "), column " +
               std::to_string(col) + ": " + std::string(e.what()).substr(std::string("pipeline schedule: ").size()));
        }
        max_stage = std::max(max_stage, actions.back().stage);
        max_mb = std::max(max_mb, actions.back().microbatch);
      }
      ++col;
    }
    s.actions.push_back(std::move(actions));
    ++row;
  }
  while (!s.actions.empty() && s.actions.back().empty()) s.actions.pop_back();  // trailing blank lines
  if (s.actions.empty()) fail("the CSV has no actions");
  s.ranks = static_cast<int>(s.actions.size());
  s.stages = stages > 0 ? stages : max_stage + 1;
  s.microbatches = microbatches > 0 ? microbatches : max_mb + 1;
  return s;
}

// --- verification ---------------------------------------------------------------------

double Simulation::bubble() const {
  if (makespan <= 0 || busy.empty()) return 0;
  double total = 0;
  for (double b : busy) total += b;
  return 1 - total / (makespan * static_cast<double>(busy.size()));
}

namespace {

// The matching send of every receive, and the blocking run of all ranks.
struct Plan {
  const Schedule& s;
  std::vector<std::vector<int>> origin;  // index in the user's list, -1: added by with_comms
  std::vector<int> owner;
  // For each rank and action index: for a receive, the (rank, index) of its
  // send; for a SEND_B, the (rank, index) of its receive.
  std::vector<std::vector<std::pair<int, int>>> peer;

  Plan(const Schedule& sched, std::vector<std::vector<int>> from)
      : s(sched), origin(std::move(from)), owner(sched.stage_ranks()) {
    peer.resize(s.ranks);
    for (int r = 0; r < s.ranks; ++r) peer[r].assign(s.actions[r].size(), {-1, -1});
  }

  // "rank 1, action 4 (1W0)", the index in the user's list; a message that
  // with_comms added is named with the computation it serves.
  std::string where(int r, int i, const Action& a) const {
    if (origin.empty() || origin[r][i] >= 0)
      return partita::smp::where(r, origin.empty() ? i : origin[r][i], a);
    const bool before = a.kind == K::kRecvF || a.kind == K::kRecvB;
    const int j = origin[r][before ? i + 1 : i - 1];
    return "rank " + std::to_string(r) + ", " + to_string(a) + " (the message " + (before ? "before" : "after") +
           " action " + std::to_string(j) + ", " + to_string(s.actions[r][before ? i + 1 : i - 1]) + ")";
  }

  // Check 1's communication part and check 3.
  void match() {
    // channel (from, to, forward?) -> indices of sends / receives in order
    std::map<std::tuple<int, int, bool>, std::vector<int>> sends, recvs;
    for (int r = 0; r < s.ranks; ++r)
      for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
        const Action& a = s.actions[r][i];
        if (a.is_compute()) continue;
        if (owner[a.stage] != r)
          fail(where(r, i, a) + ": stage " + std::to_string(a.stage) + " is on rank " + std::to_string(owner[a.stage]) +
               "; its messages are sent and received there");
        const bool fwd = a.kind == K::kSendF || a.kind == K::kRecvF;
        const bool send = a.kind == K::kSendF || a.kind == K::kSendB;
        // The stage on the other end: SEND_F and RECV_B talk to s + 1,
        // RECV_F and SEND_B to s - 1.
        const int other = (a.kind == K::kSendF || a.kind == K::kRecvB) ? a.stage + 1 : a.stage - 1;
        if (other < 0 || other >= s.stages)
          fail(where(r, i, a) + ": stage " + std::to_string(a.stage) + " has no stage " + std::to_string(other) +
               " to " + (send ? "send to" : "receive from"));
        const int q = owner[other];
        if (q == r)
          fail(where(r, i, a) + ": stages " + std::to_string(a.stage) + " and " + std::to_string(other) +
               " are both on rank " + std::to_string(r) + "; they exchange nothing");
        (send ? sends[{r, q, fwd}] : recvs[{q, r, fwd}]).push_back(i);
      }
    for (const auto& [key, out] : sends) {
      const auto& [from, to, fwd] = key;
      const std::vector<int> none;
      const auto it = recvs.find(key);
      const std::vector<int>& in = it == recvs.end() ? none : it->second;
      for (size_t j = 0; j < out.size(); ++j) {
        const Action& a = s.actions[from][out[j]];
        if (j >= in.size())
          fail(where(from, out[j], a) + ": a send without its receive (rank " + std::to_string(to) + " posts " +
               std::to_string(in.size()) + " receive(s) from rank " + std::to_string(from) + " for " +
               std::to_string(out.size()) + " " + (fwd ? "activations" : "gradients") + ")");
        const Action& b = s.actions[to][in[j]];
        const Action expect{fwd ? K::kRecvF : K::kRecvB, fwd ? a.stage + 1 : a.stage - 1, a.microbatch};
        if (b != expect)
          fail(where(to, in[j], b) + ": " + (fwd ? "activation" : "gradient") + " number " + std::to_string(j + 1) +
               " from rank " + std::to_string(from) + " is " + to_string(a) + " (rank " + std::to_string(from) +
               ", action " + std::to_string(out[j]) + "), so this receive should be " + to_string(expect) +
               " (messages between two ranks match in the order they were posted)");
        peer[to][in[j]] = {from, out[j]};
        peer[from][out[j]] = {to, in[j]};
      }
    }
    for (const auto& [key, in] : recvs) {
      const auto& [from, to, fwd] = key;
      const auto it = sends.find(key);
      const size_t n = it == sends.end() ? 0 : it->second.size();
      if (in.size() > n) {
        const Action& b = s.actions[to][in[n]];
        fail(where(to, in[n], b) + ": a receive without its send (rank " + std::to_string(from) + " sends " +
             std::to_string(n) + " " + (fwd ? "activation(s)" : "gradient(s)") + " to rank " + std::to_string(to) + ")");
      }
    }
  }

  // Check 2: every rank's list in order.
  void dependencies() {
    const int S = s.stages, m = s.microbatches;
    for (int r = 0; r < s.ranks; ++r) {
      // per (stage, mb): bit flags of what ran on this rank
      enum : unsigned { kF = 1, kI = 2, kW = 4, kB = 8, kSF = 16, kRF = 32, kSB = 64, kRB = 128 };
      std::map<std::pair<int, int>, unsigned> done;
      auto has = [&](int st, int mb, unsigned f) { return (done[{st, mb}] & f) != 0; };
      const auto& row = s.actions[r];
      for (int i = 0; i < static_cast<int>(row.size()); ++i) {
        const Action& a = row[i];
        const std::string at = where(r, i, a);
        if (a.microbatch < 0 || a.microbatch >= m)
          fail(at + ": microbatch " + std::to_string(a.microbatch) + " is outside 0.." + std::to_string(m - 1) +
               " (the schedule is for " + std::to_string(m) + " microbatches)");
        unsigned& f = done[{a.stage, a.microbatch}];
        auto twice = [&](unsigned bit) {
          if (f & bit) fail(at + ": runs twice");
          f |= bit;
        };
        const std::string mb = std::to_string(a.microbatch);
        switch (a.kind) {
          case K::kForward: {
            if (a.stage > 0) {
              const bool local = owner[a.stage - 1] == r;
              if (local && !has(a.stage - 1, a.microbatch, kF))
                fail(at + ": its input comes from " + std::to_string(a.stage - 1) + "F" + mb +
                     " on this rank, which has not run yet");
              if (!local && !has(a.stage, a.microbatch, kRF))
                fail(at + ": its input has not been received (no " + std::to_string(a.stage) + "RECV_F" + mb +
                     " before it)");
            }
            twice(kF);
            break;
          }
          case K::kBackwardInput:
          case K::kFullBackward: {
            if (!(f & kF)) fail(at + ": a backward before its forward " + std::to_string(a.stage) + "F" + mb);
            if (f & (kI | kB)) fail(at + ": the backward of this stage and microbatch runs twice");
            if (a.stage < S - 1) {
              const bool local = owner[a.stage + 1] == r;
              if (local && !has(a.stage + 1, a.microbatch, kI | kB))
                fail(at + ": its output's gradient comes from the backward of stage " + std::to_string(a.stage + 1) +
                     " on this rank, which has not run yet");
              if (!local && !has(a.stage, a.microbatch, kRB))
                fail(at + ": its output's gradient has not been received (no " + std::to_string(a.stage) +
                     "RECV_B" + mb + " before it)");
            }
            f |= a.kind == K::kFullBackward ? kB : kI;
            break;
          }
          case K::kBackwardWeight:
            if (f & kB) fail(at + ": a W after the full backward " + std::to_string(a.stage) + "B" + mb + " (which computed the weight gradient already)");
            if (!(f & kI)) fail(at + ": a W before its I (" + std::to_string(a.stage) + "I" + mb + ")");
            twice(kW);
            break;
          case K::kSendF:
            if (!(f & kF)) fail(at + ": sends the output of " + std::to_string(a.stage) + "F" + mb + ", which has not run yet");
            twice(kSF);
            break;
          case K::kRecvF: twice(kRF); break;
          case K::kSendB:
            if (!(f & (kI | kB)))
              fail(at + ": sends the input gradient of the backward of stage " + std::to_string(a.stage) +
                   " microbatch " + mb + ", which has not run yet");
            twice(kSB);
            break;
          case K::kRecvB: twice(kRB); break;
        }
      }
      // Everything of this rank's stages ran.
      for (int st = 0; st < S; ++st) {
        if (owner[st] != r) continue;
        for (int mb = 0; mb < m; ++mb) {
          const unsigned f = done[{st, mb}];
          const std::string name = std::to_string(st);
          const std::string mbs = std::to_string(mb);
          auto missing = [&](const std::string& what) {
            fail("rank " + std::to_string(r) + " never runs " + what + " (every stage runs F and then B, or I and W, for each of the " +
                 std::to_string(m) + " microbatches)");
          };
          if (!(f & kF)) missing(name + "F" + mbs);
          if (!(f & (kB | kI))) missing("the backward of stage " + name + " microbatch " + mbs + " (" + name + "B" + mbs + " or " + name + "I" + mbs + ")");
          if ((f & kI) && !(f & kW)) missing(name + "W" + mbs + " after " + name + "I" + mbs);
          if (st < S - 1 && owner[st + 1] != r && !(f & kSF)) missing(name + "SEND_F" + mbs);
          if (st > 0 && owner[st - 1] != r && !(f & kSB)) missing(name + "SEND_B" + mbs);
        }
      }
    }
  }

  // Check 4 and the timing: every rank runs its list in order, a receive
  // waits for its send, a send never waits (the executor's sends are
  // MPI_Isend, completed at the end of the step); returns the simulation,
  // or fails naming the blocked actions.
  Simulation run(const Costs& c) {
    const int p = s.ranks;
    std::vector<int> pos(p, 0);
    std::vector<double> clock(p, 0);
    std::vector<std::vector<double>> at(p);  // when each action completed
    for (int r = 0; r < p; ++r) at[r].assign(s.actions[r].size(), 0);
    Simulation sim;
    sim.busy.assign(p, 0);
    sim.timeline.assign(p, {});
    auto cost = [&](K k) {
      switch (k) {
        case K::kForward: return c.forward();
        case K::kBackwardInput: return c.backward_input();
        case K::kBackwardWeight: return c.backward_weight();
        case K::kFullBackward: return c.full_backward();
        default: return 0.0;
      }
    };
    auto ready = [&](int r, int i) {
      const Action& a = s.actions[r][i];
      if (a.kind == K::kRecvF || a.kind == K::kRecvB) {
        const auto [q, j] = peer[r][i];
        return pos[q] > j;
      }
      return true;
    };
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < p; ++r) {
        while (pos[r] < static_cast<int>(s.actions[r].size()) && ready(r, pos[r])) {
          const int i = pos[r];
          const Action& a = s.actions[r][i];
          double start = clock[r];
          if (a.kind == K::kRecvF || a.kind == K::kRecvB) start = std::max(start, at[peer[r][i].first][peer[r][i].second]);
          const double end = start + cost(a.kind);
          at[r][i] = end;
          clock[r] = end;
          if (a.is_compute()) {
            sim.busy[r] += end - start;
            sim.timeline[r].push_back({a, i, start, end});
          }
          ++pos[r];
          progress = true;
        }
      }
    }
    for (int r = 0; r < p; ++r) {
      if (pos[r] == static_cast<int>(s.actions[r].size())) continue;
      // The first blocked rank, and the chain of waits from it.
      std::string chain;
      std::set<int> seen;
      int q = r;
      while (q >= 0 && !seen.count(q) && pos[q] < static_cast<int>(s.actions[q].size())) {
        seen.insert(q);
        const int i = pos[q];
        const Action& a = s.actions[q][i];
        const auto [o, j] = peer[q][i];
        chain += "\n  " + where(q, i, a) + " waits for " + to_string(s.actions[o][j]) + " on rank " + std::to_string(o);
        if (pos[o] < static_cast<int>(s.actions[o].size()) && pos[o] != j) {
          q = o;
        } else {
          break;
        }
      }
      fail(where(r, pos[r], s.actions[r][pos[r]]) +
           ": the schedule deadlocks (every rank runs its list in order and a receive waits for its send):" + chain +
           (seen.count(q) && q != r ? "" : (seen.size() > 1 ? "\n  (a cycle)" : "")));
    }
    for (int r = 0; r < p; ++r) sim.makespan = std::max(sim.makespan, clock[r]);
    return sim;
  }

  // Check 6: what partita's executor needs beyond the above. The step
  // function is called at the forwards of the model's call, in microbatch
  // order (the model's first call in a step is microbatch 0's): a stage's
  // forwards run in microbatch order. With one stage per rank, a stage's
  // first forward of a step waits for the output's shape from the last
  // stage after sending its activation, which it can do only when its
  // SEND_F comes right after it.
  void executable() const {
    const bool one_per_rank = s.stages == s.ranks;
    for (int r = 0; r < s.ranks; ++r) {
      std::map<int, int> last;  // stage -> its latest forward's microbatch
      const auto& list = s.actions[r];
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const Action& a = list[i];
        if (a.kind != K::kForward) continue;
        const auto it = last.find(a.stage);
        if (it != last.end() && a.microbatch < it->second)
          fail(where(r, i, a) + ": stage " + std::to_string(a.stage) + "'s forwards must run in microbatch order "
               "(the step function is called in that order), and microbatch " + std::to_string(it->second) +
               "'s ran before this one");
        if (it == last.end() && one_per_rank && a.stage + 1 < s.stages) {
          const bool sent = i + 1 < static_cast<int>(list.size()) && list[i + 1].kind == K::kSendF &&
                            list[i + 1].stage == a.stage && list[i + 1].microbatch == a.microbatch;
          if (!sent)
            fail(where(r, i, a) + ": the stage's first forward must be followed at once by its SEND_F (it then "
                 "waits for the output's shape from the last stage, which needs this activation)");
        }
        last[a.stage] = a.microbatch;
      }
    }
  }

  // Check 5 and the peaks (messages do not change them).
  std::vector<int> live(bool check) const {
    std::vector<int> peaks(s.ranks, 0);
    for (int r = 0; r < s.ranks; ++r) {
      int now = 0;
      for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
        const Action& a = s.actions[r][i];
        if (a.kind == K::kForward) ++now;
        if (a.kind == K::kFullBackward || a.kind == K::kBackwardWeight) --now;
        peaks[r] = std::max(peaks[r], now);
        if (check && r < static_cast<int>(s.live_bound.size()) && now > s.live_bound[r])
          fail(where(r, i, a) + ": rank " + std::to_string(r) + " holds " + std::to_string(now) +
               " live activations, above the schedule's bound of " + std::to_string(s.live_bound[r]));
      }
    }
    return peaks;
  }
};

void check_shape(const Schedule& s) {
  if (s.ranks < 1) fail("a schedule of " + std::to_string(s.ranks) + " ranks");
  if (s.microbatches < 1) fail("a schedule of " + std::to_string(s.microbatches) + " microbatches");
  if (s.stages < 1) fail("a schedule of " + std::to_string(s.stages) + " stages");
  if (static_cast<int>(s.actions.size()) != s.ranks)
    fail("the schedule lists actions for " + std::to_string(s.actions.size()) + " ranks, not " +
         std::to_string(s.ranks));
  if (!s.live_bound.empty() && static_cast<int>(s.live_bound.size()) != s.ranks)
    fail("the schedule states live-activation bounds for " + std::to_string(s.live_bound.size()) + " ranks, not " +
         std::to_string(s.ranks));
  // (An empty list states no bound; a bound of 0 would read as none.)
  for (size_t r = 0; r < s.live_bound.size(); ++r)
    if (s.live_bound[r] < 1)
      fail("rank " + std::to_string(r) + "'s live-activation bound is " + std::to_string(s.live_bound[r]) +
           " (at least 1; an empty list states no bound)");
}

}  // namespace

Simulation verify(const Schedule& given, const Costs& costs) {
  check_shape(given);
  given.stage_ranks();  // every stage on one rank
  std::vector<std::vector<int>> origin;
  const Schedule s = lower(given, &origin);
  Plan plan(s, std::move(origin));
  plan.match();
  plan.dependencies();
  Simulation sim = plan.run(costs);
  plan.executable();
  sim.peak_live = plan.live(/*check=*/true);
  return sim;
}

Simulation simulate(const Schedule& given, const Costs& costs) {
  std::vector<std::vector<int>> origin;
  const Schedule s = lower(given, &origin);
  Plan plan(s, std::move(origin));
  plan.match();
  Simulation sim = plan.run(costs);
  sim.peak_live = plan.live(/*check=*/false);
  return sim;
}

double theoretical_bubble(const std::string& name, int p, int m, int v) {
  const std::string b = builtin_of(name);
  if (b == "interleaved_1f1b") return (p - 1.0) / (static_cast<double>(v) * m + p - 1);
  if (b == "zb_h1") return (p - 1.0) / (3.0 * m + p - 1);
  return (p - 1.0) / (m + p - 1.0);
}

// --- issue 14's interface: one stage's forward/backward order, the balanced split ---

Pipeline pipeline_from_name(const std::string& name) {
  if (name == "simple") return Pipeline::kSimple;
  if (name == "interleaved") return Pipeline::kInterleaved;
  throw ConfigError("smp pipeline: expected \"interleaved\" or \"simple\", got \"" + name + "\"");
}

const char* name(Pipeline p) { return p == Pipeline::kSimple ? "simple" : "interleaved"; }

std::vector<PipelineAction> schedule(Pipeline p, int stage, int stages, int microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1)
    throw UsageError("smp::schedule: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                     " with " + std::to_string(microbatches) + " microbatches");
  const Schedule s = p == Pipeline::kSimple ? gpipe(stages, microbatches) : one_f_one_b(stages, microbatches);
  std::vector<PipelineAction> out;
  for (const Action& a : s.actions[stage])
    out.push_back({a.kind == ActionKind::kForward ? PipelineAction::kForward : PipelineAction::kBackward, a.microbatch});
  return out;
}

int peak_live(const std::vector<PipelineAction>& actions) {
  int live = 0, peak = 0;
  for (const auto& a : actions) {
    live += a.kind == PipelineAction::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

std::vector<int> balance_by_parameters(const std::vector<int64_t>& params, int stages) {
  const int n = static_cast<int>(params.size());
  if (stages < 1 || n < stages)
    throw UsageError("smp::DistributedModel: the model has " + std::to_string(n) + " layers, fewer than the " +
                     std::to_string(stages) +
                     " pipeline stages (partitions); every stage needs at least one layer");
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + params[i];
  // best[k][i]: the smallest possible largest stage of the first i layers in
  // k stages; cut[k][i] the start of the last of them (the earliest on ties).
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (int k = stages, i = n; k > 0; --k) {
    i = cut[k][i];
    bounds[k - 1] = i;
  }
  return bounds;
}

// --- pictures -----------------------------------------------------------------------

namespace {

// The chunk of a stage on its rank (its position among the rank's stages),
// when ranks hold several stages; -1 otherwise.
std::vector<int> chunks(const Schedule& s) {
  const std::vector<int> owner = s.stage_ranks();
  std::vector<int> out(s.stages, -1);
  if (s.stages == s.ranks) return out;
  std::vector<int> count(s.ranks, 0);
  for (int st = 0; st < s.stages; ++st) out[st] = count[owner[st]]++;
  return out;
}

std::string label(const Action& a, const std::vector<int>& chunk) {
  std::string t = std::string(letters(a.kind)) + std::to_string(a.microbatch);
  if (chunk[a.stage] >= 0) t += "." + std::to_string(chunk[a.stage]);
  return t;
}

}  // namespace

std::string timeline_text(const Schedule& s, const Simulation& sim) {
  const std::vector<int> chunk = chunks(s);
  const double cells = std::ceil(sim.makespan - 1e-9) * s.ranks;
  if (!(cells <= kMaxTimelineCells))
    return "(no timeline: " + std::to_string(s.ranks) + " ranks x a makespan of " +
           std::to_string(static_cast<int64_t>(std::ceil(sim.makespan))) + " is above " +
           std::to_string(static_cast<int64_t>(kMaxTimelineCells)) + " cells)\n";
  const int slots = static_cast<int>(std::ceil(sim.makespan - 1e-9));
  size_t width = 2;
  for (const auto& row : sim.timeline)
    for (const auto& t : row) width = std::max(width, label(t.action, chunk).size());
  auto pad = [&](std::string x) {
    x.resize(width, ' ');
    return x;
  };
  std::string out = "t       ";
  for (int t = 0; t < slots; ++t) {
    std::string n = std::to_string(t);
    out += " " + std::string(width > n.size() ? width - n.size() : 0, ' ') + n;
  }
  out += "\n";
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<std::string> cells(slots, pad(std::string(width, '.')));
    for (const auto& t : sim.timeline[r]) {
      const int a = static_cast<int>(std::floor(t.start + 1e-9)), b = static_cast<int>(std::ceil(t.end - 1e-9));
      for (int x = a; x < b && x < slots; ++x) cells[x] = pad(x == a ? label(t.action, chunk) : std::string(width, '~'));
    }
    char head[32];
    std::snprintf(head, sizeof head, "rank %-3d", r);
    out += head;
    for (const auto& c : cells) out += " " + c;
    out += "\n";
  }
  return out;
}

std::string timeline_svg(const Schedule& s, const Simulation& sim) {
  const std::vector<int> chunk = chunks(s);
  size_t boxes = 0;
  for (const auto& r : sim.timeline) boxes += r.size();
  if (boxes > kMaxTimelineBoxes)
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\"><text x=\"10\" y=\"25\">no "
           "timeline: " + std::to_string(boxes) + " actions, above " + std::to_string(kMaxTimelineBoxes) +
           "</text></svg>\n";
  const double unit = 28, row = 26, left = 70, top = 40;
  const double width = left + sim.makespan * unit + 20, height = top + s.ranks * row + 40;
  auto fill = [](K k) {
    switch (k) {
      case K::kForward: return "#6baed6";
      case K::kBackwardInput: return "#fd8d3c";
      case K::kBackwardWeight: return "#74c476";
      default: return "#e6550d";  // full backward
    }
  };
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"monospace\" font-size=\"11\">\n";
  o << "<title>" << s.name << ": " << s.ranks << " ranks, " << s.stages << " stages, " << s.microbatches
    << " microbatches</title>\n";
  char bubble[64];
  std::snprintf(bubble, sizeof bubble, "%.1f %%", 100 * sim.bubble());
  o << "<text x=\"4\" y=\"16\">" << s.name << ", " << s.ranks << " ranks, " << s.stages << " stages, "
    << s.microbatches << " microbatches: makespan " << sim.makespan << " units, bubble " << bubble
    << " (grey: idle)</text>\n";
  for (int r = 0; r < s.ranks; ++r) {
    const double y = top + r * row;
    o << "<text x=\"4\" y=\"" << y + 16 << "\">rank " << r << "</text>\n";
    o << "<rect class=\"idle\" x=\"" << left << "\" y=\"" << y << "\" width=\"" << sim.makespan * unit
      << "\" height=\"" << row - 4 << "\" fill=\"#dddddd\"/>\n";
    for (const auto& t : sim.timeline[r]) {
      o << "<rect class=\"action\" x=\"" << left + t.start * unit << "\" y=\"" << y << "\" width=\""
        << (t.end - t.start) * unit << "\" height=\"" << row - 4 << "\" fill=\"" << fill(t.action.kind)
        << "\" stroke=\"#333333\"><title>" << to_string(t.action) << "</title></rect>\n";
      o << "<text x=\"" << left + t.start * unit + 2 << "\" y=\"" << y + 15 << "\">" << label(t.action, chunk)
        << "</text>\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace partita::smp
