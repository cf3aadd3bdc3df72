#include "entropy/rans.h"

#include <algorithm>
#include <cmath>

namespace ckpt::rans {

double Histogram::EntropyBits() const {
  double bits = 0;
  for (const auto& c : counts) {
    uint64_t total = 0;
    for (uint32_t n : c) total += n;
    if (total == 0) continue;
    for (uint32_t n : c) {
      if (n) bits -= n * std::log2(static_cast<double>(n) / static_cast<double>(total));
    }
  }
  return bits;
}

void Histogram::AddAll(const uint8_t* symbols, const uint8_t* contexts, size_t n) {
  // Short runs (a sampled row): setting up the sets below would cost more than it saves.
  constexpr size_t kMinForSets = 4096;
  if (n < kMinForSets) {
    for (size_t i = 0; i < n; ++i) Add(contexts ? contexts[i] : 0, symbols[i]);
    return;
  }
  // Four sets of counts, one per element of a group of four: a delta is mostly one symbol in
  // one context, and incrementing a single counter makes each step wait for the last one.
  const size_t per_set = counts.size() * kMaxSymbols;
  std::vector<uint32_t> sets(4 * per_set);
  uint32_t* set0 = sets.data();
  uint32_t* set1 = set0 + per_set;
  uint32_t* set2 = set1 + per_set;
  uint32_t* set3 = set2 + per_set;
  auto slot = [&](size_t i) {
    return (contexts ? size_t{contexts[i]} * kMaxSymbols : 0) + symbols[i];
  };
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++set0[slot(i)];
    ++set1[slot(i + 1)];
    ++set2[slot(i + 2)];
    ++set3[slot(i + 3)];
  }
  for (; i < n; ++i) ++set0[slot(i)];
  for (size_t c = 0; c < counts.size(); ++c) {
    for (uint32_t s = 0; s < kMaxSymbols; ++s) {
      const size_t k = c * kMaxSymbols + s;
      counts[c][s] += set0[k] + set1[k] + set2[k] + set3[k];
    }
  }
}

Table Normalize(const std::array<uint32_t, kMaxSymbols>& counts) {
  Table t;
  uint64_t total = 0;
  for (uint32_t n : counts) total += n;
  if (total == 0) return t;
  int64_t sum = 0;
  uint32_t largest = 0;
  for (uint32_t s = 0; s < kMaxSymbols; ++s) {
    if (!counts[s]) continue;
    const uint64_t scaled = (uint64_t{counts[s]} * kScale + total / 2) / total;
    t.freq[s] = static_cast<uint16_t>(std::clamp<uint64_t>(scaled, 1, kScale));
    sum += t.freq[s];
    if (counts[s] > counts[largest]) largest = s;
  }
  int64_t diff = static_cast<int64_t>(kScale) - sum;
  if (diff > 0) {
    t.freq[largest] = static_cast<uint16_t>(t.freq[largest] + diff);
  }
  while (diff < 0) {
    // Take from the symbol that loses least per unit of frequency: the most frequent one.
    uint32_t victim = kMaxSymbols;
    for (uint32_t s = 0; s < kMaxSymbols; ++s) {
      if (t.freq[s] > 1 && (victim == kMaxSymbols || t.freq[s] > t.freq[victim])) victim = s;
    }
    const int64_t take = std::min<int64_t>(-diff, t.freq[victim] - 1);
    t.freq[victim] = static_cast<uint16_t>(t.freq[victim] - take);
    diff += take;
  }
  uint32_t start = 0;
  for (uint32_t s = 0; s < kMaxSymbols; ++s) {
    t.start[s] = static_cast<uint16_t>(start);
    start += t.freq[s];
  }
  return t;
}

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(const uint8_t*& in, const uint8_t* end, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && in < end; shift += 7) {
    const uint8_t b = *in++;
    result |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) {
      *v = result;
      return true;
    }
  }
  return false;
}

namespace {
EncodeTable MakeEncodeTable(const Table& t) {
  EncodeTable out{};
  for (uint32_t s = 0; s < kMaxSymbols; ++s) {
    const uint32_t freq = t.freq[s];
    if (freq == 0) continue;
    EncodeSymbol& e = out[s];
    e.x_max = ((kLow >> kScaleBits) << 8) * freq;
    e.cmpl_freq = static_cast<uint16_t>(kScale - freq);
    if (freq < 2) {
      e.rcp_freq = ~0u;
      e.rcp_shift = 0;
      e.bias = t.start[s] + kScale - 1;
    } else {
      uint32_t shift = 0;
      while (freq > (1u << shift)) ++shift;
      e.rcp_freq = static_cast<uint32_t>(((uint64_t{1} << (shift + 31)) + freq - 1) / freq);
      e.rcp_shift = static_cast<uint16_t>(shift - 1);
      e.bias = t.start[s];
    }
  }
  return out;
}
}  // namespace

std::vector<EncodeTable> WriteTables(const Histogram& histogram, std::string* out) {
  std::vector<EncodeTable> tables;
  tables.reserve(histogram.counts.size());
  out->push_back(static_cast<char>(histogram.counts.size()));
  for (const auto& counts : histogram.counts) {
    Table t = Normalize(counts);
    uint32_t present = 0;
    for (uint16_t f : t.freq) present += f != 0;
    out->push_back(static_cast<char>(present));
    for (uint32_t s = 0; s < kMaxSymbols; ++s) {
      if (!t.freq[s]) continue;
      out->push_back(static_cast<char>(s));
      PutVarint(t.freq[s], out);
    }
    tables.push_back(MakeEncodeTable(t));
  }
  return tables;
}

namespace {
// Puts symbol i into state x (the reverse-growing output at *out).
template <bool kContexts>
inline void PutOne(const uint8_t* symbols, const uint8_t* contexts, const EncodeTable* tables,
                   size_t i, uint32_t& x, uint8_t*& out) {
  const EncodeSymbol& s = tables[kContexts ? contexts[i] : 0][symbols[i]];
  while (x >= s.x_max) {
    *--out = static_cast<uint8_t>(x & 0xff);
    x >>= 8;
  }
  const uint32_t q =
      static_cast<uint32_t>((static_cast<uint64_t>(x) * s.rcp_freq) >> 32) >> s.rcp_shift;
  x += s.bias + q * s.cmpl_freq;
}

template <bool kContexts>
void PutAllImpl(const uint8_t* symbols, const uint8_t* contexts, const EncodeTable* tables,
                size_t n, int ways, uint8_t* buffer, size_t* pos, uint32_t* state) {
  uint32_t x0 = state[0], x1 = state[1], x2 = state[2], x3 = state[3];
  uint8_t* out = buffer + *pos;
  size_t i = n;
  if (ways == 1) {
    while (i-- > 0) PutOne<kContexts>(symbols, contexts, tables, i, x0, out);
  } else {
    // Symbol i belongs to state i % 4; encode last to first.
    while (i % 4 != 0) {
      --i;
      uint32_t& x = i % 4 == 0 ? x0 : i % 4 == 1 ? x1 : x2;
      PutOne<kContexts>(symbols, contexts, tables, i, x, out);
    }
    while (i >= 4) {
      PutOne<kContexts>(symbols, contexts, tables, i - 1, x3, out);
      PutOne<kContexts>(symbols, contexts, tables, i - 2, x2, out);
      PutOne<kContexts>(symbols, contexts, tables, i - 3, x1, out);
      PutOne<kContexts>(symbols, contexts, tables, i - 4, x0, out);
      i -= 4;
    }
  }
  *pos = static_cast<size_t>(out - buffer);
  state[0] = x0;
  state[1] = x1;
  state[2] = x2;
  state[3] = x3;
}
}  // namespace

void Encoder::PutAll(const uint8_t* symbols, const uint8_t* contexts, const EncodeTable* tables,
                     size_t n) {
  if (contexts) {
    PutAllImpl<true>(symbols, contexts, tables, n, ways_, buffer_.data(), &pos_, state_);
  } else {
    PutAllImpl<false>(symbols, contexts, tables, n, ways_, buffer_.data(), &pos_, state_);
  }
}

void Encoder::Finish(std::string* out) {
  for (int w = ways_ - 1; w >= 0; --w) {
    for (int i = 3; i >= 0; --i) buffer_[--pos_] = static_cast<uint8_t>(state_[w] >> (8 * i));
  }
  const size_t n = buffer_.size() - pos_;
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(reinterpret_cast<const char*>(buffer_.data() + pos_), n);
}

namespace {
// The table of an unused context: a corrupt stream that uses it still decodes in bounded time
// (Decoder::Check then reports the corruption).
const std::vector<uint32_t>& UnusedContextSlots() {
  static const std::vector<uint32_t> slots(kScale, kScale << 7);
  return slots;
}
}  // namespace

Status DecodeTables::Read(const uint8_t*& in, const uint8_t* end, uint32_t contexts) {
  if (contexts > kMaxContexts || in >= end || *in != contexts) {
    return Status::DataLoss("rans: context count differs from the payload header");
  }
  ++in;
  // First pass: validate and count the used contexts, so slots_ is allocated once.
  const uint8_t* tables_begin = in;
  uint32_t used = 0;
  for (uint32_t c = 0; c < contexts; ++c) {
    if (in >= end) return Status::DataLoss("rans: truncated tables");
    const uint32_t present = *in++;
    if (present > kMaxSymbols) return Status::DataLoss("rans: too many symbols in a table");
    uint64_t total = 0;
    int last = -1;
    for (uint32_t k = 0; k < present; ++k) {
      uint64_t freq = 0;
      if (in >= end) return Status::DataLoss("rans: truncated tables");
      const uint32_t symbol = *in++;
      if (static_cast<int>(symbol) <= last || symbol >= kMaxSymbols || !GetVarint(in, end, &freq) ||
          freq == 0 || freq > kScale - total) {
        return Status::DataLoss("rans: malformed frequency table");
      }
      last = static_cast<int>(symbol);
      total += freq;
    }
    if (present != 0 && total != kScale) {
      return Status::DataLoss("rans: frequencies do not sum to the scale");
    }
    used += present != 0;
  }
  slots_.resize(size_t{used} * kScale);
  in = tables_begin;
  uint32_t* next = slots_.data();
  for (uint32_t c = 0; c < contexts; ++c) {
    const uint32_t present = *in++;
    if (present == 0) {
      contexts_[c] = UnusedContextSlots().data();
      continue;
    }
    contexts_[c] = next;
    uint32_t start = 0;
    for (uint32_t k = 0; k < present; ++k) {
      uint64_t freq = 0;
      const uint32_t symbol = *in++;
      GetVarint(in, end, &freq);
      const uint32_t entry = symbol | (static_cast<uint32_t>(freq) << 7) | (start << 20);
      std::fill(next + start, next + start + freq, entry);
      start += static_cast<uint32_t>(freq);
    }
    next += kScale;
  }
  // Contexts the payload declares no table for: a corrupt stream (or a reference whose element
  // history names contexts the encoder never used) must not reach a null table.
  for (uint32_t c = contexts; c < kMaxContexts; ++c) contexts_[c] = UnusedContextSlots().data();
  return Status::Ok();
}

Status Decoder::Init(const uint8_t*& in, const uint8_t* end, int ways) {
  if (end - in < 8) return Status::DataLoss("rans: truncated stream");
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{in[i]} << (8 * i);
  in += 4;
  const uint32_t state_bytes = ways == kMaxWays ? 4 * kMaxWays : 4;
  if (n < state_bytes || n > static_cast<size_t>(end - in)) {
    return Status::DataLoss("rans: coded length out of range");
  }
  // A one-way stream leaves the other states at their final value, so that Check() holds.
  for (uint32_t& x : state_) x = kLow;
  for (uint32_t w = 0; w < state_bytes / 4; ++w) {
    state_[w] = 0;
    for (int i = 0; i < 4; ++i) state_[w] |= uint32_t{in[4 * w + i]} << (8 * i);
  }
  in_ = in + state_bytes;
  end_ = in + n;
  in += n;
  return Status::Ok();
}

}  // namespace ckpt::rans
