#include "lossy/low_rank.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "entropy/rans.h"
#include "lossy/kernel_choice.h"
#include "lossy/quantizers.h"

namespace ckpt::lossy {
namespace {

// Factor columns of similar scale share a table: coefficient column k in context
// floor(log2(k + 1)) (the leading singular directions carry the largest coefficients), every
// basis column in the last one (basis columns are unit vectors scaled alike).
constexpr uint32_t kCoefficientContexts = 6;
constexpr uint32_t kBasisContext = kCoefficientContexts;
constexpr uint32_t kFactorContexts = kCoefficientContexts + 1;
// A present symbol costs about two bytes of table (symbol and varint frequency).
constexpr double kTableBitsPerSymbol = 16;
// The fit's effort: sampled rows, power iterations and extra directions trade ratio against
// encoding speed; these were chosen by measurement (docs/decisions.md, the low-rank shift:
// fewer rows or one iteration cost ratio, more cost speed for little ratio).
constexpr size_t kSampleRows = 512;
constexpr int kPowerIterations = 2;
constexpr size_t kOversampling = 8;

uint32_t CoefficientContext(uint32_t k) { return std::bit_width(k + 1) - 1; }

uint8_t FactorSymbol(int8_t v) { return static_cast<uint8_t>(ZigZag(v)); }

// Rows of the shift's two factors in the orientation of the output: shift(i, j) uses row i of
// `row_factor` and row j of `column_factor`.
struct Oriented {
  const int8_t* row_factor;
  const int8_t* column_factor;
};

Oriented Orient(const LowRankShift& s) {
  return s.basis_on_columns ? Oriented{s.coefficients.data(), s.basis.data()}
                            : Oriented{s.basis.data(), s.coefficients.data()};
}

// a . b over n values, in eight independent sums (a single sum is bound by the adder's latency).
double Dot(const double* a, const double* b, size_t n) {
  double sums[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t k = 0; k < 8; ++k) sums[k] += a[i + k] * b[i + k];
  }
  double dot =
      ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
  for (; i < n; ++i) dot += a[i] * b[i];
  return dot;
}

// Orthonormalizes the l columns of q (n x l, row-major) in place by modified Gram-Schmidt, on
// a column-major copy; a column that vanishes against the others becomes zero.
void Orthonormalize(std::vector<double>& q, size_t n, size_t l) {
  std::vector<double> cols(n * l);
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < l; ++c) cols[c * n + i] = q[i * l + c];
  }
  for (size_t c = 0; c < l; ++c) {
    double* v = &cols[c * n];
    for (size_t p = 0; p < c; ++p) {
      const double* u = &cols[p * n];
      const double dot = Dot(v, u, n);
      for (size_t i = 0; i < n; ++i) v[i] -= dot * u[i];
    }
    const double norm = std::sqrt(Dot(v, v, n));
    const double inverse = norm > 1e-300 ? 1.0 / norm : 0.0;
    for (size_t i = 0; i < n; ++i) v[i] *= inverse;
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < l; ++c) q[i * l + c] = cols[c * n + i];
  }
}

// Eigen-decomposition of the symmetric l x l matrix h (row-major) by cyclic Jacobi rotations:
// h's diagonal becomes the eigenvalues, v (l x l, columns) the eigenvectors.
void SymmetricEigen(std::vector<double>& h, size_t l, std::vector<double>* v) {
  v->assign(l * l, 0.0);
  for (size_t i = 0; i < l; ++i) (*v)[i * l + i] = 1.0;
  for (int sweep = 0; sweep < 50; ++sweep) {
    double off = 0, total = 0;
    for (size_t i = 0; i < l; ++i) {
      for (size_t j = 0; j < l; ++j) {
        total += h[i * l + j] * h[i * l + j];
        if (i != j) off += h[i * l + j] * h[i * l + j];
      }
    }
    if (off <= 1e-12 * total) return;
    for (size_t p = 0; p < l; ++p) {
      for (size_t q = p + 1; q < l; ++q) {
        const double hpq = h[p * l + q];
        if (std::abs(hpq) < 1e-300) continue;
        const double theta = (h[q * l + q] - h[p * l + p]) / (2 * hpq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (size_t k = 0; k < l; ++k) {  // h <- h J (columns p, q)
          const double a = h[k * l + p], b = h[k * l + q];
          h[k * l + p] = c * a - s * b;
          h[k * l + q] = s * a + c * b;
        }
        for (size_t k = 0; k < l; ++k) {  // h <- J^T h (rows p, q)
          const double a = h[p * l + k], b = h[q * l + k];
          h[p * l + k] = c * a - s * b;
          h[q * l + k] = s * a + c * b;
        }
        for (size_t k = 0; k < l; ++k) {
          const double a = (*v)[k * l + p], b = (*v)[k * l + q];
          (*v)[k * l + p] = c * a - s * b;
          (*v)[k * l + q] = s * a + c * b;
        }
      }
    }
  }
}

// Solves x g = y for each row of y (m x r) in place, g (r x r) symmetric positive definite, by
// Cholesky; a tiny ridge keeps a singular g (a basis column quantized to zero) solvable.
void SolveRows(std::vector<double> g, size_t r, std::vector<double>& y, size_t m) {
  double trace = 0;
  for (size_t i = 0; i < r; ++i) trace += g[i * r + i];
  for (size_t i = 0; i < r; ++i) g[i * r + i] += 1e-12 * trace + 1e-300;
  for (size_t j = 0; j < r; ++j) {  // g = L L^T, L in the lower triangle
    double d = g[j * r + j];
    for (size_t k = 0; k < j; ++k) d -= g[j * r + k] * g[j * r + k];
    d = std::sqrt(std::max(d, 1e-300));
    g[j * r + j] = d;
    for (size_t i = j + 1; i < r; ++i) {
      double s = g[i * r + j];
      for (size_t k = 0; k < j; ++k) s -= g[i * r + k] * g[j * r + k];
      g[i * r + j] = s / d;
    }
  }
  for (size_t row = 0; row < m; ++row) {
    double* x = &y[row * r];
    for (size_t i = 0; i < r; ++i) {  // L z = y
      double s = x[i];
      for (size_t k = 0; k < i; ++k) s -= g[i * r + k] * x[k];
      x[i] = s / g[i * r + i];
    }
    for (size_t i = r; i-- > 0;) {  // L^T x = z
      double s = x[i];
      for (size_t k = i + 1; k < r; ++k) s -= g[k * r + i] * x[k];
      x[i] = s / g[i * r + i];
    }
  }
}

// The fit's and the shift's inner loops, compiled also for AVX2 (chosen at load time where the
// CPU has it). The shift's sums are exact integers in float, so every clone computes the same
// bits; the fit need not be reproducible. Not under ThreadSanitizer: GCC instruments the clones'
// resolver, which the dynamic loader runs before the sanitizer's runtime is set up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CKPT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CKPT_VECTOR_CLONES
#endif

// out (cols x rows) = the rows x cols matrix whose row i starts at in + i * in_stride,
// transposed; in tiles that stay in cache.
void TransposeScalar(const float* in, size_t rows, size_t cols, size_t in_stride, float* out) {
  constexpr size_t kTile = 16;
  for (size_t i0 = 0; i0 < rows; i0 += kTile) {
    for (size_t j0 = 0; j0 < cols; j0 += kTile) {
      const size_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (size_t i = i0; i < i1; ++i) {
        for (size_t j = j0; j < j1; ++j) out[j * rows + i] = in[i * in_stride + j];
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CKPT_FIT_AVX2 1
bool CpuHasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !PortableKernelsChosen();
}

// The same in 8 x 8 blocks of AVX registers.
__attribute__((target("avx2"))) void TransposeAvx2(const float* in, size_t rows, size_t cols,
                                                   size_t in_stride, float* out) {
  size_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    size_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      __m256 r[8], t[8];
      for (size_t k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(in + (i + k) * in_stride + j);
      for (size_t k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
      }
      for (size_t k = 0; k < 8; k += 4) {
        r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (size_t k = 0; k < 4; ++k) {
        _mm256_storeu_ps(out + (j + k) * rows + i, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
        _mm256_storeu_ps(out + (j + k + 4) * rows + i,
                         _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
      }
    }
    for (; j < cols; ++j) {
      for (size_t k = 0; k < 8; ++k) out[j * rows + i + k] = in[(i + k) * in_stride + j];
    }
  }
  for (; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * in_stride + j];
  }
}
#endif

void Transpose(const float* in, size_t rows, size_t cols, size_t in_stride, float* out) {
#ifdef CKPT_FIT_AVX2
  if (CpuHasAvx2Fma()) return TransposeAvx2(in, rows, cols, in_stride, out);
#endif
  TransposeScalar(in, rows, cols, in_stride, out);
}

// Eight floats as one value (GCC/Clang vector extension).
typedef float Float8 __attribute__((vector_size(32)));

// out (R x L) = R rows of a (each of n values, at rows_of_a[0 .. R)) times b (n x L). R * L / 8
// accumulators stay in registers and each load of b serves R rows: one row at a time would be
// bound by the latency of its few accumulators, not by arithmetic.
template <size_t L, size_t R>
inline void MultiplyRows(const float* const* rows_of_a, size_t n, const float* b, float* out) {
  constexpr size_t kVectors = L / 8;
  Float8 acc[R][kVectors] = {};
  for (size_t j = 0; j < n; ++j) {
    for (size_t s = 0; s < R; ++s) {
      const float v = rows_of_a[s][j];
      for (size_t k = 0; k < kVectors; ++k) {
        Float8 bk;
        std::memcpy(&bk, b + j * L + 8 * k, sizeof(bk));
        acc[s][k] += v * bk;
      }
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same with AVX2 and FMA intrinsics, chosen at run time where the CPU has them (GCC's
// vector-extension code keeps more than a few accumulators on the stack).
template <size_t L, size_t R>
__attribute__((target("avx2,fma"), always_inline)) inline void MultiplyRowsAvx2(
    const float* const* rows_of_a, size_t n, const float* b, float* out) {
  constexpr size_t kVectors = L / 8;
  __m256 acc[R][kVectors];
  for (size_t s = 0; s < R; ++s) {
    for (size_t k = 0; k < kVectors; ++k) acc[s][k] = _mm256_setzero_ps();
  }
  for (size_t j = 0; j < n; ++j) {
    __m256 bk[kVectors];
    for (size_t k = 0; k < kVectors; ++k) bk[k] = _mm256_loadu_ps(b + j * L + 8 * k);
    for (size_t s = 0; s < R; ++s) {
      const __m256 v = _mm256_broadcast_ss(rows_of_a[s] + j);
      for (size_t k = 0; k < kVectors; ++k) acc[s][k] = _mm256_fmadd_ps(v, bk[k], acc[s][k]);
    }
  }
  for (size_t s = 0; s < R; ++s) {
    for (size_t k = 0; k < kVectors; ++k) _mm256_storeu_ps(out + s * L + 8 * k, acc[s][k]);
  }
}

// MultiplyFixed's blocking loop again, on purpose: GCC keeps the kernel's 12 accumulators in
// registers only when it is inlined into a loop inside a function with these targets. Sharing
// one generic loop (the kernel out of line, called per block) kept them in registers but also
// stored them to the stack every step, which makes the fit much slower.
template <size_t L>
__attribute__((target("avx2,fma"))) void MultiplyFixedAvx2(const float* a, size_t n, size_t stride,
                                                           size_t rows, const float* b,
                                                           float* out) {
  constexpr size_t kBlock = 96 / L;  // 12 accumulators of the 16 registers
  size_t s = 0;
  for (; s + kBlock <= rows; s += kBlock) {
    const float* block[kBlock];
    for (size_t t = 0; t < kBlock; ++t) block[t] = a + (s + t) * stride * n;
    MultiplyRowsAvx2<L, kBlock>(block, n, b, out + s * L);
  }
  for (; s < rows; ++s) {
    const float* row = a + s * stride * n;
    MultiplyRowsAvx2<L, 1>(&row, n, b, out + s * L);
  }
}

#endif

// out (rows x L) = every stride-th row of a (rows of n values) times b (n x L).
template <size_t L>
void MultiplyFixed(const float* a, size_t n, size_t stride, size_t rows, const float* b,
                   float* out) {
  static_assert(L % 8 == 0);
#ifdef CKPT_FIT_AVX2
  if (CpuHasAvx2Fma()) return MultiplyFixedAvx2<L>(a, n, stride, rows, b, out);
#endif
  constexpr size_t kBlock = L <= 16 ? 2 : 1;  // within SSE2's 16 registers
  size_t s = 0;
  for (; s + kBlock <= rows; s += kBlock) {
    const float* block[kBlock];
    for (size_t t = 0; t < kBlock; ++t) block[t] = a + (s + t) * stride * n;
    MultiplyRows<L, kBlock>(block, n, b, out + s * L);
  }
  for (; s < rows; ++s) {
    const float* row = a + s * stride * n;
    MultiplyRows<L, 1>(&row, n, b, out + s * L);
  }
}

CKPT_VECTOR_CLONES void MultiplyAny(const float* a, size_t n, size_t stride, size_t rows,
                                    const float* b, size_t l, float* out) {
  std::fill(out, out + rows * l, 0.0f);
  for (size_t s = 0; s < rows; ++s) {
    const float* row = a + s * stride * n;
    float* o = out + s * l;
    for (size_t j = 0; j < n; ++j) {
      const float v = row[j];
      const float* bj = b + j * l;
      for (size_t c = 0; c < l; ++c) o[c] += v * bj[c];
    }
  }
}

// out (rows x l) = every stride-th row of a (rows of n values) times b (n x l).
void Multiply(const float* a, size_t n, size_t stride, size_t rows, const float* b, size_t l,
              float* out) {
  if (l == 8) return MultiplyFixed<8>(a, n, stride, rows, b, out);
  if (l == 16) return MultiplyFixed<16>(a, n, stride, rows, b, out);
  if (l == 24) return MultiplyFixed<24>(a, n, stride, rows, b, out);
  MultiplyAny(a, n, stride, rows, b, l, out);
}

// One row of a shift: out[j] = RoundToInteger(scale * sum over k < rank of row[k] *
// column_t[k][j]) for j < cols. Every product and partial sum is an integer below 2^17, exact in
// float whatever the order or contraction, and the rounding is the same IEEE double operations
// in every version below: every build and CPU gets the same shift.
void ShiftRowScalar(const int8_t* row, const float* column_t, uint32_t rank, uint32_t cols,
                    double scale, int32_t* out) {
  float sums[64];
  for (uint32_t j0 = 0; j0 < cols; j0 += 64) {
    const uint32_t width = std::min<uint32_t>(64, cols - j0);
    std::fill(sums, sums + width, 0.0f);
    for (uint32_t k = 0; k < rank; ++k) {
      const float a = row[k];
      const float* c = column_t + size_t{k} * cols + j0;
      for (uint32_t j = 0; j < width; ++j) sums[j] += a * c[j];
    }
    for (uint32_t j = 0; j < width; ++j) {
      out[j0 + j] = static_cast<int32_t>(RoundToInteger(scale * static_cast<double>(sums[j])));
    }
  }
}

#ifdef CKPT_FIT_AVX2
// Eight sums (exact integers in float) scaled and rounded as ShiftRowScalar does.
__attribute__((target("avx2"), always_inline)) inline void StoreRoundedEight(__m256 sums,
                                                                             __m256d scale,
                                                                             int32_t* out) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(sums));
  const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(sums, 1));
  const __m256d low_rounded = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(low, scale), magic), magic);
  const __m256d high_rounded =
      _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(high, scale), magic), magic);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtpd_epi32(low_rounded));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm256_cvtpd_epi32(high_rounded));
}

// ShiftRowScalar with 64 columns at a time in registers (eight accumulators keep both FMA units
// busy; with exact integer sums, fused or not gives the same bits).
__attribute__((target("avx2,fma"))) void ShiftRowAvx2(const int8_t* row, const float* column_t,
                                                      uint32_t rank, uint32_t cols, double scale,
                                                      int32_t* out) {
  __m256 factors[kMaxLowRank];
  for (uint32_t k = 0; k < rank; ++k) factors[k] = _mm256_set1_ps(row[k]);
  const __m256d scale_v = _mm256_set1_pd(scale);
  uint32_t j = 0;
  for (; j + 64 <= cols; j += 64) {
    __m256 acc[8];
    for (int v = 0; v < 8; ++v) acc[v] = _mm256_setzero_ps();
    for (uint32_t k = 0; k < rank; ++k) {
      const float* c = column_t + size_t{k} * cols + j;
      for (int v = 0; v < 8; ++v) {
        acc[v] = _mm256_fmadd_ps(factors[k], _mm256_loadu_ps(c + 8 * v), acc[v]);
      }
    }
    for (int v = 0; v < 8; ++v) StoreRoundedEight(acc[v], scale_v, out + j + 8 * v);
  }
  for (; j + 8 <= cols; j += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t k = 0; k < rank; ++k) {
      acc = _mm256_fmadd_ps(factors[k], _mm256_loadu_ps(column_t + size_t{k} * cols + j), acc);
    }
    StoreRoundedEight(acc, scale_v, out + j);
  }
  for (; j < cols; ++j) {
    float sum = 0;
    for (uint32_t k = 0; k < rank; ++k) {
      sum += static_cast<float>(row[k]) * column_t[size_t{k} * cols + j];
    }
    out[j] = static_cast<int32_t>(RoundToInteger(scale * static_cast<double>(sum)));
  }
}
#endif

void ShiftRow(const int8_t* row, const float* column_t, uint32_t rank, uint32_t cols, double scale,
              int32_t* out) {
#ifdef CKPT_FIT_AVX2
  if (CpuHasAvx2Fma()) return ShiftRowAvx2(row, column_t, rank, cols, scale, out);
#endif
  ShiftRowScalar(row, column_t, rank, cols, scale, out);
}

// The nearest factor value within ±kMaxFactor; 0 for NaN (a fit that overflowed).
int8_t QuantizeFactor(double v) {
  if (std::isnan(v)) return 0;
  const double q = RoundToInteger(std::clamp(v, -double{kMaxFactor}, double{kMaxFactor}));
  return static_cast<int8_t>(q);
}

}  // namespace

void LowRankShift::Apply(int32_t* out) const { ApplyRows(rank, 0, 1, rows, out); }

void LowRankShift::ApplyTruncated(uint32_t use_rank, int32_t* out) const {
  ApplyRows(use_rank, 0, 1, rows, out);
}

void LowRankShift::ApplyRows(uint32_t use_rank, uint32_t first_row, uint32_t row_step,
                             uint32_t count, int32_t* out) const {
  const LowRankShiftRows shift_rows(*this, use_rank);
  for (uint32_t t = 0; t < count; ++t) {
    shift_rows.Row(first_row + t * row_step, out + size_t{t} * cols);
  }
}

LowRankShiftRows::LowRankShiftRows(const LowRankShift& shift, uint32_t rank)
    : shift_(shift), rank_(std::min(rank, shift.rank)) {
  const Oriented f = Orient(shift);
  column_t_.resize(size_t{rank_} * shift.cols);
  for (uint32_t j = 0; j < shift.cols; ++j) {
    for (uint32_t k = 0; k < rank_; ++k) {
      column_t_[size_t{k} * shift.cols + j] = f.column_factor[size_t{j} * shift.rank + k];
    }
  }
}

void LowRankShiftRows::Row(uint32_t row, int32_t* out) const {
  if (rank_ == 0) {
    std::fill(out, out + shift_.cols, 0);
    return;
  }
  ShiftRow(Orient(shift_).row_factor + size_t{row} * shift_.rank, column_t_.data(), rank_,
           shift_.cols, shift_.scale, out);
}

LowRankShift LowRankShift::Truncated(uint32_t use_rank) const {
  use_rank = std::min(use_rank, rank);
  LowRankShift t = *this;
  t.rank = use_rank;
  t.coefficients.clear();
  t.basis.clear();
  if (use_rank == 0) return t;
  for (size_t i = 0; i < CoefficientLength(); ++i) {
    for (uint32_t k = 0; k < use_rank; ++k) t.coefficients.push_back(coefficients[i * rank + k]);
  }
  for (size_t i = 0; i < BasisLength(); ++i) {
    for (uint32_t k = 0; k < use_rank; ++k) t.basis.push_back(basis[i * rank + k]);
  }
  return t;
}

void LowRankShift::Write(std::string* out) const {
  out->push_back(static_cast<char>(rank));
  if (rank == 0) return;
  out->push_back(static_cast<char>(basis_on_columns ? 1 : 0));
  const uint64_t bits = std::bit_cast<uint64_t>(scale);
  for (int b = 0; b < 8; ++b) out->push_back(static_cast<char>(bits >> (8 * b)));
  const size_t total = coefficients.size() + basis.size();
  std::vector<uint8_t> symbols(total), contexts(total);
  rans::Histogram histogram(kFactorContexts);
  size_t at = 0;
  for (size_t i = 0; i < coefficients.size(); ++i, ++at) {
    symbols[at] = FactorSymbol(coefficients[i]);
    contexts[at] = static_cast<uint8_t>(CoefficientContext(static_cast<uint32_t>(i % rank)));
    histogram.Add(contexts[at], symbols[at]);
  }
  for (size_t i = 0; i < basis.size(); ++i, ++at) {
    symbols[at] = FactorSymbol(basis[i]);
    contexts[at] = kBasisContext;
    histogram.Add(kBasisContext, symbols[at]);
  }
  const std::vector<rans::EncodeTable> tables = rans::WriteTables(histogram, out);
  rans::Encoder encoder(total, 1);
  encoder.PutAll(symbols.data(), contexts.data(), tables.data(), total);
  encoder.Finish(out);
}

Status LowRankShift::Read(const uint8_t*& in, const uint8_t* end, uint32_t rows, uint32_t cols,
                          LowRankShift* shift) {
  *shift = LowRankShift{};
  shift->rows = rows;
  shift->cols = cols;
  if (in >= end) return Status::DataLoss("low-rank shift: truncated");
  shift->rank = *in++;
  if (shift->rank == 0) return Status::Ok();
  if (shift->rank > kMaxLowRank || shift->rank > std::min(rows, cols)) {
    return Status::DataLoss("low-rank shift: rank " + std::to_string(shift->rank) +
                            " out of range");
  }
  if (end - in < 9) return Status::DataLoss("low-rank shift: truncated");
  const uint8_t orientation = *in++;
  if (orientation > 1) return Status::DataLoss("low-rank shift: unknown orientation");
  shift->basis_on_columns = orientation == 1;
  uint64_t bits = 0;
  for (int b = 0; b < 8; ++b) bits |= uint64_t{in[b]} << (8 * b);
  in += 8;
  shift->scale = std::bit_cast<double>(bits);
  // |scale * sum| stays far inside the lattice's exact range (sums are below 2^17).
  if (!(shift->scale > 0 && shift->scale <= 0x1p24)) {
    return Status::DataLoss("low-rank shift: scale out of range");
  }
  rans::DecodeTables tables;
  CKPT_RETURN_IF_ERROR(tables.Read(in, end, kFactorContexts));
  rans::Decoder decoder;
  CKPT_RETURN_IF_ERROR(decoder.Init(in, end, 1));
  const uint32_t r = shift->rank;
  shift->coefficients.resize(size_t{shift->CoefficientLength()} * r);
  shift->basis.resize(size_t{shift->BasisLength()} * r);
  bool valid = true;
  const size_t coefficient_rows = shift->CoefficientLength();
  for (size_t row = 0, i = 0; row < coefficient_rows; ++row) {
    for (uint32_t k = 0; k < r; ++k, ++i) {
      const uint8_t z = decoder.Get<0>(tables.context(CoefficientContext(k)));
      valid &= z <= 2 * kMaxFactor;
      shift->coefficients[i] = static_cast<int8_t>(UnZigZag(z));
    }
  }
  for (size_t i = 0; i < shift->basis.size(); ++i) {
    const uint8_t z = decoder.Get<0>(tables.context(kBasisContext));
    valid &= z <= 2 * kMaxFactor;
    shift->basis[i] = static_cast<int8_t>(UnZigZag(z));
  }
  CKPT_RETURN_IF_ERROR(decoder.Check());
  if (!valid) return Status::DataLoss("low-rank shift: factor out of range");
  return Status::Ok();
}

double LowRankShift::EstimatedBits(uint32_t use_rank) const {
  use_rank = std::min(use_rank, rank);
  if (use_rank == 0) return 8;
  rans::Histogram histogram(kFactorContexts);
  for (size_t row = 0; row < coefficients.size(); row += rank) {  // rows of `rank` values
    for (uint32_t k = 0; k < use_rank; ++k) {
      histogram.Add(CoefficientContext(k), FactorSymbol(coefficients[row + k]));
    }
  }
  for (size_t row = 0; row < basis.size(); row += rank) {
    for (uint32_t k = 0; k < use_rank; ++k) {
      histogram.Add(kBasisContext, FactorSymbol(basis[row + k]));
    }
  }
  double table_bits = 0;
  for (const auto& counts : histogram.counts) {
    for (uint32_t c : counts) table_bits += c ? kTableBitsPerSymbol : 0;
  }
  return histogram.EntropyBits() + table_bits + 80;
}

LowRankShift FitLowRankShift(std::span<const float> delta_in_steps, uint32_t rows, uint32_t cols,
                             uint32_t rank, double coefficient_step, double fine) {
  LowRankShift shift;
  shift.rows = rows;
  shift.cols = cols;
  shift.basis_on_columns = cols <= rows;
  const size_t n = shift.BasisLength(), m = shift.CoefficientLength();
  const uint32_t r = std::min<uint32_t>({rank, kMaxLowRank, static_cast<uint32_t>(n)});
  if (r == 0 || delta_in_steps.size() != size_t{rows} * cols || !(coefficient_step > 0) ||
      !(fine > 0)) {
    return shift;
  }
  // The delta oriented m x n (the basis over its columns): as given, or transposed.
  std::vector<float> transposed;
  if (!shift.basis_on_columns) {
    transposed.resize(m * n);
    Transpose(delta_in_steps.data(), rows, cols, cols, transposed.data());
  }
  const std::span<const float> mat = shift.basis_on_columns ? delta_in_steps : transposed;
  // Randomized subspace iteration (Halko, Martinsson and Tropp) on a sample of the rows, with a
  // few extra directions, from a fixed pseudo-random start (which needs no orthonormalizing);
  // q is n x l, row-major.
  const size_t l = std::min(n, size_t{r} + kOversampling);
  const size_t stride = std::max<size_t>(1, m / kSampleRows);
  const size_t sampled = (m + stride - 1) / stride;
  std::vector<double> q(n * l);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (double& v : q) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    v = static_cast<double>(seed >> 11) * 0x1p-53 - 0.5;
  }
  std::vector<float> qf(n * l), y(sampled * l), z(n * l);
  std::vector<float> sample_t(n * sampled);  // S^T, for z = S^T y
  Transpose(mat.data(), sampled, n, stride * n, sample_t.data());
  auto project = [&] {  // y = S q
    for (size_t i = 0; i < n * l; ++i) qf[i] = static_cast<float>(q[i]);
    Multiply(mat.data(), n, stride, sampled, qf.data(), l, y.data());
  };
  for (int iteration = 0; iteration < kPowerIterations; ++iteration) {
    project();
    Multiply(sample_t.data(), sampled, 1, n, y.data(), l, z.data());
    for (size_t i = 0; i < n * l; ++i) q[i] = z[i];
    Orthonormalize(q, n, l);
  }
  // Rayleigh-Ritz: order the directions by the energy they carry (h = y^T y).
  project();
  std::vector<float> y_t(l * sampled), hf(l * l);
  Transpose(y.data(), sampled, l, l, y_t.data());
  Multiply(y_t.data(), sampled, 1, l, y.data(), l, hf.data());
  std::vector<double> h(hf.begin(), hf.end()), w;
  SymmetricEigen(h, l, &w);
  std::vector<size_t> order(l);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return h[a * l + a] > h[b * l + b]; });
  // The basis, quantized to multiples of 1/sqrt(n), and its dequantized values: q (as qf, from
  // the last projection) times the r leading eigenvectors.
  const double root_n = std::sqrt(static_cast<double>(n));
  std::vector<float> leading(l * r), rotated(n * r), basis(n * r);
  for (size_t c = 0; c < l; ++c) {
    for (size_t k = 0; k < r; ++k) leading[c * r + k] = static_cast<float>(w[c * l + order[k]]);
  }
  Multiply(qf.data(), l, 1, n, leading.data(), r, rotated.data());
  shift.rank = r;
  shift.basis.resize(n * r);
  for (size_t i = 0; i < n * r; ++i) {
    shift.basis[i] = QuantizeFactor(rotated[i] * root_n);
    basis[i] = static_cast<float>(shift.basis[i] / root_n);
  }
  // Coefficients by least squares on every row: M (B (B^T B)^-1), the bracket computed once.
  std::vector<float> basis_t(r * n), gram_f(size_t{r} * r);
  Transpose(basis.data(), n, r, r, basis_t.data());
  Multiply(basis_t.data(), n, 1, r, basis.data(), r, gram_f.data());
  std::vector<double> inverse(size_t{r} * r, 0.0);
  for (size_t k = 0; k < r; ++k) inverse[k * r + k] = 1;
  SolveRows(std::vector<double>(gram_f.begin(), gram_f.end()), r, inverse, r);
  std::vector<float> inverse_f(inverse.begin(), inverse.end()), solved(n * r), coefficients(m * r);
  Multiply(basis.data(), r, 1, n, inverse_f.data(), r, solved.data());
  Multiply(mat.data(), n, 1, m, solved.data(), r, coefficients.data());
  shift.coefficients.resize(m * r);
  for (size_t i = 0; i < m * r; ++i) shift.coefficients[i] = QuantizeFactor(coefficients[i]);
  shift.scale = coefficient_step / root_n / fine;
  return shift;
}

}  // namespace ckpt::lossy
