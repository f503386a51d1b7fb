// The `partita` command: explain (worker tables from the reference).
#include <iostream>
#include <string>
#include <vector>

#include "explain.hpp"

namespace {
const char* kUsage =
    "usage: partita <command> [args]\n"
    "  explain PRIMITIVE ...   print the partitions of a broadcast, sum-reduce or\n"
    "                          all-sum-reduce as seed 000 tabulates them\n";
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "explain") return partita::tools::explain(args, std::cout, std::cerr);
  std::cerr << "partita: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
