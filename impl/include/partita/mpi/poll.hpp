// Waiting for a condition that is not an MPI request (a probe for a message
// of unknown size, say) under the same policy as partita::mpi::wait: test,
// yield the core between tests when ranks outnumber cores, the deadline
// (DeadlineError) and the watchdog (docs/mpi-runtime.md).
#pragma once

#include <functional>

namespace partita::mpi {

// Calls `ready` until it returns true. A missed deadline throws
// partita::DeadlineError. `abandons`: whether giving up leaves state that
// only renew_world() clears (the header board's exchanges: this rank's
// header stays posted on the communicator's board); such a miss counts in
// deadline_misses(), as an abandoned MPI request does. A probe abandons
// nothing: not counted, no renew_world() needed.
void wait_until(const std::function<bool()>& ready, const char* what, bool abandons = false);

// While one is alive, every partita wait on this process (wait, wait_all,
// wait_until) also calls `check` every 16 tests; `check` may throw to end
// the wait. What the wait was finishing is abandoned, as at a deadline (the
// caller keeps its buffers alive). The pipeline's step uses it to hear that
// another stage failed (docs/pipeline.md). Scopes nest; the innermost wins.
// ScopedWaitInterrupt(nullptr) turns checking off for its scope.
class ScopedWaitInterrupt {
 public:
  explicit ScopedWaitInterrupt(const std::function<void()>* check);
  ~ScopedWaitInterrupt();
  ScopedWaitInterrupt(const ScopedWaitInterrupt&) = delete;
  ScopedWaitInterrupt& operator=(const ScopedWaitInterrupt&) = delete;

 private:
  const std::function<void()>* previous_;
};

}  // namespace partita::mpi
