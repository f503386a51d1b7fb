#pragma once
// The test main's view of the harness's communicators (not installed).

namespace partita::testing::detail {
// Frees harness_comm() and checks_comm() (and drops them: a later use makes
// them again). Collective over the world; partita::testing's main() calls it
// before MPI_Finalize on a run with no missed deadline, so that nothing MPI
// made for the harness is alive at exit (LeakSanitizer counts it otherwise).
void free_harness_comms();
// checks.cpp's part of it.
void free_checks_comm();
}  // namespace partita::testing::detail
