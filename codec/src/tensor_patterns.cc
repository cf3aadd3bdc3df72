#include "ckpt/codec/tensor_patterns.h"

#include <fnmatch.h>

namespace ckpt {

bool TensorNameMatches(std::string_view pattern, std::string_view name) {
  return fnmatch(std::string(pattern).c_str(), std::string(name).c_str(), 0) == 0;
}

int FirstMatchingPattern(std::span<const std::string> patterns, std::string_view name) {
  const std::string text(name);
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (fnmatch(patterns[i].c_str(), text.c_str(), 0) == 0) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace ckpt
