// The tensor codec interface: how one chunk of one tensor becomes a stored payload.
//
// A chunk is a run of whole elements of one tensor (storage cuts large tensors into chunks of a
// few MiB). A codec encodes a chunk either as a keyframe (standalone) or as a delta against the
// *reconstruction* of the same chunk in the previous version. Decoding a delta needs the same
// reconstruction, so encoder and decoder see bit-identical references and lossy codecs cannot
// drift (closed-loop error feedback).
//
// Codecs are pure: no I/O, no logging, no global state. Every codec object is immutable after
// construction and safe for concurrent use from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"

namespace ckpt {

// Identifies the algorithm that wrote a payload; stored with every chunk.
// Written to disk: never change a value, never reuse a retired one.
enum class CodecId : uint16_t {
  kLosslessBytePlanes = 1,  // byte-plane split + zstd; deltas are XOR of the raw bits
  kLossyQuantized = 2,      // error-bounded quantization + context-modelled rANS (lossy_codec.h)
};

// Whether a payload stands alone or needs the previous reconstruction.
// Written to disk: never change a value.
enum class FrameKind : uint8_t {
  kKeyframe = 1,
  kDelta = 2,
};

// What an encoder did with a chunk, for reporting (version detail, benchmarks).
struct ChunkCodingInfo {
  uint8_t quantizer = 0;          // 0 for lossless; else the lossy Quantizer value used
  double bound = 0;               // the absolute error bound applied (0 = bit-exact)
  uint64_t elements = 0;          // elements in the chunk
  uint64_t exact_elements = 0;    // elements stored verbatim to keep the bound (NaN, Inf, ...)
  double model_entropy_bits = 0;  // Shannon entropy of the coded symbols under the codec's
                                  // context model, plus raw extra bits (0 if not applicable)
};

struct EncodedChunk {
  std::string payload;
  ChunkCodingInfo info;
  // For lossless codecs the reconstruction is the input itself and this stays empty; lossy
  // codecs return the decoder's exact output here (the next error-feedback state).
  std::vector<uint8_t> reconstruction;
  bool reconstruction_is_input = true;
  // The codec that decodes `payload`: normally the encoder's own id(), but an encoder may hand
  // a chunk to another codec (the lossy codec stores a chunk losslessly when quantizing would
  // not make it smaller, e.g. a bound below the dtype's resolution).
  CodecId codec_id = CodecId::kLosslessBytePlanes;
};

// Replays the delta chain of one chunk: a keyframe (or an already decoded reconstruction), then
// deltas oldest first. Obtained from the codec that wrote the payloads; thread-compatible.
class ChainDecoder {
 public:
  virtual ~ChainDecoder() = default;
  virtual Status StartFromKeyframe(std::span<const uint8_t> payload) = 0;
  // Starts from a reconstruction decoded earlier (for example a cached one). `decoded` must
  // stay alive and unchanged until the decoder is destroyed: a decoder may read it in place
  // instead of copying it.
  virtual Status StartFromDecoded(std::span<const uint8_t> decoded) = 0;
  virtual Status ApplyDelta(std::span<const uint8_t> payload) = 0;
  // Writes the reconstruction after the last delta into `out` (resized to the chunk length).
  virtual Status Finish(std::vector<uint8_t>* out) = 0;
};

class TensorCodec {
 public:
  virtual ~TensorCodec() = default;

  virtual CodecId id() const = 0;

  // Encodes `current` (whole elements of `dtype`). With `reference` (the previous
  // reconstruction of this chunk: same dtype and length) the result is a delta, else a keyframe.
  virtual Result<EncodedChunk> Encode(DType dtype, std::span<const uint8_t> current,
                                      std::optional<std::span<const uint8_t>> reference) const = 0;

  // Decodes `payload` into `out` (exactly the chunk's byte length). `reference` must be given
  // for deltas and be the reconstruction the encoder used. Corrupt payloads yield DataLoss.
  virtual Status Decode(DType dtype, std::span<const uint8_t> payload,
                        std::optional<std::span<const uint8_t>> reference,
                        std::span<uint8_t> out) const = 0;

  // A decoder for a chain of this codec's payloads for a chunk of `length` bytes. The default
  // applies Decode link by link; codecs whose deltas compose cheaply override it.
  virtual std::unique_ptr<ChainDecoder> NewChainDecoder(DType dtype, size_t length) const;

  // Whether a delta runs both ways: when a delta payload takes reconstruction B to A, the same
  // payload applied to A gives B, bit for bit (an XOR of the raw bits). A reader holding the
  // newer end of such a link can then step to the other end with one decode.
  virtual bool DeltasAreSymmetric() const { return false; }
};

struct LosslessCodecOptions {
  // zstd level for every plane. Higher is smaller and slower; decoding speed barely changes.
  // Default: 1 (on byte planes of trained weights level 1 is about as small as 3 and twice as fast;
  // see docs/benchmarks.md).
  int zstd_level = 1;
};

// The lossless codec: floats are split into byte planes (each byte position of the element
// compressed separately, as ZipNN does, so the sign/exponent bytes compress apart from the
// noisy mantissa bytes); deltas are the XOR of the raw bits with the reference. Integer and
// boolean tensors are compressed whole (one plane).
std::unique_ptr<TensorCodec> NewLosslessCodec(const LosslessCodecOptions& options = {});

// Returns the codec able to decode payloads written with `id`, or NotFound/DataLoss for an
// unknown id (e.g. data written by a newer ckptd).
Result<const TensorCodec*> CodecForDecoding(uint16_t id);

}  // namespace ckpt
