#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace partita::tools {

// `partita explain PRIMITIVE [options]`: the worker tables of seed 000,
// computed by the reference. Returns the exit status.
int explain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace partita::tools
