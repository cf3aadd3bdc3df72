// Low-rank shifts of the lattice (internal to the codec).
//
// The delta of a weight matrix between two checkpoints of an Adam run is far from independent
// noise as a matrix: its top 16 singular values carry half or more of its energy
// (docs/decisions.md, the low-rank shift). A low-rank shift moves every element's lattice by a
// small matrix of rank r, sent as integer factors, so that fewer elements cross a
// lattice line; what is left is coded element by element as before.
//
// A shift is computed from integers and one IEEE double product, so every build gets the same
// bits:
//   shift(i, j) = RoundToInteger(scale * sum_k coefficient(c, k) * basis(b, k))
// where (c, b) = (i, j) when the basis runs over the columns and (j, i) when it runs over the
// rows, factors are within ±kMaxFactor, and the integer sum is exact (|sum| < 2^17). The
// shift is in units of the caller's fine lattice.
//
// Encoder side, FitLowRankShift: the top-r right singular vectors of the delta (over its smaller
// dimension) by randomized subspace iteration on a sample of its rows, quantized; coefficients
// by least squares on every row, quantized. Nothing of the fit needs to be reproducible: the
// stored factors define the shift.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::lossy {

inline constexpr uint32_t kMaxLowRank = 32;
inline constexpr int kMaxFactor = 63;

struct LowRankShift {
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t rank = 0;
  bool basis_on_columns = true;  // the basis runs over the columns (else over the rows)
  double scale = 0;              // fine-lattice units per unit of the integer product
  // (the side the basis does not run over) x rank and (the basis side) x rank, row-major.
  std::vector<int8_t> coefficients;
  std::vector<int8_t> basis;

  uint32_t BasisLength() const { return basis_on_columns ? cols : rows; }
  uint32_t CoefficientLength() const { return basis_on_columns ? rows : cols; }

  // The shift of every element, row-major, into out[0 .. rows * cols). With rank 0 all zero.
  void Apply(int32_t* out) const;

  // The same, keeping only the first `rank` of the factors' columns (rank <= this->rank):
  // for comparing ranks on one fit.
  void ApplyTruncated(uint32_t rank, int32_t* out) const;

  // Rows first_row, first_row + row_step, ... (count of them) of ApplyTruncated(rank, ...), one
  // after another into out[0 .. count * cols). The rows must exist.
  void ApplyRows(uint32_t rank, uint32_t first_row, uint32_t row_step, uint32_t count,
                 int32_t* out) const;

  // The shift made of the first `rank` columns of the factors (rank <= this->rank).
  LowRankShift Truncated(uint32_t rank) const;

  // Serialized (after the rows and columns, which the caller's payload records):
  //   u8 rank; if rank > 0: u8 orientation (1 = basis over the columns), f64 scale, then the
  //   factors as zigzag symbols rANS-coded with a table per factor column (coefficient column
  //   k in context k, basis column k in context rank + k).
  void Write(std::string* out) const;
  static Status Read(const uint8_t*& in, const uint8_t* end, uint32_t rows, uint32_t cols,
                     LowRankShift* shift);

  // The entropy of the factors' symbols (their first `rank` columns), with a table allowance per
  // column, in bits: what Write spends, to within the coder's overhead.
  double EstimatedBits(uint32_t rank) const;
};

// The rows of a shift one at a time, for coding a matrix row by row without the whole shift in
// memory: the column factor is prepared once. Refers to the shift, which must outlive it; const
// after construction, so concurrent Row calls are safe.
class LowRankShiftRows {
 public:
  // Rows of shift.ApplyTruncated(rank, ...).
  LowRankShiftRows(const LowRankShift& shift, uint32_t rank);

  // Row `row` (< shift.rows) into out[0 .. shift.cols).
  void Row(uint32_t row, int32_t* out) const;

 private:
  const LowRankShift& shift_;
  uint32_t rank_;
  std::vector<float> column_t_;  // the column factor's first rank_ columns, rank_ x cols
};

// Fits a shift of the given rank (at most kMaxLowRank and the smaller dimension) to a delta
// (rows x cols, row-major: the new values minus the reference) given in units of
// `coefficient_step` and as finite floats (the caller maps what is not to 0). Coefficients are
// quantized to multiples of `coefficient_step`, the basis to multiples of 1/sqrt(basis length);
// `fine` is the lattice unit the shift is expressed in.
LowRankShift FitLowRankShift(std::span<const float> delta_in_steps, uint32_t rows, uint32_t cols,
                             uint32_t rank, double coefficient_step, double fine);

}  // namespace ckpt::lossy
