// The `--key value` options of the pipeline benchmarks' mains
// (bench_pipeline, bench_schedules): every value is a number, handed to its
// key's setter. An unknown key, a key without a value or a value that is
// not a number ends the program with status 2 and says which.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

namespace partita::bench {

inline void parse_key_values(int argc, char** argv, const char* program,
                             const std::map<std::string, std::function<void(double)>>& setters) {
  for (int i = 1; i < argc; i += 2) {
    const auto it = setters.find(argv[i]);
    const char* why = it == setters.end() ? "unknown option" : i + 1 == argc ? "no value for" : nullptr;
    char* end = nullptr;
    const double x = why ? 0 : std::strtod(argv[i + 1], &end);
    if (!why && (end == argv[i + 1] || *end != '\0')) why = "not a number after";
    if (why) {
      std::fprintf(stderr, "%s: %s %s\n", program, why, argv[i]);
      std::exit(2);
    }
    it->second(x);
  }
}

}  // namespace partita::bench
