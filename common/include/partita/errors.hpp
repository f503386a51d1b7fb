// Error types shared by the reference and the MPI implementation.
//
// Every error partita raises derives from partita::Error, so a caller can
// catch one type. The message always names the operation and the inputs
// that were wrong, because in a distributed run the same exception is raised
// on every rank involved and the first line of the log must be enough.
#pragma once

#include <stdexcept>
#include <string>

namespace partita {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Partitions that break the broadcast/reduction rules, bad worker lists,
// shapes whose volume does not match the team, inconsistent arguments.
struct PartitionError : Error {
  using Error::Error;
};

// Tensors or shapes that disagree with the partitions.
struct ShapeError : Error {
  using Error::Error;
};

// A wait did not finish within the deadline (PARTITA_DEADLINE, issue 18):
// the ranks disagree about a plan or one of them is stuck. Only raised in
// deadline mode; the world communicator must be renewed before partita
// communicates again (mpi::renew_world, done by the test harness).
struct DeadlineError : Error {
  using Error::Error;
};

// A case file (or case JSON) that is not valid JSON, or whose fields have the
// wrong type or value. The message names the file, the field and what was
// expected; `partita run` exits 2 for it (a conformance failure exits 1).
struct CaseError : Error {
  using Error::Error;
};

// An MPI call returned an error code.
struct MpiError : Error {
  MpiError(const std::string& what, int code) : Error(what), code(code) {}
  int code;
};

}  // namespace partita
