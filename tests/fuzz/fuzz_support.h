// Helpers shared by the fuzz harnesses: reading structured fields off the front of an input,
// and the one way a harness reports a broken invariant (abort, which libFuzzer records as a
// crash with the input that caused it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::fuzz {

// Consumes an input from the front. Reads past the end yield zeros and an empty remainder.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size) : rest_(data, size) {}

  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = rest_.front();
    rest_ = rest_.subspan(1);
    return b;
  }
  uint16_t U16() {
    const uint8_t low = Byte();  // first: the operands of | are unsequenced
    return static_cast<uint16_t>(low | Byte() << 8);
  }
  // The next `n` bytes (fewer if the input ends first).
  std::span<const uint8_t> Take(size_t n) {
    n = std::min(n, rest_.size());
    const auto taken = rest_.first(n);
    rest_ = rest_.subspan(n);
    return taken;
  }
  std::span<const uint8_t> Rest() { return Take(rest_.size()); }

 private:
  std::span<const uint8_t> rest_;
};

inline std::string_view AsText(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Aborts with `what` when `condition` is false.
inline void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

// Aborts unless `status` is OK or has one of the codes an input may legitimately produce.
inline void CheckStatusIn(const Status& status, std::initializer_list<StatusCode> allowed,
                          const char* where) {
  if (status.ok()) return;
  for (StatusCode code : allowed) {
    if (status.code() == code) return;
  }
  std::fprintf(stderr, "fuzz invariant broken: %s returned %s\n", where, status.ToString().c_str());
  std::abort();
}

}  // namespace ckpt::fuzz
