// Integer helpers for sizes and counts.
#pragma once

#include <cstdint>

namespace pycoll {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace pycoll
