// The byte layout of lossy payloads: the only code that knows it (docs/format.md, "Lossy
// payloads"). A payload is, little-endian:
//
//   header          PayloadHeader (version, quantizer, dtype, context model, flags, bound,
//                   element count, verbatim count, extra-bits length)
//   parameters      the quantizer's (QuantizerSet)
//   low-rank shift  kFlagLowRank only: rows, columns and the shift's factors
//   verbatim        the elements stored as they are
//   extra bits      the bits below the leading one of bucketed symbols
//   history states  kFlagExplicitHistory only: u32 length, then every element's state, rANS-coded
//   symbols         rANS tables and stream (to the end of the payload; rans.h)
//
// Written to disk: versions, flags and layouts are never changed or reused; a new coding gets a
// new version so that older releases refuse it instead of misreading it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ckpt/base/binary.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/lossy_codec.h"
#include "lossy/history.h"
#include "lossy/low_rank.h"
#include "lossy/quantizers.h"
#include "lossy/symbols.h"

namespace ckpt::lossy {

// Payload versions.
inline constexpr uint8_t kPayloadVersion = 1;
// Lattice payloads (kFlagLattice) are version 2, so that a release that predates them refuses
// them instead of decoding them by the additive rule.
inline constexpr uint8_t kPayloadVersionLattice = 2;
// Lattice payloads with element history (kFlagLattice | kFlagHistory): version 3, for the same
// reason.
inline constexpr uint8_t kPayloadVersionLatticeHistory = 3;
// Lattice deltas with a low-rank shift (kFlagLattice | kFlagLowRank): version 4.
inline constexpr uint8_t kPayloadVersionLowRank = 4;
// Log-quantizer deltas in ratio mode on a shifted lattice (LogQuantizer::offset, parameter
// mode kLogModeRatioOffset): version 5.
inline constexpr uint8_t kPayloadVersionLogOffset = 5;
// The log quantizer's parameter mode byte for ratio mode with an offset (version 5 only): the
// offset follows as an f64.
inline constexpr uint8_t kLogModeRatioOffset = 3;

// Header flags.
inline constexpr uint8_t kFlagDelta = 1;
inline constexpr uint8_t kFlagHistory = 2;     // reconstructions carry their history state
inline constexpr uint8_t kFlagFourStates = 4;  // the rANS stream interleaves four states
inline constexpr uint8_t kFlagLattice = 8;     // uniform: reconstructions are lattice points
// Lattice with history: every element's history state is coded explicitly (exact re-encodings).
inline constexpr uint8_t kFlagExplicitHistory = 16;
// Lattice delta whose lattice is shifted by a low-rank matrix.
inline constexpr uint8_t kFlagLowRank = 32;
inline constexpr uint8_t kKnownFlags = kFlagDelta | kFlagHistory | kFlagFourStates | kFlagLattice |
                                       kFlagExplicitHistory | kFlagLowRank;

// The low-rank lattice: pitch step / kLowRankFine, moves of kLowRankFine pitches.
inline constexpr double kLowRankFine = 64;

// The context of an element's explicit history state (kFlagExplicitHistory): the state the
// element would get without it — NextHistory of the reference's state `before` and the move of
// a direct symbol; kKeyframeHistory in keyframes; 0 for any other symbol.
inline uint8_t ExplicitHistoryContext(uint8_t symbol, uint32_t before, bool delta) {
  if (symbol >= kDirectSymbols) return 0;
  if (!delta) return kKeyframeHistory;
  return static_cast<uint8_t>(NextHistory(before, static_cast<double>(UnZigZag(uint64_t{symbol}))));
}

struct PayloadHeader {
  Quantizer quantizer = Quantizer::kUniform;
  DType dtype = DType::kF32;
  uint8_t context_model = 0;
  bool delta = false;
  bool history = false;
  bool four_states = false;
  bool lattice = false;
  bool explicit_history = false;
  bool low_rank = false;
  bool log_offset = false;  // version 5: a ratio-mode log delta with an offset
  double bound = 0;
  uint64_t elements = 0;
  uint32_t exact = 0;        // elements stored verbatim
  uint32_t extra_bytes = 0;  // length of the extra-bits stream

  // The version that the flags call for.
  uint8_t Version() const;
  uint8_t Flags() const;

  void EncodeTo(ByteWriter* out) const;
  // Reads and checks a header: known version, quantizer, context model, dtype and flags, and
  // flags that agree with each other and with the version. DataLoss otherwise.
  Status DecodeFrom(ByteReader* in);
};

// The quantizers and their parameters; `kind` says which one a payload uses.
struct QuantizerSet {
  Quantizer kind = Quantizer::kUniform;
  UniformQuantizer uniform{0};
  ExponentQuantizer exponent;
  FloatQuantizer floating;
  CosineQuantizer cosine;
  LogQuantizer log;

  // The parameters of `kind`.
  void EncodeParamsTo(ByteWriter* out) const;
  // Reads the parameters of `kind` and builds its tables; DataLoss when they are out of range.
  // `header` says which parameter forms the payload's version allows.
  Status DecodeParamsFrom(ByteReader* in, const PayloadHeader& header);
  size_t ParamBytes() const;
};

// What every payload starts with: its header and its quantizer's parameters, read by the decoder
// and by an exact re-encoding alike.
struct PayloadPrologue {
  PayloadHeader header;
  QuantizerSet quantizers;

  // Reads both; DataLoss when either is malformed or out of range.
  Status DecodeFrom(ByteReader* in);
};

// The low-rank section: rows, columns and the length-prefixed factors. Returns the factors'
// length in bytes.
size_t EncodeLowRankShiftTo(const LowRankShift& shift, ByteWriter* out);
// Reads the low-rank section of a payload of `elements` elements decoded into `out_elements`;
// DataLoss when the matrix shape does not match them.
Status DecodeLowRankShiftFrom(ByteReader* in, uint64_t elements, uint64_t out_elements,
                              LowRankShift* shift);

// The sections after the parameters (and the shift), as views into the payload.
struct PayloadSections {
  std::span<const uint8_t> exact;             // header.exact elements, verbatim
  std::span<const uint8_t> extra;             // header.extra_bytes bytes
  std::span<const uint8_t> explicit_history;  // kFlagExplicitHistory: the states' stream
  std::span<const uint8_t> symbols;           // rANS tables and stream: the rest
};

// Writes the verbatim elements, the extra bits and (when header.explicit_history) the history
// states' stream; the caller appends the symbols. InvalidArgument when a section is too long
// for its length field.
Status EncodeSectionsTo(const PayloadHeader& header, std::string_view exact, std::string_view extra,
                        std::string_view explicit_history, ByteWriter* out);
Status DecodeSectionsFrom(ByteReader* in, const PayloadHeader& header, size_t element_size,
                          PayloadSections* sections);

}  // namespace ckpt::lossy
