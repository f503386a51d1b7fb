#pragma once

namespace partita::mpi::detail {

// A finite non-negative number (at most 1e15) from the environment variable
// `name`, or `otherwise` when it is unset or empty. Anything else (a word, a
// trailing unit, a negative number, NaN) raises partita::Error naming the
// variable and its value: a deadline or a cache size read as 0 from a typo
// would change what the job does without a word.
double number_from_environment(const char* name, double otherwise);

}  // namespace partita::mpi::detail
