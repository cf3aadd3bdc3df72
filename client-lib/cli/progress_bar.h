// A progress bar for transfers on a terminal.
#pragma once

#include <chrono>
#include <cstdint>

namespace ckpt::cli {

// Draws "[=====>     ]  45%  1.2 GiB / 2.7 GiB  310.4 MiB/s" on stderr, at most 10 times a
// second, and erases it when done (destroyed), so that the command's own output starts on a
// clean line. Thread-compatible: transfers report from the thread that runs them.
class ProgressBar {
 public:
  ProgressBar() = default;
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar() { Clear(); }

  void Update(uint64_t done, uint64_t total);
  // Erases the bar (nothing if none was drawn).
  void Clear();

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
  bool drawn_ = false;
};

}  // namespace ckpt::cli
