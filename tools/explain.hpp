#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace partita::tools {

// `partita explain PRIMITIVE [options]`: the worker tables of seed 000,
// computed by the reference. Registers the subcommand (one subcommand per
// primitive, each with its own required options) on `app`; when it is
// given, `action` is set to run it and return the exit status (1 when the
// partitions cannot pair).
void add_explain(CLI::App& app, std::function<int()>& action);

// `partita explain smp --size N --partitions P [--json]` (explain_smp.cpp):
// registered on the explain subcommand by add_explain.
void add_explain_smp(CLI::App& explain, std::function<int()>& action);

// `partita explain pipeline --schedule NAME --stages P --microbatches M
// [--virtual V] [--csv FILE] ...` (explain_pipeline.cpp): a schedule
// verified and simulated on one process; exit 1 when it does not verify.
void add_explain_pipeline(CLI::App& explain, std::function<int()>& action);

}  // namespace partita::tools
