// Shards as global tensors (shard_assembly.h).
#include "uploads/shard_assembly.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/hashing.h"
#include "ckpt/codec/chunk_record.h"
#include "uploads/encoded_shard.h"

namespace ckpt {
namespace {

using nlohmann::json;

// Bytes read from a shard at a time, and the most the assembly hands `write` at once.
constexpr size_t kReadBlockBytes = 1 << 20;
constexpr size_t kWriteBlockBytes = 4 << 20;

std::string ShardText(uint32_t shard) { return "shard " + std::to_string(shard); }

std::string DimsText(std::span<const uint64_t> dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string PieceText(uint32_t shard, const TensorBox& box) {
  return ShardText(shard) + "'s slice " + DimsText(box.shape) + " at " + DimsText(box.offsets);
}

// Reads one piece of a shard in its own order, a block at a time.
class PieceReader {
 public:
  PieceReader(const SpooledShardFile* file, uint64_t begin) : file_(file), next_(begin) {}
  Status Read(uint8_t* out, uint64_t bytes) {
    while (bytes > 0) {
      if (pos_ == buffer_.size()) {
        const uint64_t left = file_->body_bytes() - next_;
        buffer_.resize(std::min<uint64_t>(kReadBlockBytes, left));
        if (buffer_.empty()) return Status::DataLoss("stored shard ends early");
        CKPT_RETURN_IF_ERROR(file_->ReadAt(next_, buffer_));
        next_ += buffer_.size();
        pos_ = 0;
      }
      const uint64_t take = std::min<uint64_t>(bytes, buffer_.size() - pos_);
      std::memcpy(out, buffer_.data() + pos_, take);
      pos_ += take;
      out += take;
      bytes -= take;
    }
    return Status::Ok();
  }

 private:
  const SpooledShardFile* file_;
  uint64_t next_;
  std::vector<uint8_t> buffer_;
  size_t pos_ = 0;
};

}  // namespace

Result<ShardHeader> DescribeShard(uint32_t shard, const SafetensorsHeader& header) {
  CKPT_ASSIGN_OR_RETURN(auto slices, ParseSliceDeclarations(header.metadata));
  ShardHeader out;
  out.shard = shard;
  out.metadata = header.metadata;
  out.metadata.erase(std::string(kSlicesMetadataKey));
  out.metadata.erase(std::string(kLayoutMetadataKey));
  const uint64_t data_start = 8 + header.json_size;
  for (const TensorInfo& t : header.tensors) {
    ShardTensor st;
    st.name = t.name;
    st.dtype = t.dtype;
    st.box.shape = t.shape;
    st.data_begin = data_start + t.begin;
    if (auto it = slices.find(t.name); it != slices.end()) {
      uint64_t bytes = DTypeSize(t.dtype);
      for (uint64_t d : it->second.global_shape) {
        if (__builtin_mul_overflow(bytes, d, &bytes)) {
          return Status::InvalidArgument(ShardText(shard) + ": tensor '" + t.name +
                                         "': its global shape is too large");
        }
      }
      st.global_shape = it->second.global_shape;
      st.box.offsets = it->second.offsets;
      slices.erase(it);
      Status within = CheckBoxWithin(t.name, st.box, st.global_shape);
      if (!within.ok()) return within.WithContext(ShardText(shard));
    } else {
      st.global_shape = t.shape;
      st.box.offsets.assign(t.shape.size(), 0);
    }
    out.tensors.push_back(std::move(st));
  }
  if (!slices.empty()) {
    return Status::InvalidArgument(ShardText(shard) + ": metadata '" +
                                   std::string(kSlicesMetadataKey) + "' declares tensor '" +
                                   slices.begin()->first + "', which the shard does not hold");
  }
  return out;
}

Result<ShardHeader> ReadShardHeader(uint32_t shard, const SpooledShardFile& file) {
  uint8_t prefix[8];
  CKPT_RETURN_IF_ERROR(file.ReadAt(0, prefix));
  uint64_t json_size = 0;
  for (int i = 7; i >= 0; --i) json_size = (json_size << 8) | prefix[i];
  if (json_size > kMaxSafetensorsHeaderBytes || 8 + json_size > file.body_bytes()) {
    return Status::DataLoss("stored " + ShardText(shard) + " has a damaged header");
  }
  std::string json_text(json_size, '\0');
  CKPT_RETURN_IF_ERROR(file.ReadAt(
      8, std::span<uint8_t>(reinterpret_cast<uint8_t*>(json_text.data()), json_text.size())));
  CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ParseSafetensorsHeader(json_text, file.body_bytes()));
  return DescribeShard(shard, header);
}

Status CheckShardAgainst(const ShardHeader& shard, std::span<const ShardHeader* const> others) {
  std::unordered_map<std::string_view, const ShardTensor*> mine;
  for (const ShardTensor& t : shard.tensors) mine.emplace(t.name, &t);
  for (const ShardHeader* other : others) {
    if (other->shard == shard.shard) continue;
    for (const ShardTensor& theirs : other->tensors) {
      auto it = mine.find(theirs.name);
      if (it == mine.end()) continue;
      const ShardTensor& t = *it->second;
      auto fail = [&](const std::string& what) {
        return Status::InvalidArgument("tensor '" + t.name + "': " + ShardText(shard.shard) +
                                       " and " + ShardText(other->shard) + " " + what);
      };
      if (t.dtype != theirs.dtype) {
        return fail("disagree on its dtype (" + std::string(DTypeName(t.dtype)) + " and " +
                    std::string(DTypeName(theirs.dtype)) + ")");
      }
      if (t.global_shape != theirs.global_shape) {
        return fail("disagree on its global shape (" + DimsText(t.global_shape) + " and " +
                    DimsText(theirs.global_shape) + ")");
      }
      // Two copies of a whole tensor are replicas (checked equal at the commit); parts of a
      // sliced one must not meet.
      const bool replicas = t.box == theirs.box && t.box.shape == t.global_shape;
      if (!replicas && BoxesOverlap(t.box, theirs.box)) {
        return fail("hold overlapping slices (" + PieceText(shard.shard, t.box) + ", " +
                    PieceText(other->shard, theirs.box) + ")");
      }
    }
  }
  return Status::Ok();
}

Result<AssemblyPlan> PlanAssembly(std::span<const ShardHeader* const> shards,
                                  std::span<const std::string> shard_sha256) {
  AssemblyPlan plan;
  std::unordered_map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;
  for (const ShardHeader* shard : shards) {
    CKPT_RETURN_IF_ERROR(CheckShardAgainst(*shard, shards));
    for (const auto& entry : shard->metadata) metadata.insert(entry);  // lowest shard wins
    for (const ShardTensor& t : shard->tensors) {
      auto [it, added] = index.emplace(t.name, plan.tensors.size());
      if (added) {
        AssemblyPlan::Tensor& g = plan.tensors.emplace_back();
        g.name = t.name;
        g.dtype = t.dtype;
        g.shape = t.global_shape;
      }
      AssemblyPlan::Tensor& g = plan.tensors[it->second];
      AssemblyPlan::Piece piece{shard->shard, static_cast<uint32_t>(&t - shard->tensors.data()),
                                t.box, t.data_begin};
      auto same = std::find_if(g.pieces.begin(), g.pieces.end(),
                               [&](const AssemblyPlan::Piece& p) { return p.box == t.box; });
      if (same != g.pieces.end()) {
        g.replicas.emplace_back(same - g.pieces.begin(), std::move(piece));
      } else {
        g.pieces.push_back(std::move(piece));
      }
    }
  }
  json layout_tensors = json::object();
  std::vector<TensorSpec> specs;
  for (const AssemblyPlan::Tensor& g : plan.tensors) {
    std::vector<TensorBox> boxes;
    for (const auto& p : g.pieces) boxes.push_back(p.box);
    CKPT_RETURN_IF_ERROR(CheckTiling(g.name, g.shape, boxes, [&](size_t i) {
      return PieceText(g.pieces[i].shard, g.pieces[i].box);
    }));
    json slices = json::array();
    auto add = [&](const AssemblyPlan::Piece& p) {
      slices.push_back({{"shard", p.shard}, {"offsets", p.box.offsets}, {"shape", p.box.shape}});
    };
    for (const auto& p : g.pieces) add(p);
    for (const auto& [i, p] : g.replicas) add(p);
    layout_tensors[g.name] = {{"dtype", std::string(DTypeName(g.dtype))},
                              {"global_shape", g.shape},
                              {"slices", std::move(slices)}};
    specs.push_back(TensorSpec{g.name, g.dtype, g.shape, {}});
  }
  const json layout = {
      {"format", 1},
      {"shards", shards.size()},
      {"shard_sha256", std::vector<std::string>(shard_sha256.begin(), shard_sha256.end())},
      {"tensors", std::move(layout_tensors)}};
  metadata[std::string(kLayoutMetadataKey)] = layout.dump();
  CKPT_ASSIGN_OR_RETURN(plan.raw_header, WriteSafetensorsHeader(specs, metadata));
  plan.body_bytes = plan.raw_header.size();
  for (const auto& g : plan.tensors) {
    uint64_t bytes = DTypeSize(g.dtype);
    for (uint64_t d : g.shape) bytes *= d;
    plan.body_bytes += bytes;
  }
  return plan;
}

Status WriteAssembled(const AssemblyPlan& plan, std::span<const SpooledShardFile* const> files,
                      const std::function<Status(std::span<const uint8_t>)>& write) {
  // Replicas first: a disagreement is found before anything is pushed.
  for (const AssemblyPlan::Tensor& g : plan.tensors) {
    for (const auto& [i, replica] : g.replicas) {
      const AssemblyPlan::Piece& piece = g.pieces[i];
      uint64_t left = piece.box.element_count() * DTypeSize(g.dtype);
      PieceReader a(files[piece.shard], piece.data_begin);
      PieceReader b(files[replica.shard], replica.data_begin);
      std::vector<uint8_t> x(kReadBlockBytes), y(kReadBlockBytes);
      while (left > 0) {
        const uint64_t n = std::min<uint64_t>(left, kReadBlockBytes);
        CKPT_RETURN_IF_ERROR(a.Read(x.data(), n));
        CKPT_RETURN_IF_ERROR(b.Read(y.data(), n));
        if (std::memcmp(x.data(), y.data(), n) != 0) {
          return Status::InvalidArgument("tensor '" + g.name + "': " + ShardText(piece.shard) +
                                         " and " + ShardText(replica.shard) +
                                         " hold the same slice with different values");
        }
        left -= n;
      }
    }
  }
  CKPT_RETURN_IF_ERROR(write(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(plan.raw_header.data()), plan.raw_header.size())));
  std::vector<uint8_t> out;
  out.reserve(kWriteBlockBytes);
  auto flush = [&]() -> Status {
    Status s = out.empty() ? Status::Ok() : write(out);
    out.clear();
    return s;
  };
  for (const AssemblyPlan::Tensor& g : plan.tensors) {
    const uint64_t element = DTypeSize(g.dtype);
    std::vector<PieceReader> readers;
    std::vector<TensorBox> boxes;
    for (const auto& p : g.pieces) {
      readers.emplace_back(files[p.shard], p.data_begin);
      boxes.push_back(p.box);
    }
    Status status;
    ForEachTileRun(g.shape, boxes, [&](size_t box, uint64_t count) {
      uint64_t bytes = count * element;
      while (bytes > 0 && status.ok()) {
        if (out.size() == kWriteBlockBytes) status = flush();
        const uint64_t take = std::min<uint64_t>(bytes, kWriteBlockBytes - out.size());
        const size_t at = out.size();
        out.resize(at + take);
        if (status.ok()) status = readers[box].Read(out.data() + at, take);
        bytes -= take;
      }
      return status.ok();
    });
    CKPT_RETURN_IF_ERROR(status);
  }
  return flush();
}

}  // namespace ckpt

namespace ckpt {
namespace {

// Reads a piece's bytes (its slice, row-major) in increasing order, skipping what it need not
// read: from a safetensors shard at its data, from an encoded shard through its raw segments.
class PieceCursor {
 public:
  PieceCursor(const ShardSource& source, const AssemblyPlan::Piece& piece, uint64_t bytes)
      : file_(source.file),
        segments_(source.encoded ? &source.encoded->tensors[piece.tensor] : nullptr),
        data_begin_(piece.data_begin),
        bytes_(bytes) {}

  void Skip(uint64_t n) { pos_ += n; }
  void Seek(uint64_t pos) { pos_ = pos; }

  Status Read(uint8_t* out, uint64_t n) {
    while (n > 0) {
      if (pos_ < buffer_begin_ || pos_ >= buffer_begin_ + buffer_.size()) {
        CKPT_RETURN_IF_ERROR(Fill());
      }
      const uint64_t at = pos_ - buffer_begin_;
      const uint64_t take = std::min<uint64_t>(n, buffer_.size() - at);
      std::memcpy(out, buffer_.data() + at, take);
      out += take;
      n -= take;
      pos_ += take;
    }
    return Status::Ok();
  }

 private:
  // Reads a block from pos_, within one contiguous run of the file.
  Status Fill() {
    if (pos_ >= bytes_) return Status::DataLoss("stored shard: a slice ends early");
    uint64_t file_offset = data_begin_ + pos_;
    uint64_t contiguous = bytes_ - pos_;
    if (segments_) {
      auto it = std::upper_bound(
          segments_->begin(), segments_->end(), pos_,
          [](uint64_t p, const EncodedShardIndex::Segment& s) { return p < s.offset; });
      if (it == segments_->begin()) return Status::DataLoss("stored encoded shard: no segment");
      const EncodedShardIndex::Segment& s = *std::prev(it);
      if (!s.raw || pos_ >= s.offset + s.length) {
        return Status::Internal("stored encoded shard: bytes coded by the rank were needed raw");
      }
      file_offset = s.file_offset + (pos_ - s.offset);
      contiguous = s.offset + s.length - pos_;
    }
    buffer_.resize(std::min<uint64_t>(kReadBlockBytes, contiguous));
    CKPT_RETURN_IF_ERROR(file_->ReadAt(file_offset, buffer_));
    buffer_begin_ = pos_;
    return Status::Ok();
  }

  const SpooledShardFile* file_;
  const std::vector<EncodedShardIndex::Segment>* segments_;
  uint64_t data_begin_;
  uint64_t bytes_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buffer_;
  uint64_t buffer_begin_ = 0;
};

// A chunk a rank coded: its record in that shard's file.
struct CodedChunkAt {
  const SpooledShardFile* file = nullptr;
  const EncodedShardIndex::Segment* segment = nullptr;
  uint32_t shard = 0;
};

// The chunks of global tensor `t` that the shard holding `piece` coded, by chunk (empty where
// it sent bytes): DataLoss when a record does not lie where its chunk does in the slice.
Result<std::vector<CodedChunkAt>> CodedChunksOf(const ShardSource& source,
                                                const AssemblyPlan::Piece& piece,
                                                const PlannedTensor& t) {
  std::vector<CodedChunkAt> out(t.chunk_count);
  if (!source.encoded) return out;
  const uint64_t first = BoxElementSpan(t.shape, piece.box).first * DTypeSize(t.dtype);
  std::optional<ChunkGrid> grid;
  if (!t.tile_counts.empty()) {
    CKPT_ASSIGN_OR_RETURN(grid, t.Grid());
  }
  for (const EncodedShardIndex::Segment& s : source.encoded->tensors[piece.tensor]) {
    if (s.raw) continue;
    // A tiled tensor's chunk is coded by the shard whose slice is its tile: it lies in the
    // slice where it does in the tile.
    const bool placed =
        s.chunk < t.chunk_count &&
        (grid ? grid->TileBox(grid->TileOf(s.chunk)) == piece.box &&
                    grid->FirstElementInTile(s.chunk) * DTypeSize(t.dtype) == s.offset
              : uint64_t{s.chunk} * t.chunk_bytes >= first &&
                    uint64_t{s.chunk} * t.chunk_bytes - first == s.offset);
    if (!placed || s.length != t.ChunkLength(s.chunk)) {
      return Status::DataLoss("stored encoded " + ShardText(piece.shard) + ": chunk " +
                              std::to_string(s.chunk) + " of tensor '" + t.name +
                              "' does not lie where that chunk does");
    }
    out[s.chunk] = {source.file, &s, piece.shard};
  }
  return out;
}

Result<std::string> ReadRecord(const CodedChunkAt& coded) {
  std::string record(coded.segment->record_bytes, '\0');
  CKPT_RETURN_IF_ERROR(coded.file->ReadAt(
      coded.segment->file_offset,
      std::span<uint8_t>(reinterpret_cast<uint8_t*>(record.data()), record.size())));
  return record;
}

// One copy's next chunk of `length` bytes: its record (read into `text`, parsed into
// `record`) where its rank coded it, else its bytes.
Status TakeChunk(PieceCursor& cursor, const CodedChunkAt& coded, uint64_t length,
                 std::vector<uint8_t>* bytes, std::string* text,
                 std::optional<ChunkRecord>* record) {
  if (!coded.segment) {
    bytes->resize(length);
    return cursor.Read(bytes->data(), length);
  }
  cursor.Skip(length);
  CKPT_ASSIGN_OR_RETURN(*text, ReadRecord(coded));
  CKPT_ASSIGN_OR_RETURN(*record, ChunkRecord::DecodeFrom(*text));
  return Status::Ok();
}

// Checks that two copies of a whole tensor agree, chunk by chunk.
Status CompareReplicas(const AssemblyPlan::Tensor& g, const PlannedTensor& t,
                       const AssemblyPlan::Piece& a, const AssemblyPlan::Piece& b,
                       std::span<const ShardSource> shards) {
  const auto fail = [&](uint32_t chunk) {
    return Status::InvalidArgument(
        "tensor '" + g.name + "': " + ShardText(a.shard) + " and " + ShardText(b.shard) +
        " hold the same slice with different values (chunk " + std::to_string(chunk) + ")");
  };
  PieceCursor ca(shards[a.shard], a, t.byte_size), cb(shards[b.shard], b, t.byte_size);
  CKPT_ASSIGN_OR_RETURN(const auto coded_a, CodedChunksOf(shards[a.shard], a, t));
  CKPT_ASSIGN_OR_RETURN(const auto coded_b, CodedChunksOf(shards[b.shard], b, t));
  std::vector<uint8_t> xa, xb;
  for (uint32_t c = 0; c < t.chunk_count; ++c) {
    const uint64_t length = t.ChunkLength(c);
    const CodedChunkAt& ka = coded_a[c];
    const CodedChunkAt& kb = coded_b[c];
    std::optional<ChunkRecord> ra, rb;
    std::string sa, sb;
    CKPT_RETURN_IF_ERROR(TakeChunk(ca, ka, length, &xa, &sa, &ra));
    CKPT_RETURN_IF_ERROR(TakeChunk(cb, kb, length, &xb, &sb, &rb));
    constexpr auto kLossless = static_cast<uint16_t>(CodecId::kLosslessBytePlanes);
    if (ra && rb) {
      if (ra->raw_checksum != rb->raw_checksum) return fail(c);
    } else if (!ra && !rb) {
      if (xa != xb) return fail(c);
    } else {
      const ChunkRecord& r = ra ? *ra : *rb;
      if (r.codec_id == kLossless && r.raw_checksum != Xxh3Checksum(ra ? xb : xa)) return fail(c);
    }
  }
  return Status::Ok();
}

}  // namespace

Status WriteAssembledChunks(const AssemblyPlan& assembly, const CodingPlan& plan,
                            std::span<const ShardSource> shards, ChunkedPush& push) {
  if (plan.tensors.size() != assembly.tensors.size()) {
    return Status::Internal("assembly: the plan does not describe the assembled version");
  }
  for (size_t gi = 0; gi < assembly.tensors.size(); ++gi) {
    const AssemblyPlan::Tensor& g = assembly.tensors[gi];
    for (const auto& [i, replica] : g.replicas) {
      CKPT_RETURN_IF_ERROR(CompareReplicas(g, plan.tensors[gi], g.pieces[i], replica, shards));
    }
  }
  for (size_t gi = 0; gi < assembly.tensors.size(); ++gi) {
    const AssemblyPlan::Tensor& g = assembly.tensors[gi];
    const PlannedTensor& t = plan.tensors[gi];
    if (t.name != g.name) {
      return Status::Internal("assembly: the plan does not describe the assembled version");
    }
    if (t.chunk_count == 0) continue;
    const uint64_t element = DTypeSize(t.dtype);
    // The record of each chunk a rank coded (a replica's, when the first copy is raw).
    std::vector<CodedChunkAt> coded(t.chunk_count);
    auto note = [&](const AssemblyPlan::Piece& p) -> Status {
      CKPT_ASSIGN_OR_RETURN(const auto in_piece, CodedChunksOf(shards[p.shard], p, t));
      for (uint32_t c = 0; c < t.chunk_count; ++c) {
        if (in_piece[c].segment && !coded[c].segment) coded[c] = in_piece[c];
      }
      return Status::Ok();
    };
    for (const auto& p : g.pieces) CKPT_RETURN_IF_ERROR(note(p));
    for (const auto& [i, p] : g.replicas) CKPT_RETURN_IF_ERROR(note(p));

    std::vector<PieceCursor> cursors;
    std::vector<TensorBox> boxes;
    for (const auto& p : g.pieces) {
      cursors.emplace_back(shards[p.shard], p, p.box.element_count() * element);
      boxes.push_back(p.box);
    }
    std::vector<uint8_t> chunk(t.chunk_bytes);
    uint64_t position = 0;  // the next byte of the global tensor
    Status status;
    auto emit = [&](uint32_t c) -> Status {
      if (!coded[c].segment) return push.RawChunk(gi, c, {chunk.data(), t.ChunkLength(c)});
      CKPT_ASSIGN_OR_RETURN(const std::string record, ReadRecord(coded[c]));
      return push.CodedChunk(gi, c, record, coded[c].segment->info, coded[c].shard);
    };
    if (!t.tile_counts.empty()) {
      // A tiled tensor's chunks, in order: each gathered from the slices that meet its tile.
      CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());
      for (uint32_t c = 0; c < t.chunk_count; ++c) {
        if (!coded[c].segment) {
          for (size_t p = 0; p < boxes.size() && status.ok(); ++p) {
            grid.ForEachRun(
                boxes[p],
                [&](const GridRun& run) {
                  if (run.chunk != c) return run.chunk < c;
                  cursors[p].Seek(run.box_element * element);
                  status = cursors[p].Read(chunk.data() + run.chunk_element * element,
                                           run.count * element);
                  return status.ok();
                },
                grid.TileOf(c));
          }
        }
        if (status.ok()) status = emit(c);
        CKPT_RETURN_IF_ERROR(status);
      }
      continue;
    }
    ForEachTileRun(g.shape, boxes, [&](size_t box, uint64_t count) {
      for (uint64_t left = count * element; left > 0 && status.ok();) {
        const uint32_t c = static_cast<uint32_t>(position / t.chunk_bytes);
        const uint64_t chunk_begin = uint64_t{c} * t.chunk_bytes;
        const uint64_t chunk_end = chunk_begin + t.ChunkLength(c);
        const uint64_t take = std::min(left, chunk_end - position);
        if (coded[c].segment) {
          cursors[box].Skip(take);
        } else {
          status = cursors[box].Read(chunk.data() + (position - chunk_begin), take);
        }
        position += take;
        left -= take;
        if (status.ok() && position == chunk_end) status = emit(c);
      }
      return status.ok();
    });
    CKPT_RETURN_IF_ERROR(status);
    if (position != t.byte_size) {
      return Status::Internal("assembly: tensor '" + g.name + "' was not assembled whole");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt
