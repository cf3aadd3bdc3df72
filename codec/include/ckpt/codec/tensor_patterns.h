// Tensor-name patterns, as policies, retention rules and restore selections write them: glob
// patterns (fnmatch: '*', '?', '[...]') matched against the whole name. Pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ckpt {

// Whether `name` matches `pattern`.
bool TensorNameMatches(std::string_view pattern, std::string_view name);

// The index of the first of `patterns` that `name` matches, or -1.
int FirstMatchingPattern(std::span<const std::string> patterns, std::string_view name);

}  // namespace ckpt
