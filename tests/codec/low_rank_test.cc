// Low-rank shifts of the lattice (codec/src/low_rank.h): the fit finds a planted subspace, the
// shift is exact integer arithmetic, and the serialized form round-trips and rejects damage.
#include "lossy/low_rank.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lossy/kernel_choice.h"

namespace ckpt::lossy {
namespace {

// rows x cols: a rank-`rank` matrix of magnitude ~`scale` plus iid noise of `noise`.
std::vector<double> PlantedMatrix(uint32_t rows, uint32_t cols, uint32_t rank, double scale,
                                  double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> u(size_t{rows} * rank), v(size_t{cols} * rank), m(size_t{rows} * cols);
  for (double& x : u) x = normal(rng);
  for (double& x : v) x = normal(rng);
  for (uint32_t i = 0; i < rows; ++i) {
    for (uint32_t j = 0; j < cols; ++j) {
      double s = 0;
      for (uint32_t k = 0; k < rank; ++k) s += u[i * rank + k] * v[j * rank + k] / (k + 1.0);
      m[size_t{i} * cols + j] = scale * s / std::sqrt(double(rank)) + noise * normal(rng);
    }
  }
  return m;
}

// FitLowRankShift on a delta in real units.
LowRankShift Fit(const std::vector<double>& delta, uint32_t rows, uint32_t cols, uint32_t rank,
                 double step, double fine) {
  std::vector<float> in_steps(delta.size());
  for (size_t i = 0; i < delta.size(); ++i) {
    in_steps[i] = std::isfinite(delta[i]) ? static_cast<float>(delta[i] / step) : 0.0f;
  }
  return FitLowRankShift(in_steps, rows, cols, rank, step, fine);
}

// The share of `delta`'s energy left after subtracting the shift (in real units).
double ResidualShare(const std::vector<double>& delta, const LowRankShift& shift, double fine) {
  std::vector<int32_t> applied(delta.size());
  shift.Apply(applied.data());
  double left = 0, total = 0;
  for (size_t i = 0; i < delta.size(); ++i) {
    const double r = delta[i] - applied[i] * fine;
    left += r * r;
    total += delta[i] * delta[i];
  }
  return left / total;
}

LowRankShift RandomShift(uint32_t rows, uint32_t cols, uint32_t rank, bool basis_on_columns,
                         uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> factor(-kMaxFactor, kMaxFactor);
  LowRankShift s;
  s.rows = rows;
  s.cols = cols;
  s.rank = rank;
  s.basis_on_columns = basis_on_columns;
  s.scale = 3.7 / 11;
  s.coefficients.resize(size_t{s.CoefficientLength()} * rank);
  s.basis.resize(size_t{s.BasisLength()} * rank);
  for (int8_t& x : s.coefficients) x = static_cast<int8_t>(factor(rng));
  for (int8_t& x : s.basis) x = static_cast<int8_t>(factor(rng));
  return s;
}

// Runs body with the kernels this CPU chooses (AVX2 where it has them) and with the portable ones.
template <typename Body>
void WithEachKernel(Body body) {
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable kernels" : "the CPU's kernels");
    const ScopedKernelChoice kernels(portable ? LossyKernels::kPortable : LossyKernels::kFastest);
    body();
  }
}

TEST(LowRankShift, FitCapturesAPlantedLowRankDelta) {
  const double fine = 1e-2 / 64;
  WithEachKernel([&] {
    for (const auto& [rows, cols] : {std::pair{600u, 96u}, std::pair{96u, 600u}}) {
      const std::vector<double> delta = PlantedMatrix(rows, cols, 4, 3e-3, 1e-5, 7);
      const LowRankShift shift = Fit(delta, rows, cols, 4, 1e-3, fine);
      EXPECT_EQ(shift.rank, 4u);
      EXPECT_EQ(shift.basis_on_columns, cols <= rows);
      EXPECT_LT(ResidualShare(delta, shift, fine), 0.15) << rows << "x" << cols;
      // A rank too small leaves the weaker directions.
      const LowRankShift one = Fit(delta, rows, cols, 1, 1e-3, fine);
      EXPECT_GT(ResidualShare(delta, one, fine), 0.2);
    }
  });
}

TEST(LowRankShift, FitOfNoiseOrNothingIsHarmless) {
  const double fine = 1e-2 / 64;
  const std::vector<double> zero(64 * 48, 0.0);
  const LowRankShift shift = Fit(zero, 64, 48, 8, 1e-3, fine);
  std::vector<int32_t> applied(zero.size(), 1);
  shift.Apply(applied.data());
  for (int32_t v : applied) EXPECT_EQ(v, 0);
  std::vector<double> odd = PlantedMatrix(64, 48, 2, 3e-3, 1e-4, 3);
  odd[5] = std::nan("");
  odd[6] = INFINITY;
  const LowRankShift fitted = Fit(odd, 64, 48, 8, 1e-3, fine);
  EXPECT_EQ(fitted.rank, 8u);
  EXPECT_TRUE(std::isfinite(fitted.scale));
  // A mismatched size or rank 0 gives no shift.
  EXPECT_EQ(Fit(odd, 64, 47, 8, 1e-3, fine).rank, 0u);
  EXPECT_EQ(Fit(odd, 64, 48, 0, 1e-3, fine).rank, 0u);
}

// Deltas whose float products overflow still give factors within range. (The lossy_roundtrip
// fuzzer found least-squares coefficients that came out NaN and were converted to int8, which is
// undefined; its input is kept as regression_low_rank_nan_factor, which the fuzz build's UBSan
// checks — on x86 the conversion happens to give 0, so this test cannot see it.)
TEST(LowRankShift, FitOfOverflowingDeltasGivesValidFactors) {
  std::vector<float> huge(64 * 32);
  for (size_t i = 0; i < huge.size(); ++i) huge[i] = i % 3 ? 3e38f : -3e38f;
  for (uint32_t rank : {1u, 8u}) {
    const LowRankShift shift = FitLowRankShift(huge, 64, 32, rank, 1e-3, 1e-3 / 64);
    for (int8_t c : shift.coefficients) EXPECT_LE(std::abs(int{c}), kMaxFactor);
    for (int8_t b : shift.basis) EXPECT_LE(std::abs(int{b}), kMaxFactor);
    std::vector<int32_t> applied(huge.size());
    shift.Apply(applied.data());
  }
}

TEST(LowRankShift, ApplyIsExactIntegerArithmetic) {
  WithEachKernel([] {
    for (bool basis_on_columns : {true, false}) {
      const LowRankShift s = RandomShift(37, 53, kMaxLowRank, basis_on_columns, 11);
      std::vector<int32_t> applied(37 * 53);
      s.Apply(applied.data());
      for (uint32_t i = 0; i < 37; ++i) {
        for (uint32_t j = 0; j < 53; ++j) {
          const uint32_t c = basis_on_columns ? i : j, b = basis_on_columns ? j : i;
          int64_t sum = 0;
          for (uint32_t k = 0; k < s.rank; ++k) {
            sum += int64_t{s.coefficients[c * s.rank + k]} * s.basis[b * s.rank + k];
          }
          EXPECT_EQ(applied[i * 53 + j], static_cast<int32_t>(std::nearbyint(s.scale * sum)))
              << i << "," << j;
        }
      }
      // Truncation uses the leading factor columns only; a row alone is the same row.
      const LowRankShift first = s.Truncated(5);
      EXPECT_EQ(first.rank, 5u);
      EXPECT_EQ(first.coefficients[s.CoefficientLength() * 5 - 1],
                s.coefficients[(s.CoefficientLength() - 1) * s.rank + 4]);
      std::vector<int32_t> truncated(37 * 53), expected(37 * 53), row(53);
      s.ApplyTruncated(5, truncated.data());
      first.Apply(expected.data());
      EXPECT_EQ(truncated, expected);
      for (uint32_t i = 0; i < 37; i += 9) {
        s.ApplyRows(s.rank, i, 1, 1, row.data());
        EXPECT_TRUE(std::equal(row.begin(), row.end(), applied.begin() + i * 53)) << i;
        s.ApplyRows(5, i, 1, 1, row.data());
        EXPECT_TRUE(std::equal(row.begin(), row.end(), expected.begin() + i * 53)) << i;
      }
      std::vector<int32_t> strided(4 * 53);  // rows 3, 12, 21, 30
      s.ApplyRows(s.rank, 3, 9, 4, strided.data());
      for (uint32_t t = 0; t < 4; ++t) {
        EXPECT_TRUE(std::equal(strided.begin() + t * 53, strided.begin() + (t + 1) * 53,
                               applied.begin() + (3 + 9 * t) * 53))
            << t;
      }
    }
  });
}

// Rows wide enough for every block width of the vector kernels (64 and 8 columns, then single
// ones) give the exact integer result too, with the ranks the codec uses.
TEST(LowRankShift, ApplyOfWideRowsIsExact) {
  WithEachKernel([] {
    for (const auto& [rows, cols] : {std::pair{11u, 72u}, std::pair{7u, 197u}}) {
      for (uint32_t rank : {8u, 16u}) {
        const LowRankShift s = RandomShift(rows, cols, rank, true, rank + cols);
        std::vector<int32_t> applied(size_t{rows} * cols);
        s.Apply(applied.data());
        for (uint32_t i = 0; i < rows; ++i) {
          for (uint32_t j = 0; j < cols; ++j) {
            int64_t sum = 0;
            for (uint32_t k = 0; k < rank; ++k) {
              sum += int64_t{s.coefficients[i * rank + k]} * s.basis[j * rank + k];
            }
            ASSERT_EQ(applied[i * cols + j], static_cast<int32_t>(std::nearbyint(s.scale * sum)))
                << rows << "x" << cols << " rank " << rank << " at " << i << "," << j;
          }
        }
      }
    }
  });
}

TEST(LowRankShift, WriteReadRoundTrip) {
  for (bool basis_on_columns : {true, false}) {
    const LowRankShift s = RandomShift(40, 24, 16, basis_on_columns, 5);
    std::string bytes;
    s.Write(&bytes);
    bytes += "tail";
    const auto* in = reinterpret_cast<const uint8_t*>(bytes.data());
    const uint8_t* end = in + bytes.size();
    LowRankShift back;
    ASSERT_TRUE(LowRankShift::Read(in, end, 40, 24, &back).ok());
    EXPECT_EQ(end - in, 4);  // stops after the shift
    EXPECT_EQ(back.rank, s.rank);
    EXPECT_EQ(back.basis_on_columns, s.basis_on_columns);
    EXPECT_EQ(back.scale, s.scale);
    EXPECT_EQ(back.coefficients, s.coefficients);
    EXPECT_EQ(back.basis, s.basis);
    EXPECT_NEAR(s.EstimatedBits(16), 8.0 * (bytes.size() - 4), 0.1 * 8.0 * bytes.size() + 200);
    EXPECT_LT(s.EstimatedBits(4), s.EstimatedBits(16));
  }
  LowRankShift none;
  none.rows = 3;
  none.cols = 3;
  std::string bytes;
  none.Write(&bytes);
  EXPECT_EQ(bytes.size(), 1u);
  const auto* in = reinterpret_cast<const uint8_t*>(bytes.data());
  LowRankShift back;
  ASSERT_TRUE(LowRankShift::Read(in, in + 1, 3, 3, &back).ok());
  EXPECT_EQ(back.rank, 0u);
}

TEST(LowRankShift, ReadRejectsDamage) {
  const LowRankShift s = RandomShift(20, 12, 8, true, 9);
  std::string bytes;
  s.Write(&bytes);
  LowRankShift back;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const auto* in = reinterpret_cast<const uint8_t*>(bytes.data());
    EXPECT_FALSE(LowRankShift::Read(in, in + cut, 20, 12, &back).ok()) << cut;
  }
  auto read = [&](std::string b, uint32_t rows, uint32_t cols) {
    const auto* in = reinterpret_cast<const uint8_t*>(b.data());
    return LowRankShift::Read(in, in + b.size(), rows, cols, &back);
  };
  EXPECT_EQ(read(bytes, 20, 7).code(), StatusCode::kDataLoss);  // rank 8 > 7 columns
  std::string bad_rank = bytes;
  bad_rank[0] = static_cast<char>(kMaxLowRank + 1);
  EXPECT_EQ(read(bad_rank, 64, 64).code(), StatusCode::kDataLoss);
  std::string bad_orientation = bytes;
  bad_orientation[1] = 2;
  EXPECT_EQ(read(bad_orientation, 20, 12).code(), StatusCode::kDataLoss);
  for (double scale : {0.0, -1.0, std::nan(""), 1e30}) {
    std::string bad_scale = bytes;
    const uint64_t bits = std::bit_cast<uint64_t>(scale);
    for (int b = 0; b < 8; ++b) bad_scale[2 + b] = static_cast<char>(bits >> (8 * b));
    EXPECT_EQ(read(bad_scale, 20, 12).code(), StatusCode::kDataLoss) << scale;
  }
}

}  // namespace
}  // namespace ckpt::lossy
