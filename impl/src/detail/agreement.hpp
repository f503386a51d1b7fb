// Internal: how the ranks of a collective constructor agree on its
// arguments and on the outcome of validating them, so that either every
// rank goes on or every rank throws the same PartitionError (never a hang
// with some ranks in a collective and others gone).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "partita/errors.hpp"
#include "partita/shape.hpp"

namespace partita::mpi::detail {

// A fingerprint of a call's arguments, to check that every rank of a
// collective passed the same ones.
struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  void add(int64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>((v >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  void add(const std::vector<int64_t>& v) {
    add(static_cast<int64_t>(v.size()));
    for (auto x : v) add(x);
  }
  void add(const Ranks& v) { add(std::vector<int64_t>(v.begin(), v.end())); }
  void add(const std::string& s) {
    for (char c : s) add(static_cast<int64_t>(c));
  }
};

// Throws PartitionError on every rank of `comm` unless all passed the same
// fingerprint and none failed locally (`local_error` non-empty). The same
// message reaches every rank: the lowest failing rank's text is broadcast;
// a mismatch says "<what>: the ranks of the collective passed different
// <subject>".
// The class and the rule code of the error raised on every rank are the
// first failing rank's (issue 9: both must agree with the reference's).
enum class ErrorKind : char { Partition = 'P', Shape = 'S' };
struct LocalError {
  std::string text;  // empty: this rank did not fail
  ErrorKind kind = ErrorKind::Partition;
  std::string rule;  // partita::rule code
};
void agree(MPI_Comm comm, const char* what, const Fingerprint& f,
           const LocalError& local = {}, const char* subject = "arguments");

// Runs `body` (which validates arguments and may throw), then agrees on the
// outcome over `comm` so that either every rank goes on or every rank throws.
template <typename Body>
void checked(MPI_Comm comm, const char* what, const Fingerprint& f, Body&& body,
             const char* subject = "arguments") {
  LocalError error;
  try {
    body();
  } catch (const Error& e) {
    error.text = e.what();
    error.rule = e.rule();
    if (dynamic_cast<const ShapeError*>(&e)) error.kind = ErrorKind::Shape;
  }
  agree(comm, what, f, error, subject);
}

}  // namespace partita::mpi::detail
