// The MPI runtime of partita: start-up, partita's private world
// communicator, MPI error checking, and the one waiting policy every
// blocking point goes through.
//
// Why a waiting policy: MPICH's blocking waits spin. With more ranks than
// cores (every test run on a 2-core machine) a spinning rank steals the core
// the rank it waits for needs, and a one-float allreduce goes from 1 us to
// 60 ms at 12 ranks. partita therefore starts every operation non-blocking
// and finishes it with MPI_Test in a loop that yields the core between tests
// when ranks outnumber cores (DESIGN.md has the measured figures).
#pragma once

#include <mpi.h>

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

// Finish requests under the waiting policy. `what` names the operation for
// the watchdog: when PARTITA_WAIT_TIMEOUT (seconds, default none) passes, the
// rank prints what it was waiting for and aborts the job instead of hanging.
void wait(MPI_Request& request, const char* what);
void wait_all(std::vector<MPI_Request>& requests, const char* what);

// Throws partita::MpiError naming the call, the file and line, and MPI's text.
void check(int code, const char* call, const char* file, int line);

// A logical AND of `local` over `comm`, under the waiting policy. Used to
// agree on verdicts so that every rank takes the same branch.
bool all_true(bool local, MPI_Comm comm);

}  // namespace partita::mpi

#define PARTITA_MPI_CHECK(call) ::partita::mpi::check((call), #call, __FILE__, __LINE__)
