// The callgrind side of bench/paired.hpp's CountedScope (issue 34 item 1),
// in its own file so that only it reads valgrind's header. Without the
// header (no `valgrind` package) counting is a no-op.
#include <unistd.h>

#include <cstdio>

#include "paired.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define PARTITA_TOGGLE_COLLECT() CALLGRIND_TOGGLE_COLLECT
#else
#define PARTITA_TOGGLE_COLLECT() ((void)0)
#endif

namespace partita::bench {

long& counted_calls() {
  static long n = 0;
  return n;
}

void CountedScope::toggle_collect() { PARTITA_TOGGLE_COLLECT(); }

namespace {
// Each process writes its own callgrind file; each says at exit how many
// calls its collected instructions cover.
struct Report {
  ~Report() {
    if (counted_side() != CountedSide::none)
      std::fprintf(stderr, "counted calls: %ld (pid %d)\n", counted_calls(), static_cast<int>(getpid()));
  }
} report;
}  // namespace

}  // namespace partita::bench
