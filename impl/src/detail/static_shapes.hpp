// Internal: static shapes (issue 34 item 2, docs/static-shapes.md). A layer
// or communicator call site told that its shapes do not change keeps what
// every rank stated at its first call (the gathered headers or records)
// and, on later calls, compares only this rank's own statement with its
// first one, locally; the exchange is skipped. With the debug setting
// (PARTITA_CHECK_STATIC_SHAPES=1, or mpi::set_check_static_shapes) every call
// exchanges again, and statements that differ from the first call's raise
// ShapeError on every rank.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

// PARTITA_CHECK_STATIC_SHAPES=1 (default off): mpi::check_static_shapes().

// Plain words of int64 (Header, Record): equal when every word is.
template <typename Statement>
bool same_statement(const Statement& a, const Statement& b) {
  return std::memcmp(&a, &b, sizeof(Statement)) == 0;
}

// The ShapeError a broken promise raises: `who` ("this rank", "worker 3")
// passed `now` where its first call passed `first` (descriptions).
[[noreturn]] void raise_broken_promise(const std::string& what, const std::string& who,
                                       const std::string& first, const std::string& now);

// On every rank (each compares the same gathered statements with the same
// first ones): raises for the first member whose statement changed.
// `describe(s)` says what a statement holds; `member(i)` names member i.
template <typename Statement, typename Describe, typename Member>
void check_promise(const std::string& what, const std::vector<Statement>& first,
                   const std::vector<Statement>& now, Describe&& describe, Member&& member) {
  for (size_t i = 0; i < now.size(); ++i)
    if (i >= first.size() || !same_statement(first[i], now[i]))
      raise_broken_promise(what, member(i), i < first.size() ? describe(first[i]) : "nothing",
                           describe(now[i]));
}

}  // namespace partita::mpi::detail
