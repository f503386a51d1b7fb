#include "seed_tables.hpp"

#include <cstdint>

#include <stdexcept>

namespace partita::spec {

// Written out example by example rather than derived from the rules, so the
// spec tests do not share the implementation's arithmetic.
int expected_reduction_target(const ReductionExample& ex, const Index& i) {
  const std::string& n = ex.name;
  if (n == "example1_4_to_1" || n == "example2_2x3_to_1") return 0;
  if (n == "example3_3x4_to_3x1") return static_cast<int>(i[0]);  // rows reduce
  if (n == "example4_4x4x3_to_1x1x3") return static_cast<int>(i[2]);
  // 1x3 seen as 3x1 (transpose_src) or 3x1 seen as 1x3 (transpose_dest):
  // the worker at column j of P_x sums into row j of P_y.
  if (n == "example6_1x3_to_3x1_transpose_src" || n == "example6_1x3_to_3x1_transpose_dest")
    return static_cast<int>(i[1]);
  // 3x4 seen as 4x3, reduced to 1x3: the row index of P_x picks the column.
  if (n == "example7_3x4_to_1x3_transpose_src") return static_cast<int>(i[0]);
  // 3x4 to 4x1 seen as 1x4: the column index of P_x picks the row.
  if (n == "example8_3x4_to_4x1_transpose_dest") return static_cast<int>(i[1]);
  throw std::logic_error("no expected target for " + n);
}

std::vector<Shape> shapes_that_wrap_to(int64_t n) {
  std::vector<Shape> out = {{-1, -n}};
  const unsigned __int128 wrapped = (static_cast<unsigned __int128>(1) << 64) + static_cast<unsigned __int128>(n);
  for (int64_t a = 3; a < 1000000; ++a)
    if (wrapped % a == 0 && wrapped / a <= static_cast<unsigned __int128>(INT64_MAX)) {
      out.push_back({a, static_cast<int64_t>(wrapped / a)});
      break;
    }
  return out;
}

}  // namespace partita::spec
