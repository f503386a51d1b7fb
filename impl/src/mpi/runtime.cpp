#include "partita/mpi/runtime.hpp"
#include "partita/mpi/buffer_cache.hpp"
#include "env_number.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "partita/errors.hpp"
#include "partita/mpi/poll.hpp"
#include "partita/mpi/progress.hpp"
#include "peer_check.hpp"

namespace partita::mpi {

namespace {
MPI_Comm g_world = MPI_COMM_NULL;
int g_rank = 0;
int g_size = 1;
WaitPolicy g_policy = WaitPolicy::Yield;
double g_timeout = 0;  // seconds; 0 = no watchdog
double g_deadline = 0;  // seconds; 0 = no deadline
long g_deadline_misses = 0;
const std::function<void()>* g_interrupt = nullptr;  // ScopedWaitInterrupt
int g_interrupt_scopes = 0;  // alive, including ScopedWaitInterrupt(nullptr)
// Blocking calls (blocking_waits()): agreed by every rank at start-up, so
// that no collective is blocking on one rank and non-blocking on another
// (MPI does not match the two forms).
bool g_blocking = false;

WaitPolicy policy_from_environment() {
  const char* env = std::getenv("PARTITA_WAIT");
  const std::string v = env ? env : "auto";
  if (v == "spin") return WaitPolicy::Spin;
  if (v == "yield") return WaitPolicy::Yield;
  if (v != "auto")
    std::cerr << "partita: PARTITA_WAIT='" << v
              << "' is not spin, yield or auto; using auto\n";
  int local = g_size;
  if (const char* n = std::getenv("MPI_LOCALNRANKS")) local = std::atoi(n);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return local > static_cast<int>(cores) ? WaitPolicy::Yield : WaitPolicy::Spin;
}

void print_watchdog(const char* what, double waited) {
  std::fprintf(stderr,
               "partita: rank %d waited %.1f s (PARTITA_WAIT_TIMEOUT) in %s; "
               "aborting the job instead of hanging\n",
               g_rank, waited, what);
  std::fflush(stderr);
}

[[noreturn]] void watchdog_fired(const char* what, double waited) {
  print_watchdog(what, waited);
  // MPICH's launcher can end the job on MPI_Abort before it has forwarded
  // the line just written (death_stuck_polling lost it in 3 of 30 runs):
  // give it a moment to.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

// The watchdog of blocking calls: WatchedCall publishes a number per call
// (0: none running) and its name; a thread of its own samples them, and a
// call still running with the same number after g_timeout seconds ends
// the process. The thread starts with the first watched call.
//
// It also watches the thread between partita's waits while a
// ScopedProgressWatch is alive (progress_on): every wait bumps `progress`
// when it starts and when it ends and counts itself in `in_wait`; a thread
// outside every wait whose `progress` stays the same for g_timeout seconds
// is stuck where partita cannot see it (a raw MPI call, a loop).
struct Watchdog {
  std::atomic<uint64_t> call{0};
  std::atomic<const char*> what{nullptr};
  std::atomic<bool> progress_on{false};
  std::atomic<uint64_t> progress{0};
  std::atomic<int> in_wait{0};
  char progress_what[256] = "";  // written before progress_on is set
  uint64_t calls = 0;  // numbers handed out (the calling thread only)
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;

  void run() {
    using clock = std::chrono::steady_clock;
    const auto tick = std::chrono::duration<double>(std::clamp(g_timeout / 20, 0.01, 0.5));
    uint64_t seen = 0, seen_progress = 0;
    clock::time_point since = clock::now(), progress_since = since;
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, tick, [this] { return stop; })) {
      check_progress(seen_progress, progress_since);
      const uint64_t now = call.load(std::memory_order_acquire);
      if (now == 0 || now != seen) {
        seen = now;
        since = clock::now();
        continue;
      }
      const double waited = std::chrono::duration<double>(clock::now() - since).count();
      if (waited <= g_timeout) continue;
      // The name is copied, then the call checked to be still the same:
      // the string it points to lives as long as the call.
      char name[256] = "a blocking MPI call";
      if (const char* n = what.load(std::memory_order_acquire)) std::snprintf(name, sizeof name, "%s", n);
      if (call.load(std::memory_order_acquire) != seen) continue;  // it just ended
      // No MPI call from this thread (MPI_THREAD_SERIALIZED, and the
      // watched thread is inside MPI): the process ends by a signal, which
      // MPICH's launcher answers by ending the job.
      print_watchdog(name, waited);
      std::abort();
    }
  }
  // The watch between waits (see above), from the watchdog's thread.
  void check_progress(uint64_t& seen, std::chrono::steady_clock::time_point& since) {
    const auto now = std::chrono::steady_clock::now();
    const uint64_t p = progress.load(std::memory_order_acquire);
    if (!progress_on.load(std::memory_order_acquire) || p != seen ||
        in_wait.load(std::memory_order_acquire) > 0 || call.load(std::memory_order_acquire) != 0) {
      seen = p;
      since = now;
      return;
    }
    const double idle = std::chrono::duration<double>(now - since).count();
    if (idle <= g_timeout) return;
    std::fprintf(stderr,
                 "partita: rank %d made no progress for %.1f s (PARTITA_WAIT_TIMEOUT) in %s, outside "
                 "partita's waits (a raw MPI call or a loop of its own); aborting the job instead of hanging\n",
                 g_rank, idle, progress_what);
    std::fflush(stderr);
    std::abort();  // no MPI call from this thread, as above
  }
  // Counts one partita wait while the watch between waits is on.
  struct InWait {
    explicit InWait(Watchdog& w) : w_(w), on_(w.progress_on.load(std::memory_order_relaxed)) {
      if (!on_) return;
      w_.in_wait.fetch_add(1, std::memory_order_release);
      w_.progress.fetch_add(1, std::memory_order_release);
    }
    ~InWait() {
      if (!on_) return;
      w_.progress.fetch_add(1, std::memory_order_release);
      w_.in_wait.fetch_sub(1, std::memory_order_release);
    }
    Watchdog& w_;
    bool on_;
  };
  void start() {
    if (thread.joinable()) return;
    stop = false;  // (after a finish(): another Environment in this process)
    thread = std::thread([this] { run(); });
  }
  ~Watchdog() { finish(); }  // (a process that never destroyed its Environment)
  void finish() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
};
Watchdog g_watchdog;

bool blocking_from_environment() {
  const char* env = std::getenv("PARTITA_BLOCKING");
  return !(env && std::string(env) == "0");
}
}  // namespace

Environment::Environment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    PARTITA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    owns_mpi_ = true;
  }
  // Errors come back as codes and become exceptions instead of aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  PARTITA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_world));
  MPI_Comm_set_errhandler(g_world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_world, &g_rank);
  MPI_Comm_size(g_world, &g_size);
  g_policy = policy_from_environment();
  g_timeout = detail::number_from_environment("PARTITA_WAIT_TIMEOUT", g_timeout);
  if (const double d = detail::number_from_environment("PARTITA_DEADLINE", -1); d >= 0) g_deadline = scaled_for_ranks(d);
  buffer_cache_from_environment();
  // Blocking calls where every rank may use them (an MPI_Allreduce of
  // start-up, before any partita traffic).
  int mine = blocking_from_environment() && g_policy == WaitPolicy::Spin && g_deadline == 0, all = 0;
  PARTITA_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, g_world));
  g_blocking = all != 0;
  detail::peer_check_start(g_world);
}

Environment::~Environment() {
  // The other nodes' ranks hear that this one ends, and it answers their
  // probes until MPI_Finalize returns: a rank that finished early is not
  // taken for a lost one, and a node lost while this rank is inside
  // MPI_Finalize is still found (docs/mpi-runtime.md, "A lost node").
  detail::peer_check_finishing();
  g_watchdog.finish();
  if (g_world != MPI_COMM_NULL) MPI_Comm_free(&g_world);
  if (owns_mpi_) {
    detail::peer_wait_begin("MPI_Finalize");
    MPI_Finalize();
    detail::peer_wait_end();
  }
  detail::peer_check_stop();
}

MPI_Comm world_comm() {
  if (g_world == MPI_COMM_NULL)
    throw Error("partita: MPI is not initialised; create a partita::mpi::Environment");
  return g_world;
}
int world_rank() { return g_rank; }
int world_size() { return g_size; }
WaitPolicy wait_policy() { return g_policy; }
void set_wait_policy(WaitPolicy policy) { g_policy = policy; }
bool blocking_waits() {
  return g_blocking && g_policy == WaitPolicy::Spin && g_deadline == 0 && g_interrupt_scopes == 0;
}

WatchedCall::WatchedCall(const char* what) : on_(g_timeout > 0) {
  if (detail::g_peer_check_on) detail::peer_wait_begin(what);
  if (!on_) return;
  g_watchdog.start();
  g_watchdog.progress.fetch_add(1, std::memory_order_release);
  g_watchdog.what.store(what, std::memory_order_release);
  g_watchdog.call.store(++g_watchdog.calls, std::memory_order_release);
}
WatchedCall::~WatchedCall() {
  if (detail::g_peer_check_on) detail::peer_wait_end();
  if (!on_) return;
  g_watchdog.progress.fetch_add(1, std::memory_order_release);
  g_watchdog.call.store(0, std::memory_order_release);
}

ScopedProgressWatch::ScopedProgressWatch(const std::string& what) : on_(g_timeout > 0) {
  if (!on_) return;
  std::snprintf(g_watchdog.progress_what, sizeof g_watchdog.progress_what, "%s", what.c_str());
  g_watchdog.progress.fetch_add(1, std::memory_order_release);
  g_watchdog.progress_on.store(true, std::memory_order_release);
  g_watchdog.start();
}
ScopedProgressWatch::~ScopedProgressWatch() {
  if (on_) g_watchdog.progress_on.store(false, std::memory_order_release);
}
const char* wait_policy_name(WaitPolicy policy) {
  return policy == WaitPolicy::Spin ? "spin" : "yield";
}

void set_deadline(double seconds) { g_deadline = seconds; }
double scaled_for_ranks(double seconds) {
  int local = g_size;
  if (const char* n = std::getenv("MPI_LOCALNRANKS")) local = std::atoi(n);
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  return seconds * std::max(1.0, local / cores);
}
double deadline() { return g_deadline; }
long deadline_misses() { return g_deadline_misses; }

void renew_world() {
  MPI_Comm fresh = MPI_COMM_NULL;
  const WatchedCall watched("renew_world (MPI_Comm_dup of MPI_COMM_WORLD)");
  PARTITA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &fresh));
  MPI_Comm_set_errhandler(fresh, MPI_ERRORS_RETURN);
  g_world = fresh;  // the old one is abandoned, not freed: see the header
}

namespace {
// The one waiting loop: test, and under the yield policy give the core away
// between tests; the deadline and the watchdog check the clock every 1024
// polls. `counts` says whether a missed deadline abandons operations (and so
// is counted in deadline_misses()).
//
// A yielding rank still takes a good share of a core that a computing rank
// shares with it (each yield returns as soon as the scheduler comes round),
// so under the yield policy a wait that outlasts kYieldsBeforeNap tests,
// one that waits for a neighbour's computation rather than for a message in
// flight, sleeps between tests instead: 20 us, doubling to 200 us.
constexpr unsigned kYieldsBeforeNap = 64;
constexpr long kFirstNapNs = 20000, kLongestNapNs = 200000;

// Tells the peer check (peer_check.hpp) that a wait is running.
struct PeerWait {
  explicit PeerWait(const char* what) : on_(detail::g_peer_check_on) {
    if (on_) detail::peer_wait_begin(what);
  }
  ~PeerWait() {
    if (on_) detail::peer_wait_end();
  }
  bool on_;
};

template <typename Test>
void poll_until(Test&& done, const char* what, bool counts) {
  const Watchdog::InWait counted(g_watchdog);
  const PeerWait peer(what);
  const auto start = std::chrono::steady_clock::now();
  unsigned polls = 0;
  long nap_ns = kFirstNapNs;
  for (;;) {
    if (done()) return;
    if (g_policy == WaitPolicy::Yield) {
      if (polls < kYieldsBeforeNap) {
        sched_yield();
      } else {
        const timespec t{0, nap_ns};
        nanosleep(&t, nullptr);
        nap_ns = std::min(nap_ns * 2, kLongestNapNs);
      }
    }
    ++polls;
    if (g_interrupt && (polls & 15u) == 0) (*g_interrupt)();
    if ((g_timeout > 0 || g_deadline > 0) && (polls & 1023u) == 0) {
      const double waited = std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - start).count();
      if (g_deadline > 0 && waited > g_deadline) {
        // The requests are abandoned, not cancelled (MPI forbids cancelling
        // a collective): they stay on the communicator renew_world()
        // retires, where nothing new is posted that could match them.
        if (counts) ++g_deadline_misses;
        char text[160];
        std::snprintf(text, sizeof text, "%.1f s (PARTITA_DEADLINE)", g_deadline);
        throw DeadlineError("partita: rank " + std::to_string(g_rank) + ": " + what +
                            " did not finish within " + text +
                            ": the ranks disagree about it or one of them is stuck");
      }
      if (g_timeout > 0 && waited > g_timeout) watchdog_fired(what, waited);
    }
  }
}

void poll(int n, MPI_Request* requests, const char* what) {
  poll_until(
      [&] {
        int done = 0;
        PARTITA_MPI_CHECK(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      what, true);
}
}  // namespace

ScopedWaitInterrupt::ScopedWaitInterrupt(const std::function<void()>* check) : previous_(g_interrupt) {
  g_interrupt = check;
  ++g_interrupt_scopes;
}
ScopedWaitInterrupt::~ScopedWaitInterrupt() {
  g_interrupt = previous_;
  --g_interrupt_scopes;
}

void wait_until(const std::function<bool()>& ready, const char* what, bool abandons) {
  poll_until(ready, what, abandons);
}

void wait_all(int count, MPI_Request* requests, const char* what) {
  if (count <= 0) return;
  if (blocking_waits()) {
    const WatchedCall watched(what);
    PARTITA_MPI_CHECK(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE));
    return;
  }
  poll(count, requests, what);
}
void wait_all(std::vector<MPI_Request>& requests, const char* what) {
  wait_all(static_cast<int>(requests.size()), requests.data(), what);
}

void wait_all(int count, MPI_Request* requests, const char* what, const Abandon& abandon) {
  try {
    wait_all(count, requests, what);
  } catch (...) {
    abandon();
    throw;
  }
}
void wait_all(std::vector<MPI_Request>& requests, const char* what, const Abandon& abandon) {
  wait_all(static_cast<int>(requests.size()), requests.data(), what, abandon);
}

void wait(MPI_Request& request, const char* what) { wait_all(1, &request, what); }

int64_t wait_received(MPI_Request& request, MPI_Datatype type, const char* what) {
  MPI_Status status;
  bool truncated = false;
  // A receive that ended truncated is complete (MPI freed its request);
  // any other error raises.
  auto finished = [&](int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(code, &cls);
    if (cls != MPI_ERR_TRUNCATE) check(code, call, __FILE__, __LINE__);
    truncated = true;
  };
  if (blocking_waits()) {
    const WatchedCall watched(what);
    finished(MPI_Wait(&request, &status), "MPI_Wait(&request, &status)");
  } else {
    poll_until(
        [&] {
          int done = 0;
          const int code = MPI_Test(&request, &done, &status);
          finished(code, "MPI_Test(&request, &done, &status)");
          return code != MPI_SUCCESS || done != 0;
        },
        what, true);
  }
  if (truncated) return -1;
  int count = 0;
  PARTITA_MPI_CHECK(MPI_Get_count(&status, type, &count));
  return count == MPI_UNDEFINED ? -1 : count;
}

void check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw MpiError(std::string("MPI error ") + std::to_string(code) + " in " + call +
                     " at " + file + ":" + std::to_string(line) + ": " + text,
                 code);
}

std::vector<std::string> allgather_strings(const std::string& mine, MPI_Comm comm,
                                           const std::function<void(MPI_Request&)>& waiter) {
  // The buffers live on the heap: a wait given up at a deadline leaves the
  // operation posted, and MPI may still write them when a late peer joins,
  // so they are then kept for the life of the process, never freed.
  struct Buffers {
    std::string mine, all;
    int len = 0;
    std::vector<int> lens, offsets;
  };
  auto b = std::make_shared<Buffers>();
  auto finish = [&](MPI_Request& r) {
    try {
      waiter ? waiter(r) : wait(r, "allgather_strings");
    } catch (...) {
      keep_forever(b);
      throw;
    }
  };
  int n = 0;
  MPI_Comm_size(comm, &n);
  b->mine = mine;
  b->len = static_cast<int>(mine.size());
  b->lens.assign(n, 0);
  b->offsets.assign(n, 0);
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallgather(&b->len, 1, MPI_INT, b->lens.data(), 1, MPI_INT, comm, &req));
  finish(req);
  for (int r = 1; r < n; ++r) b->offsets[r] = b->offsets[r - 1] + b->lens[r - 1];
  b->all.assign(static_cast<size_t>(b->offsets[n - 1] + b->lens[n - 1]), '\0');
  PARTITA_MPI_CHECK(MPI_Iallgatherv(b->mine.data(), b->len, MPI_CHAR, b->all.data(), b->lens.data(),
                                    b->offsets.data(), MPI_CHAR, comm, &req));
  finish(req);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(b->all.substr(b->offsets[r], b->lens[r]));
  return out;
}

bool all_true(bool local, MPI_Comm comm) {
  // On the heap: kept when the wait gives the operation up (keep_forever).
  auto in_out = std::make_unique<std::array<int, 2>>(std::array<int, 2>{local ? 1 : 0, 0});
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(&(*in_out)[0], &(*in_out)[1], 1, MPI_INT, MPI_LAND, comm, &req));
  try {
    wait(req, "all_true");
  } catch (...) {
    keep_forever(std::move(in_out));
    throw;
  }
  return (*in_out)[1] != 0;
}

namespace {
std::mutex g_kept_mutex;
std::vector<std::shared_ptr<const void>>& kept() {
  static auto* v = new std::vector<std::shared_ptr<const void>>();  // never destroyed
  return *v;
}
}  // namespace

void keep_forever_ptr(std::shared_ptr<const void> buffers) {
  const std::lock_guard<std::mutex> lock(g_kept_mutex);
  kept().push_back(std::move(buffers));
}

long kept_forever() {
  const std::lock_guard<std::mutex> lock(g_kept_mutex);
  return static_cast<long>(kept().size());
}

}  // namespace partita::mpi
