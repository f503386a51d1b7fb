// The watchdog between partita's waits (docs/mpi-runtime.md, "The
// watchdog"): for code that may wait where partita cannot see it, a test
// body above all.
#pragma once

#include <string>

namespace partita::mpi {

// While one is alive and PARTITA_WAIT_TIMEOUT is set, the watchdog also
// watches this thread between partita's waits: a thread that starts or
// finishes no partita wait (and no watched blocking call) for
// PARTITA_WAIT_TIMEOUT seconds is stuck where no deadline reaches (a raw
// MPI call, a loop of its own), and the watchdog prints
//   partita: rank R made no progress for S s (PARTITA_WAIT_TIMEOUT) in WHAT,
//   outside partita's waits (...); aborting the job instead of hanging
// and aborts the process, so that the launcher ends the job. Time spent
// inside a partita wait is the deadline's and the watchdog's as before.
// partita::testing's main() keeps one alive around every test, WHAT naming
// the test. One at a time per process; nothing when PARTITA_WAIT_TIMEOUT is
// unset.
class ScopedProgressWatch {
 public:
  explicit ScopedProgressWatch(const std::string& what);
  ~ScopedProgressWatch();
  ScopedProgressWatch(const ScopedProgressWatch&) = delete;
  ScopedProgressWatch& operator=(const ScopedProgressWatch&) = delete;

 private:
  bool on_;
};

}  // namespace partita::mpi
