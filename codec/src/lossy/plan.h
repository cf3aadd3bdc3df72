// How a chunk is coded: every decision the lossy encoder makes before it quantizes (the bound it
// codes with, the quantizer and its parameters, the lattice, element history, the context model,
// the low-rank shift) taken in one place, from the options and the chunk's values. The payload
// header's flags and version follow from the plan (encoder.cc). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/lossy_codec.h"
#include "lossy/format.h"
#include "lossy/low_rank.h"
#include "lossy/quantize.h"

namespace ckpt::lossy {

// Chunks with fewer elements use one context and one rANS state (kContextModelNone).
inline constexpr size_t kMinElementsForContexts = 4096;

// An exact re-encoding (EncodeExactOnLattice) keeps the lattice, the bound and the element
// history of the payload it re-encodes.
struct ExactTarget {
  double step = 0;  // the original's lattice pitch (on its fine lattice if it was low-rank)
  double bound = 0;
  bool history = false;  // the original carries element history: so does the re-encoding
};

struct ChunkPlan {
  QuantizerSet quantizers;    // `kind` and its parameters
  double bound = 0;           // the absolute bound applied (pointwise: the factor eps)
  bool non_negative = false;  // the chunk has no negative values: none may restore negative
  bool lattice = false;
  HistoryUse history = HistoryUse::kNone;
  bool explicit_history = false;  // every element's state coded (exact re-encodings)
  bool contexts = false;          // context modelling and four interleaved rANS states
  uint8_t context_model = kContextModelNone;
  bool low_rank = false;
  LowRankShift shift;  // when low_rank: the lattice's shift, of shift.rank
};

// The plan for the n elements of `in` (ref: the reference, null for a keyframe; `exact`: an
// exact re-encoding's target, else null). InvalidArgument when the options cannot code the
// chunk (the log quantizer without a pointwise bound).
template <DType D>
Result<ChunkPlan> PlanChunk(const LossyCodecOptions& options, const uint8_t* in, const uint8_t* ref,
                            size_t n, const ExactTarget* exact);

}  // namespace ckpt::lossy
