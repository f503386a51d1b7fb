#include "partita/rules.hpp"

#include <algorithm>

#include "partita/errors.hpp"
#include "partita/tiling.hpp"

namespace partita {

namespace {

Shape oriented(Shape s, bool transposed) {
  if (transposed) std::reverse(s.begin(), s.end());
  return s;
}

// `small` is the side that may hold ones where `big` does not (the source of
// a broadcast, the destination of a reduction).
void check_compatible(const std::string& what, const Shape& px, const Shape& py,
                      bool ts, bool td, const Shape& small, const Shape& big,
                      const char* small_name) {
  auto describe = [&] {
    return what + ": P_x " + shape_string(px) + (ts ? " (transposed)" : "") +
           " and P_y " + shape_string(py) + (td ? " (transposed)" : "");
  };
  if (small.size() > big.size())
    throw PartitionError(describe() + " break the " + what + " rules: dim(" +
                         small_name + ") must not exceed the other's",
                         what == "broadcast" ? rule_code::kBroadcastDims : rule_code::kReductionDims);
  const Shape s = padded_shape(small, big.size());
  for (size_t d = 0; d < big.size(); ++d) {
    if (s[d] != 1 && s[d] != big[d])
      throw PartitionError(describe() + " break the " + what +
                           " rules: effective shapes " + shape_string(s) +
                           " and " + shape_string(big) + " differ in dimension " +
                           std::to_string(d) + " where " + small_name +
                           " is not 1",
                           what == "broadcast" ? rule_code::kBroadcastShape : rule_code::kReductionShape);
  }
}

}  // namespace

EffectiveShapes broadcast_shapes(const Shape& px, const Shape& py,
                                 bool transpose_src, bool transpose_dest) {
  const Shape x = oriented(px, transpose_src), y = oriented(py, transpose_dest);
  check_compatible("broadcast", px, py, transpose_src, transpose_dest, x, y,
                   "P_x");
  return {padded_shape(x, y.size()), y};
}

EffectiveShapes reduction_shapes(const Shape& px, const Shape& py,
                                 bool transpose_src, bool transpose_dest) {
  const Shape x = oriented(px, transpose_src), y = oriented(py, transpose_dest);
  check_compatible("reduction", px, py, transpose_src, transpose_dest, y, x,
                   "P_y");
  return {x, padded_shape(y, x.size())};
}

int64_t pairing_key(const Index& index, bool transposed, const Shape& own, const Shape& other) {
  const Index i = oriented(index, transposed);
  Index effective(own.size() - i.size(), 0);  // padded dimensions: index 0
  effective.insert(effective.end(), i.begin(), i.end());
  Index coords;
  Shape extents;
  for (size_t d = 0; d < own.size(); ++d)
    if (own[d] == other[d]) {
      coords.push_back(effective[d]);
      extents.push_back(own[d]);
    }
  if (transposed) {  // Fortran order: the last matched dimension varies slowest
    std::reverse(coords.begin(), coords.end());
    std::reverse(extents.begin(), extents.end());
  }
  return ravel(coords, extents);
}

}  // namespace partita
