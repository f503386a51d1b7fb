// libFuzzer target: the case-file reader (partita::testing::Case::parse,
// testing/src/case.cpp) on arbitrary text, as `partita run FILE` and the
// spec tests read it. Its promise (partita/testing/case.hpp): anything that
// is not a valid case raises partita::CaseError. Any other exception, a
// crash or a sanitizer report is a finding; so is a broken property of a
// case it accepts:
//  - its repro line reads back, and prints the same line again;
//  - world_size_needed() covers every rank the partitions name;
//  - every P_x worker's input shape has as many dimensions as the first
//    worker's (P_x's, from a global_shape), and a rank outside P_x gets {0}.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "partita/errors.hpp"
#include "partita/testing/case.hpp"

namespace {

using partita::CaseError;
using partita::testing::Case;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "case_reader_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Case c;
  try {
    c = Case::parse(text, "fuzz");
  } catch (const CaseError&) {
    return 0;
  }
  const std::string line = c.repro();
  try {
    const std::string again = Case::parse(line, "fuzz repro").repro();
    if (again != line) finding("the repro line " + line + " reads back as " + again);
  } catch (const CaseError& e) {
    finding("the repro line " + line + " of an accepted case is refused: " + e.what());
  }
  const int world = c.world_size_needed();
  for (const auto* P : {&c.P_y, &c.P_W})
    if (*P)
      for (int r : (*P)->ranks)
        if (r >= world) finding(line + ": world_size_needed() is " + std::to_string(world) + ", rank " +
                                std::to_string(r) + " is named");
  size_t checked = 0;
  size_t dims = 0;
  for (int r : c.P_x.ranks) {
    if (r >= world) finding(line + ": world_size_needed() misses P_x rank " + std::to_string(r));
    if (++checked > 64) break;  // enough: the shapes are arithmetic on the index
    const auto s = c.input_shape(r);
    if (checked == 1) dims = s.size();
    if (s.size() != dims || (c.global_shape && s.size() != c.P_x.shape.size()))
      finding(line + ": rank " + std::to_string(r) + "'s input has " + std::to_string(s.size()) +
              " dimensions, the first worker's " + std::to_string(dims) + ", P_x " +
              std::to_string(c.P_x.shape.size()));
  }
  bool outside = true;
  for (int r : c.P_x.ranks) outside = outside && r != world;
  if (outside && c.input_shape(world) != partita::Shape{0})
    finding(line + ": rank " + std::to_string(world) + " is outside P_x but gets an input");
  return 0;
}
