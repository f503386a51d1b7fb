// JSON in partita is nlohmann::json (Debian's nlohmann-json3-dev), in its
// ordered flavour: objects keep their keys in insertion order, so what
// partita writes (explain --json, repro lines, perf results, conformance
// reports) is stable and diffable. This header adds only what the library
// does not do the way partita needs:
// - parse errors as partita::Error naming the source (file) and position;
// - a one-line dump with ", " and ": " separators (the format of the
//   explain golden files and the repro lines);
// - Google Benchmark's bare NaN / Infinity (see parse_benchmark).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace partita::json {

using Value = nlohmann::ordered_json;

// Strict RFC 8259 parse. Throws partita::Error "SOURCE: not valid JSON: parse
// error at line L, column C: ..." on malformed text (truncation, trailing
// garbage, `4-2`, ...).
Value parse(const std::string& text, const std::string& source = "json");

// Google Benchmark's JSON writer prints non-finite doubles bare (nan, -nan,
// NaN, inf, -inf, Infinity, -Infinity), which no JSON parser accepts. This
// pre-pass rewrites each such token outside strings as the string "NaN",
// "Infinity" or "-Infinity" and then parses strictly; to_double() reads
// those strings back as the doubles.
Value parse_benchmark(const std::string& text, const std::string& source = "benchmark json");

// A number, or one of the strings the pre-pass writes, or null (what
// nlohmann writes for a non-finite double), as a double (null: NaN).
// Throws partita::Error otherwise.
double to_double(const Value& v);

// Compact one line with ", " and ": " separators.
std::string dump(const Value& v);

}  // namespace partita::json
