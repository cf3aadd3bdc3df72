// The AVX2 kernel of the log quantizer's ratio mode (codec/src/lossy/kernels_log_avx2.h) against
// the per-element loop it stands in for: the same symbols, extra bits, verbatim elements and
// reconstructions, bit for bit, for ratios placed next to the lattice's rounding boundaries
// (where the kernel's own log2 and glibc's could round apart), special values, sign flips, moves
// too large for a direct symbol and bounds the lattice cannot meet.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lossy/format.h"         // internal: QuantizerSet
#include "lossy/kernel_choice.h"  // internal: ScopedKernelChoice
#include "lossy/quantize.h"       // internal: QuantizeAdditive

namespace ckpt {
namespace {

struct Outcome {
  std::vector<uint8_t> symbols;
  std::string extra;
  uint64_t extra_bits = 0;
  std::string exact;
  std::vector<float> recon;
};

Outcome Quantize(const lossy::QuantizerSet& set, const std::vector<float>& x,
                 const std::vector<float>& p, double eps, bool non_negative, bool portable) {
  const lossy::ScopedKernelChoice kernels(portable ? LossyKernels::kPortable
                                                   : LossyKernels::kFastest);
  lossy::Quantized q;
  Outcome out;
  out.recon.assign(x.size(), 0.0f);
  lossy::QuantizeAdditive<DType::kF32>(set, reinterpret_cast<const uint8_t*>(x.data()),
                                       reinterpret_cast<const uint8_t*>(p.data()), x.size(), eps,
                                       non_negative, lossy::HistoryUse::kNone,
                                       reinterpret_cast<uint8_t*>(out.recon.data()), &q);
  out.symbols = q.symbols;
  out.extra_bits = q.extra_bits;
  out.extra = q.extra.Finish();
  out.exact = q.exact;
  return out;
}

lossy::QuantizerSet RatioSet(double step, double offset) {
  lossy::QuantizerSet set;
  set.kind = Quantizer::kLog;
  set.log.mode = lossy::LogQuantizer::Mode::kRatio;
  set.log.SetStep(step);
  set.log.offset = offset;
  set.log.ResetCache();
  return set;
}

TEST(LossyRatioKernel, WritesWhatThePerElementLoopWrites) {
  // Without AVX2 both runs are the per-element loop: nothing to compare.
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "the CPU has no AVX2";
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::normal_distribution<double> normal(0, 1);
  const float kSpecial[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            1e-40f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min()};
  size_t cases = 0, near_ties = 0;
  for (double eps : {1e-4, 1e-2, 0.05, 0.3, 3.0}) {
    // The step the codec uses for eps, and one too coarse for it (reconstructions miss the bound).
    for (double step : {2 * std::log2(1 + eps), 6 * std::log2(1 + eps)}) {
      for (double offset : {0.0, 0.37, -0.5}) {
        for (bool non_negative : {false, true}) {
          const size_t n = 1 << 14;
          std::vector<float> x(n), p(n);
          for (size_t i = 0; i < n; ++i) {
            p[i] = static_cast<float>(std::exp(3 * normal(rng)) * (i % 9 == 0 ? -1 : 1));
            // Mostly a lattice boundary (k + 1/2 + offset) steps away, as close as F32 rounding
            // allows; otherwise any ratio, a sign flip, or a move beyond a direct symbol.
            const double k = std::floor(18 * uniform(rng)) - 9;
            double ratio = std::exp2((k + 0.5 + offset) * step);
            if (i % 5 == 1) ratio = std::exp2((k + 2 * uniform(rng) - 1) * step);
            if (i % 11 == 2) ratio = -ratio;
            if (i % 13 == 3) ratio = std::exp2(40 * step * (uniform(rng) - 0.5));
            x[i] = static_cast<float>(p[i] * ratio);
            if (i % 97 == 4) x[i] = kSpecial[(i / 97) % std::size(kSpecial)];
            if (i % 89 == 5) p[i] = kSpecial[(i / 89) % std::size(kSpecial)];
            if (i % 83 == 6) x[i] = p[i];
            const double t = std::log2(std::abs(static_cast<double>(x[i]) / p[i])) / step - offset;
            near_ties += std::abs(t - std::floor(t) - 0.5) < 1e-6;
          }
          const auto set = RatioSet(step, offset);
          const Outcome kernel = Quantize(set, x, p, eps, non_negative, /*portable=*/false);
          const Outcome loop = Quantize(set, x, p, eps, non_negative, /*portable=*/true);
          const std::string where = "eps " + std::to_string(eps) + " step " + std::to_string(step) +
                                    " offset " + std::to_string(offset) +
                                    (non_negative ? " non-negative" : "");
          ASSERT_EQ(kernel.symbols, loop.symbols) << where;
          ASSERT_EQ(kernel.extra_bits, loop.extra_bits) << where;
          ASSERT_EQ(kernel.extra, loop.extra) << where;
          ASSERT_EQ(kernel.exact, loop.exact) << where;
          ASSERT_EQ(0, std::memcmp(kernel.recon.data(), loop.recon.data(), 4 * n)) << where;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 60u);
  // The boundaries were really probed: thousands of ratios within 1e-6 of one.
  EXPECT_GT(near_ties, 5000u);
}

}  // namespace
}  // namespace ckpt
