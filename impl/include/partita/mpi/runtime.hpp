// The MPI runtime of partita: start-up, partita's private world
// communicator, MPI error checking, and the one waiting policy every
// blocking point goes through.
//
// Why a waiting policy: MPICH's blocking waits spin. With more ranks than
// cores (every test run on a 2-core machine) a spinning rank steals the core
// the rank it waits for needs, and a one-float allreduce goes from 1 us to
// 60 ms at 12 ranks. partita therefore starts operations non-blocking and
// finishes them with MPI_Test in a loop that yields the core between tests
// when ranks outnumber cores (docs/design.md, "The waiting policy", has the measured figures), or when
// a deadline or a wait interrupt needs its own loop; under the spin policy
// otherwise it runs the blocking forms, which MPICH runs faster
// (blocking_waits(), call(); docs/mpi-runtime.md, "Blocking calls").
#pragma once

#include <memory>
#include <tuple>
#include <type_traits>

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace partita::mpi {

enum class WaitPolicy { Spin, Yield };

// Initialises MPI (if the caller has not) and partita's state; finalizes on
// destruction if it initialised MPI. One per process, in main().
class Environment {
 public:
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  bool owns_mpi_ = false;
};

// partita's duplicate of MPI_COMM_WORLD: partita's traffic never matches a
// user's messages on MPI_COMM_WORLD.
MPI_Comm world_comm();
int world_rank();
int world_size();

// PARTITA_WAIT=spin|yield|auto (default auto: yield when the ranks on this
// node, MPI_LOCALNRANKS from the launcher, outnumber its cores).
WaitPolicy wait_policy();
void set_wait_policy(WaitPolicy policy);
const char* wait_policy_name(WaitPolicy policy);

// Finish requests under the waiting policy. `what` names the operation.
//
// Deadline mode (docs/mpi-runtime.md): when a deadline is set, a
// wait that has not finished after that many seconds throws
// partita::DeadlineError naming the operation, and the requests are
// abandoned: the case fails, not the job. PARTITA_DEADLINE=S sets it at
// start-up to S seconds times max(1, ranks on this node / cores), since
// oversubscribed ranks are that much slower.
//
// The watchdog is the last resort: when PARTITA_WAIT_TIMEOUT (seconds,
// default none) passes, the rank prints what it was waiting for and aborts
// the job instead of hanging.
void wait(MPI_Request& request, const char* what);
// Finishes one receive, as wait(), and returns how many elements of `type`
// arrived; -1 when the message was larger than the receive's buffer (MPI
// truncated it, MPI_ERR_TRUNCATE; the message is consumed all the same) and
// when its bytes are not a whole number of `type`s. The caller names the
// mismatch; any other MPI error throws as wait() does.
int64_t wait_received(MPI_Request& request, MPI_Datatype type, const char* what);
void wait_all(std::vector<MPI_Request>& requests, const char* what);
void wait_all(int count, MPI_Request* requests, const char* what);

// Whether an MPI blocking call waits as partita's own loop would: under the
// spin policy with no deadline and no ScopedWaitInterrupt alive, not even
// one of nullptr (the watchdog, when set, watches blocking calls from a
// thread of its own).
// Then wait()/wait_all() finish requests with MPI_Wait/MPI_Waitall, and
// call() runs an operation's blocking form.
bool blocking_waits();

// While alive, the watchdog (PARTITA_WAIT_TIMEOUT) times this thread's
// blocking MPI call: if it lasts longer, a thread of the watchdog's prints
// `partita: rank R waited S s (PARTITA_WAIT_TIMEOUT) in WHAT; aborting the
// job instead of hanging` and aborts the process (no MPI call from that
// thread: MPI is initialised MPI_THREAD_SERIALIZED), and the launcher ends
// the job. Costs two atomic stores; nothing when no watchdog is set.
class WatchedCall {
 public:
  explicit WatchedCall(const char* what);
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  bool on_;
};

// What an operation a wait gave up on (a missed deadline, an interrupt)
// may still read or write: MPI forbids touching it until the operation
// finishes, which may be never. keep_forever() holds it for the rest of
// the process; a thread-local vector handed over by std::move keeps its
// memory there, and the next call allocates its own.
void keep_forever_ptr(std::shared_ptr<const void> buffers);
template <typename... T>
void keep_forever(T&&... buffers) {
  keep_forever_ptr(std::make_shared<const std::tuple<std::decay_t<T>...>>(std::forward<T>(buffers)...));
}
// How many sets of buffers keep_forever() holds.
long kept_forever();
// wait() for an operation whose buffers all live in `held` (on the heap:
// not on the stack, not in a moved string's inline bytes): where the wait
// gives the operation up, `held` is kept for the rest of the process.
template <typename T>
void wait_holding(MPI_Request& request, const char* what, const std::shared_ptr<T>& held) {
  try {
    wait(request, what);
  } catch (...) {
    keep_forever_ptr(held);
    throw;
  }
}

// A reference to a callable run when call()'s wait gives its operation up
// (it hands the operation's buffers to keep_forever); no allocation.
class Abandon {
 public:
  Abandon() = default;
  template <typename F>
  Abandon(F& f) : context_(&f), run_([](void* c) { (*static_cast<F*>(c))(); }) {}  // NOLINT: implicit
  void operator()() const {
    if (run_) run_(context_);
  }

 private:
  void* context_ = nullptr;
  void (*run_)(void*) = nullptr;
};

// wait_all(), and where the wait gives the requests up (a missed deadline,
// an interrupt, an MPI error) `abandon` runs before the error propagates:
// it keeps what the requests may still read or write (keep_forever).
void wait_all(int count, MPI_Request* requests, const char* what, const Abandon& abandon);
void wait_all(std::vector<MPI_Request>& requests, const char* what, const Abandon& abandon);

// One MPI operation under the waiting policy: its blocking form
// (`blocking()`, under the watchdog) where blocking_waits(), else its
// non-blocking form (`post(&request)`) finished by wait(). Both must be
// the same operation on the same buffers. For a collective, every rank of
// the communicator must make the same choice (MPI matches no blocking
// collective with a non-blocking one): blocking_waits() is agreed at
// start-up, and what turns it off later (a deadline, the yield policy, a
// ScopedWaitInterrupt) must be set on every rank alike. Why: MPICH runs
// its blocking collectives faster than the non-blocking ones, and by how
// much depends on the host (docs/mpi-runtime.md, "Blocking calls").
// `abandon` runs where the wait gives the posted operation up, before the
// error propagates: it keeps the operation's buffers (keep_forever).
template <typename Blocking, typename Post>
void call(const char* what, Blocking&& blocking, Post&& post, const Abandon& abandon) {
  if (blocking_waits()) {
    const WatchedCall watched(what);
    blocking();
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  post(&request);
  try {
    wait(request, what);
  } catch (...) {
    abandon();
    throw;
  }
}

void set_deadline(double seconds);  // 0: off
// `seconds` times max(1, ranks on this node / cores): what PARTITA_DEADLINE
// is scaled by, for callers that choose their own default.
double scaled_for_ranks(double seconds);
double deadline();
// How many waits have missed their deadline since the process started; the
// harness compares it before and after a case.
long deadline_misses();

// After a missed deadline the abandoned operations still sit on partita's
// world communicator, where they could match a later operation. Collective
// over MPI_COMM_WORLD: every rank replaces partita's world communicator by a
// fresh duplicate (the old one is left alone, not freed, since operations on
// it never finish). Partitions made before keep their old communicators.
void renew_world();

// The debug setting of static shapes (docs/static-shapes.md):
// PARTITA_CHECK_STATIC_SHAPES=1 at start-up, or set_check_static_shapes(true),
// makes every call of a layer or call site with static shapes exchange and
// compare every rank's shapes with its first call's, so that a broken
// promise raises ShapeError on every rank. Off by default. Must be the same
// on every rank of a call.
bool check_static_shapes();
void set_check_static_shapes(bool on);

// Throws partita::MpiError naming the call, the file and line, and MPI's text.
void check(int code, const char* call, const char* file, int line);

// Every rank's `mine`, in rank order, on every rank of `comm` (failure
// reports). `waiter` finishes each request (default: wait()).
std::vector<std::string> allgather_strings(const std::string& mine, MPI_Comm comm,
                                           const std::function<void(MPI_Request&)>& waiter = {});

// A logical AND of `local` over `comm`, under the waiting policy. Used to
// agree on verdicts so that every rank takes the same branch.
bool all_true(bool local, MPI_Comm comm);

}  // namespace partita::mpi

#define PARTITA_MPI_CHECK(call) ::partita::mpi::check((call), #call, __FILE__, __LINE__)
