// compare()'s all-zero guard, for the 16-bit dtypes, held against the twin
// computed in float64 (docs/testing-library.md, "Tolerances").
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace partita::testing::detail {

// "" unless `got` is a non-empty all-zero float16 or bfloat16 tensor while
// `exact()`, the twin's result computed in float64 from the same values,
// reaches beyond the dtype's machine epsilon (2^-10, 2^-7): below 1 the
// 16-bit bound is absolute (0.24), so zeros in place of small outputs would
// pass it. Where `want`, the twin's own 16-bit result, is itself zero
// within that epsilon, zeros are what the obvious computation gives, and
// pass. `exact` runs only when needed; a twin that cannot run in float64
// (throws) leaves the check to compare().
std::string zero_where_exact_is_not(const at::Tensor& got, const at::Tensor& want,
                                    const std::function<at::Tensor()>& exact);

// `xs` with every floating tensor in float64 (integer ones as they are).
std::vector<at::Tensor> in_float64(const std::vector<at::Tensor>& xs);

}  // namespace partita::testing::detail
