// Waiting for a condition that is not an MPI request (a probe for a message
// of unknown size, say) under the same policy as partita::mpi::wait: test,
// yield the core between tests when ranks outnumber cores, the deadline
// (DeadlineError) and the watchdog (docs/mpi-runtime.md).
#pragma once

#include <functional>

namespace partita::mpi {

// Calls `ready` until it returns true. A missed deadline throws
// partita::DeadlineError; since such a wait has posted nothing that MPI must
// finish (a probe abandons no operation), it is not counted in
// deadline_misses() and needs no renew_world().
void wait_until(const std::function<bool()>& ready, const char* what);

}  // namespace partita::mpi
