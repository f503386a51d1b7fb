// Shapes, indices and the decomposition rule: vocabulary shared by the
// reference and the MPI implementation (never data movement).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace partita {

using Shape = std::vector<int64_t>;
using Index = std::vector<int64_t>;
using Ranks = std::vector<int>;

// Number of elements (workers) of a shape; 1 for the empty shape.
int64_t volume(const Shape& shape);

// "2x3x2"; "()" for the empty shape.
std::string shape_string(const Shape& shape);
// "1,2,3" (for worker lists and indices).
std::string list_string(const std::vector<int64_t>& values);
std::string list_string(const Ranks& values);
// A worker list for a message: list_string() up to 32 workers; beyond, the
// first 16, "...", the last 4 and the count ("0,1,...,15,...,1048572,...,
// 1048575 (1048576 workers)"), so that an error about a large partition
// stays a line.
std::string workers_string(const Ranks& workers);

// Row-major (C order) rank of an index in a grid of the given shape, and back.
// docs/design.md, "Rank order of a Cartesian partition": index (i, j, k) of shape (a, b, c) is rank i*b*c + j*c + k.
int64_t ravel(const Index& index, const Shape& shape);
Index unravel(int64_t rank, const Shape& shape);

// Balanced decomposition of a length n over p workers (docs/design.md):
// worker i gets n/p + (i < n%p) elements starting at i*(n/p) + min(i, n%p).
int64_t local_length(int64_t n, int64_t p, int64_t i);
int64_t local_start(int64_t n, int64_t p, int64_t i);

// Parses "1,3,1" / "1x3x1" (shapes) and "0-3,7,9-10" (rank lists). A rank
// list holds at most kMaxRanks values, each from 0 to kMaxRanks.
constexpr int64_t kMaxRanks = int64_t{1} << 20;
Shape parse_shape(const std::string& text);
Ranks parse_ranks(const std::string& text);

}  // namespace partita
