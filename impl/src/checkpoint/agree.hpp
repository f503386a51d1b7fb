// Internal to partita::checkpoint: one verdict on every rank.
#pragma once

#include <string>

namespace partita::checkpoint::detail {

// Collective over the world: raises on every rank the lowest rank's
// non-empty `error` as a CheckpointError prefixed with `dir` and that rank.
void agree(const std::string& error, const std::string& dir);

}  // namespace partita::checkpoint::detail
