#include "progress_bar.h"

#include <cstdio>
#include <string>

#include "output.h"

namespace ckpt::cli {

void ProgressBar::Update(uint64_t done, uint64_t total) {
  const auto now = Clock::now();
  if (done != total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  constexpr int kWidth = 30;
  const double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  // "\r...\033[K": redraw from the line's start and erase what a longer frame left.
  std::fprintf(stderr, "\r[%s] %3d%%  %s / %s  %s/s\033[K", bar.c_str(),
               static_cast<int>(fraction * 100), HumanBytes(done).c_str(),
               HumanBytes(total).c_str(), HumanBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace ckpt::cli
