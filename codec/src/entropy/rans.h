// A static, context-modelled rANS entropy coder for small alphabets (internal to the codec).
//
// Symbols are bytes below kMaxSymbols. Each context has its own frequency table, normalized to
// 2^kScaleBits and stored in the stream; the encoder picks the context of every symbol from the
// symbols before it, and the decoder recomputes the same context, so modelling costs no bits.
// The state is 32 bits with byte-wise renormalization (the "rans_byte" construction of
// F. Giesen's public-domain ryg_rans). A symbol of probability p costs -log2(p) bits to within
// the 12-bit quantization of p: a symbol that is nearly always 0 costs a small fraction of a bit,
// which is what lets mostly-unchanged deltas cost close to their entropy (Huffman spends at least 1
// bit).
//
// Stream layout (little-endian), see docs/format.md:
//   u8 context_count C
//   C × table: u8 present symbols K; K × {u8 symbol; varint frequency}  (frequencies sum to 4096)
//   u32 coded length; coded bytes (the final encoder states first, state 0 first)
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::rans {

inline constexpr uint32_t kScaleBits = 12;
inline constexpr uint32_t kScale = 1u << kScaleBits;
inline constexpr uint32_t kMaxSymbols = 128;
inline constexpr uint32_t kMaxContexts = 64;
inline constexpr uint32_t kLow = 1u << 23;  // state lower bound
inline constexpr int kMaxWays = 4;          // interleaved states

// Symbol counts per context, gathered before encoding.
struct Histogram {
  explicit Histogram(uint32_t contexts) : counts(contexts) {}
  std::vector<std::array<uint32_t, kMaxSymbols>> counts;
  void Add(uint32_t context, uint8_t symbol) { ++counts[context][symbol]; }
  // Adds symbols[0..n), symbol i in context contexts[i] (context 0 when `contexts` is null).
  // The same counts as n calls of Add, faster on long runs of one symbol in one context.
  void AddAll(const uint8_t* symbols, const uint8_t* contexts, size_t n);
  // The order-0 Shannon entropy of the symbols, conditioned on their context, in bits.
  double EntropyBits() const;
};

// Normalized frequencies of one context.
struct Table {
  std::array<uint16_t, kMaxSymbols> freq{};
  std::array<uint16_t, kMaxSymbols> start{};
};

// Scales `counts` to frequencies summing to kScale, every present symbol at least 1.
Table Normalize(const std::array<uint32_t, kMaxSymbols>& counts);

// One symbol's encoding constants: division by the frequency done as a multiply by its
// reciprocal (the construction of ryg_rans' RansEncSymbol).
struct EncodeSymbol {
  uint32_t x_max = 0;
  uint32_t rcp_freq = 0;
  uint32_t bias = 0;
  uint16_t cmpl_freq = 0;
  uint16_t rcp_shift = 0;
};
using EncodeTable = std::array<EncodeSymbol, kMaxSymbols>;

// Appends the tables of a histogram's contexts to `out` and returns their encoding constants.
std::vector<EncodeTable> WriteTables(const Histogram& histogram, std::string* out);

// Encodes symbols given their contexts, with one rANS state or four interleaved ones (symbol i
// goes to state i % 4; the states are independent, so a decoder overlaps their work). Usage:
// PutAll, then Finish.
class Encoder {
 public:
  // `ways`: 1 or kMaxWays.
  Encoder(size_t symbol_count, int ways)
      : buffer_(symbol_count * 2 + 32),
        pos_(buffer_.size()),
        ways_(ways == kMaxWays ? kMaxWays : 1) {}

  // Codes symbols[0..n) (processed last to first), symbol i with tables[contexts[i]]
  // (tables[0] when `contexts` is null).
  void PutAll(const uint8_t* symbols, const uint8_t* contexts, const EncodeTable* tables, size_t n);

  // Appends u32 length + the coded bytes (the final states first, state 0 first) to `out`.
  void Finish(std::string* out);

 private:
  std::vector<uint8_t> buffer_;
  size_t pos_;
  int ways_;
  uint32_t state_[kMaxWays] = {kLow, kLow, kLow, kLow};
};

// Per-context decoding tables: one 32-bit entry per slot {symbol:7, freq:13, start:12}.
class DecodeTables {
 public:
  // Reads `contexts` tables written by WriteTables. DataLoss on malformed tables. Afterwards
  // context(c) is a valid table for every c < kMaxContexts (undeclared ones decode as unused).
  Status Read(const uint8_t*& in, const uint8_t* end, uint32_t contexts);
  const uint32_t* context(uint32_t c) const { return contexts_[c]; }

 private:
  std::vector<uint32_t> slots_;  // the used contexts' tables
  std::array<const uint32_t*, kMaxContexts> contexts_{};
};

// Decodes a stream written by Encoder with the same number of ways. For speed, decode with a
// local Decoder (everything here is inline, so its members stay in registers).
class Decoder {
 public:
  // Reads the u32 length and the initial states. DataLoss if truncated.
  Status Init(const uint8_t*& in, const uint8_t* end, int ways);

  // Decodes one symbol with state `k` (symbol i of the stream uses state i % ways) and the given
  // context's slot table. Reads past the end are clamped (they yield zeros); Check() reports
  // them. Renormalization is a rarely taken branch (a symbol of p = 0.8 needs a byte about once
  // in 25 symbols), cheaper than doing both conditional steps every time.
  template <int k>
  [[gnu::always_inline]] uint8_t Get(const uint32_t* slots) {
    uint32_t e;
    uint32_t x = Step(state_[k], slots, &e);
    if (x < kLow) [[unlikely]]
      x = Refill(x);
    state_[k] = x;
    return static_cast<uint8_t>(e & 0x7f);
  }

  // Get for a stream dense in coded bits (a keyframe's few bits per symbol), where a refill
  // comes every few symbols and its branch would often be mispredicted: the same steps and
  // bytes, the refill's one or two bytes taken without a branch. Only while unread bytes remain
  // for every refill until the caller asks again: HasBytes(2 * symbols).
  template <int k>
  [[gnu::always_inline]] uint8_t GetDense(const uint32_t* slots) {
    uint32_t e;
    const uint32_t x = Step(state_[k], slots, &e);
    // As Refill: a state below 2^15 takes two bytes, one below kLow one.
    const uint32_t bytes = uint32_t{x < kLow} + uint32_t{x < (kLow >> 8)};
    const uint32_t next = (uint32_t{in_[0]} << 8) | in_[1];
    state_[k] = (x << (8 * bytes)) | (next >> (16 - 8 * bytes));
    in_ += bytes;
    return static_cast<uint8_t>(e & 0x7f);
  }

  bool HasBytes(size_t n) const { return static_cast<size_t>(end_ - in_) >= n; }
  // Coded bytes per symbol for `symbols` symbols, times 8: a stream's density in bits.
  double BitsPerSymbol(size_t symbols) const {
    return symbols == 0 ? 0 : 8.0 * static_cast<double>(end_ - in_) / static_cast<double>(symbols);
  }

  // Verifies that decoding consumed exactly the coded bytes and ended in the initial states.
  Status Check() const {
    if (overrun_ || in_ != end_ || state_[0] != kLow || state_[1] != kLow || state_[2] != kLow ||
        state_[3] != kLow) {
      return Status::DataLoss("rans: coded stream is corrupt (wrong length or final state)");
    }
    return Status::Ok();
  }

 private:
  // The decoding step of state x by its slot's entry (*e: {symbol:7, freq:13, start:12}): the
  // state before renormalization.
  [[gnu::always_inline]] static uint32_t Step(uint32_t x, const uint32_t* slots, uint32_t* e) {
    const uint32_t slot = x & (kScale - 1);
    *e = slots[slot];
    return ((*e >> 7) & 0x1fff) * (x >> kScaleBits) + slot - (*e >> 20);
  }

  // Brings a state below kLow back into [2^23, 2^31): a step leaves it at least 2^11 (state >=
  // 2^23, frequency >= 1), so one or two bytes do in a valid stream; a corrupt one gets two at
  // most. Reads past the end yield zeros and are remembered for Check().
  uint32_t Refill(uint32_t x) {
    for (int step = 0; step < 2 && x < kLow; ++step) {
      if (in_ < end_) {
        x = (x << 8) | *in_++;
      } else {
        x <<= 8;
        overrun_ = true;
      }
    }
    return x;
  }

  const uint8_t* in_ = nullptr;
  const uint8_t* end_ = nullptr;
  uint32_t state_[kMaxWays] = {kLow, kLow, kLow, kLow};
  bool overrun_ = false;
};

void PutVarint(uint64_t v, std::string* out);
bool GetVarint(const uint8_t*& in, const uint8_t* end, uint64_t* v);

}  // namespace ckpt::rans
