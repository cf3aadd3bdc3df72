// Wall-clock time as ckptd's records and documents store it.
#pragma once

#include <chrono>
#include <cstdint>

namespace ckpt {

// Milliseconds since the Unix epoch.
inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ckpt
