#include "peer_check.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

bool g_peer_check_on = false;

namespace {

constexpr double kDefaultCheckAfter = 10.0;  // seconds of waiting before a probe
constexpr double kLostAfter = 5.0;           // seconds without an answer: lost
constexpr double kResend = 0.5;              // seconds between probes of a silent rank
constexpr int kTickMs = 100;
constexpr int kMaxAddrs = 8;
constexpr int kLostExitStatus = 69;  // EX_UNAVAILABLE
constexpr uint32_t kMagic = 0x50504348;  // "PPCH"

// What every rank tells the others at start-up.
struct PeerRecord {
  char host[64];
  uint32_t addrs[kMaxAddrs];  // IPv4, network order
  int32_t n_addrs;
  int32_t port;  // network order
  int32_t pid;
  double wants;  // PARTITA_PEER_CHECK: seconds, 0 off, -1 automatic
  uint64_t nonce;
};

struct PeerDatagram {
  uint32_t magic;
  uint32_t kind;  // 0 probe, 1 answer, 2 finished (the sender ends; never lost)
  uint64_t nonce;
  int32_t from;
  int32_t to;
  uint64_t round;
};

using PeerClock = std::chrono::steady_clock;
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(PeerClock::now().time_since_epoch()).count();
}

struct PeerCheck {
  int fd = -1;
  int rank = 0;
  double check_after = kDefaultCheckAfter;
  uint64_t nonce = 0;
  std::vector<PeerRecord> records;
  std::vector<int> remote;  // ranks on other hosts
  std::vector<char> finished;  // ranks that said they end (kind 2): not probed
  std::atomic<bool> stop{false};
  std::thread thread;
  // The wait this thread watches: when it began (0: none), its name, and
  // how deeply waits are nested.
  std::atomic<int64_t> since{0};
  std::atomic<const char*> what{nullptr};
  std::atomic<int> depth{0};

  void send(int to, uint32_t kind, uint64_t round, const sockaddr_in* where = nullptr) {
    const PeerDatagram d{kMagic, kind, nonce, rank, to, round};
    if (where) {
      (void)sendto(fd, &d, sizeof d, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(where), sizeof *where);
      return;
    }
    const PeerRecord& r = records[to];
    for (int i = 0; i < r.n_addrs; ++i) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = static_cast<in_port_t>(r.port);
      a.sin_addr.s_addr = r.addrs[i];
      (void)sendto(fd, &d, sizeof d, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
  }

  // Answers probes; records answers to the current round.
  void drain(uint64_t round, std::vector<char>& answered) {
    for (;;) {
      PeerDatagram d{};
      sockaddr_in src{};
      socklen_t len = sizeof src;
      const ssize_t n = recvfrom(fd, &d, sizeof d, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&src), &len);
      if (n < 0) return;
      if (n != sizeof d || d.magic != kMagic || d.nonce != nonce || d.to != rank || d.from < 0 ||
          d.from >= static_cast<int>(records.size()))
        continue;
      if (d.kind == 0) send(d.from, 1, d.round, &src);
      else if (d.kind == 2) finished[d.from] = 1;
      else if (d.round == round) answered[d.from] = 1;
    }
  }

  [[noreturn]] void lost(const std::vector<int>& silent, double waited, const char* name) {
    // Grouped by node: "world rank 1 (pid 12) on node1; world ranks 2, 3 (pids 13, 14) on node2".
    std::map<std::string, std::vector<int>> by_host;
    for (int r : silent) by_host[records[r].host].push_back(r);
    std::string who;
    for (const auto& [host, ranks] : by_host) {
      std::string rs, pids;
      for (size_t i = 0; i < ranks.size(); ++i) {
        rs += (i ? ", " : "") + std::to_string(ranks[i]);
        pids += (i ? ", " : "") + std::to_string(records[ranks[i]].pid);
      }
      if (!who.empty()) who += "; ";
      who += (ranks.size() == 1 ? "world rank " : "world ranks ") + rs + (ranks.size() == 1 ? " (pid " : " (pids ") +
             pids + ") on node " + host;
    }
    std::fprintf(stderr,
                 "partita: rank %d on node %s waited %.1f s in %s and lost contact with %s: no answer to "
                 "probes for %.1f s (PARTITA_PEER_CHECK); that node is down or cut off from this one; this rank "
                 "ends (exit status %d) instead of hanging\n",
                 rank, records[rank].host, waited, name, who.c_str(), kLostAfter, kLostExitStatus);
    std::fflush(stderr);
    // No MPI from this thread (MPI_THREAD_SERIALIZED; the waiting thread is
    // inside MPI): the process ends, and MPI's launcher sees it go.
    std::_Exit(kLostExitStatus);
  }

  void run() {
    std::vector<char> answered(records.size(), 0);
    uint64_t round = 0;
    int64_t watched = 0;  // the `since` of the wait being watched
    double next_probe = check_after;
    bool probing = false;
    double probe_began = 0, last_sent = 0;
    while (!stop.load(std::memory_order_acquire)) {
      pollfd p{fd, POLLIN, 0};
      (void)::poll(&p, 1, kTickMs);
      drain(round, answered);
      const int64_t s = since.load(std::memory_order_acquire);
      if (s != watched) {  // another wait (or none)
        watched = s;
        probing = false;
        next_probe = check_after;
      }
      if (s == 0) continue;
      const double waited = (now_ns() - s) * 1e-9;
      if (!probing) {
        if (waited < next_probe) continue;
        probing = true;
        ++round;
        std::fill(answered.begin(), answered.end(), 0);
        probe_began = last_sent = waited;
        for (int r : remote)
          if (!finished[r]) send(r, 0, round);
        continue;
      }
      std::vector<int> silent;
      for (int r : remote)
        if (!answered[r] && !finished[r]) silent.push_back(r);
      if (silent.empty()) {  // every node is there: a slow peer, not a lost one
        probing = false;
        next_probe = waited + check_after;
      } else if (waited - probe_began >= kLostAfter) {
        char name[256] = "a wait";
        if (const char* n = what.load(std::memory_order_acquire)) std::snprintf(name, sizeof name, "%s", n);
        if (since.load(std::memory_order_acquire) != s) continue;  // it just ended
        lost(silent, waited, name);
      } else if (waited - last_sent >= kResend) {
        last_sent = waited;
        for (int r : silent) send(r, 0, round);
      }
    }
  }
};

PeerCheck* g_check = nullptr;

double wanted_from_environment() {
  const char* env = std::getenv("PARTITA_PEER_CHECK");
  if (!env || !*env) return -1;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end || v < 0) {
    std::fprintf(stderr, "partita: PARTITA_PEER_CHECK='%s' is not a number of seconds; using the default\n", env);
    return -1;
  }
  return v;
}

// This host's IPv4 addresses a peer may reach: every interface that is up
// but the loopback; the loopback alone where there is nothing else.
void own_addresses(PeerRecord& r) {
  r.n_addrs = 0;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i && r.n_addrs < kMaxAddrs; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      r.addrs[r.n_addrs++] = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(list);
  }
  if (r.n_addrs == 0) r.addrs[r.n_addrs++] = htonl(INADDR_LOOPBACK);
}

}  // namespace

void peer_check_start(MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  PeerRecord mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  mine.pid = static_cast<int32_t>(getpid());
  mine.wants = wanted_from_environment();
  mine.nonce = std::random_device{}() * 0x100000001ull ^ static_cast<uint64_t>(now_ns());
  int fd = -1;
  if (mine.wants != 0 && size > 1) {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      mine.port = a.sin_port;
      own_addresses(mine);
    } else {
      if (fd >= 0) close(fd);
      fd = -1;
      mine.wants = 0;  // no socket: the check is off everywhere
    }
  }
  std::vector<PeerRecord> all(size);
  {  // (ended before the check starts: its waits count from then on)
    const WatchedCall watched("start-up (MPI_Allgather of the peer check's addresses)");
    PARTITA_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, world));
  }
  // On where every rank allows it and the world spans hosts (or every rank
  // asks for it); the longest wait asked for.
  bool allowed = true, asked = true, spans = false;
  double after = 0;
  for (const PeerRecord& r : all) {
    allowed = allowed && r.wants != 0;
    asked = asked && r.wants > 0;
    spans = spans || std::strncmp(r.host, all[0].host, sizeof r.host) != 0;
    after = std::max(after, r.wants > 0 ? r.wants : kDefaultCheckAfter);
  }
  if (!allowed || size < 2 || !(spans || asked)) {
    if (fd >= 0) close(fd);
    return;
  }
  auto* c = new PeerCheck;
  c->fd = fd;
  c->rank = rank;
  c->check_after = after;
  c->nonce = all[0].nonce;
  c->records = std::move(all);
  c->finished.assign(c->records.size(), 0);
  for (int r = 0; r < size; ++r)
    if (r != rank && (asked || std::strncmp(c->records[r].host, mine.host, sizeof mine.host) != 0))
      c->remote.push_back(r);
  g_check = c;
  g_peer_check_on = true;
  c->thread = std::thread([c] { c->run(); });
}

void peer_check_finishing() {
  PeerCheck* c = g_check;
  if (!c) return;
  // Three times, a datagram being able to get lost; the answering thread
  // runs on until peer_check_stop.
  for (int k = 0; k < 3; ++k)
    for (int r : c->remote) c->send(r, 2, 0);
}

void peer_check_stop() {
  if (!g_check) return;
  g_peer_check_on = false;
  g_check->stop.store(true, std::memory_order_release);
  g_check->thread.join();
  close(g_check->fd);
  delete g_check;
  g_check = nullptr;
}

void peer_wait_begin(const char* what) {
  PeerCheck* c = g_check;
  if (!c || c->depth.fetch_add(1, std::memory_order_acq_rel) != 0) return;
  c->what.store(what, std::memory_order_release);
  c->since.store(now_ns(), std::memory_order_release);
}

void peer_wait_end() {
  PeerCheck* c = g_check;
  if (!c || c->depth.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  c->since.store(0, std::memory_order_release);
}

}  // namespace partita::mpi::detail
