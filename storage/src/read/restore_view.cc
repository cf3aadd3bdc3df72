// The restore of part of a version (restore_view.h).
#include "read/restore_view.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/base/tensor_slices.h"
#include "read/chain_reader.h"
#include "read/view_plan.h"
#include "uploads/shard_assembly.h"

namespace ckpt {
namespace {

using nlohmann::json;

// The most bytes of a box gathered into one piece of the body, and the part of a run within a
// chunk that is sent from the chunk without a copy.
constexpr size_t kGatherBytes = 1 << 20;
constexpr size_t kDirectBytes = 64 << 10;

class RestoreViewImpl final : public RestoreStream {
 public:
  RestoreViewImpl(const StoreContext& ctx, ScopedSnapshot snapshot, std::string model,
                  VersionInfo info, VersionRecord record, uint64_t cache_generation)
      : ctx_(ctx),
        snapshot_(std::move(snapshot)),
        info_(std::move(info)),
        record_(std::move(record)),
        reader_(ctx.db, ctx.manifests, ctx.backend, snapshot_.get(), std::move(model), ctx.cache,
                cache_generation) {}

  ~RestoreViewImpl() override {
    ctx_.counters->restore_links_decoded.fetch_add(reader_.links_decoded(),
                                                   std::memory_order_relaxed);
  }

  Status Init(const RestoreSelection& selection) {
    if (selection.bytes) return InitRange(*selection.bytes);
    CKPT_ASSIGN_OR_RETURN(manifest_, reader_.Manifest(record_.seq));
    CKPT_ASSIGN_OR_RETURN(ViewPlan plan, PlanView(*manifest_, record_, info_.version, selection));
    ctx_.counters->restores.fetch_add(1, std::memory_order_relaxed);  // a restore that can be sent
    view_ = std::move(plan.tensors);
    header_bytes_ = std::move(plan.raw_header);
    size_ = plan.body_bytes;
    info_.sha256.clear();  // of this body: not known before it is made
    return Status::Ok();
  }

  const VersionInfo& info() const override { return info_; }
  uint64_t size() const override { return size_; }

  Result<std::span<const uint8_t>> Next() override {
    if (range_) return NextInRange();
    if (!header_sent_) {
      header_sent_ = true;
      return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(header_bytes_.data()),
                                      header_bytes_.size());
    }
    while (next_view_ < view_.size()) {
      const ViewTensor& v = view_[next_view_];
      const ManifestTensor& t = manifest_->tensors[v.tensor];
      if (!t.tile_counts.empty()) {  // its chunks are no runs of the body: a band at a time
        const TensorBox box = v.whole ? WholeBox(t.shape) : v.box;
        if (!band_row_) band_row_ = box.offsets.empty() ? 0 : box.offsets[0];
        const uint64_t box_end = box.offsets.empty() ? 1 : box.offsets[0] + box.shape[0];
        if (box.element_count() > 0 && *band_row_ < box_end) {
          CKPT_ASSIGN_OR_RETURN(piece_, AssembleBand(v.tensor, t, box));
          return std::span<const uint8_t>(*piece_);
        }
      } else if (v.whole) {
        if (next_chunk_ < t.chunk_count) {
          CKPT_RETURN_IF_ERROR(
              reader_.DecodeSharedChunk(record_.seq, v.tensor, next_chunk_++, &piece_));
          return std::span<const uint8_t>(*piece_);
        }
      } else {
        CKPT_ASSIGN_OR_RETURN(const std::span<const uint8_t> piece, Gather(v, t));
        if (!piece.empty()) return piece;
      }
      ++next_view_;
      next_chunk_ = 0;
      band_row_.reset();
      runs_.reset();
    }
    return std::span<const uint8_t>();
  }

 private:
  // A byte range of the whole body: the stored header, then every tensor whole.
  Status InitRange(std::pair<uint64_t, uint64_t> bytes) {
    if (bytes.first >= record_.raw_bytes || bytes.first > bytes.second) {
      return Status::InvalidArgument("byte range " + std::to_string(bytes.first) + "-" +
                                     std::to_string(bytes.second) + " is outside the body of " +
                                     std::to_string(record_.raw_bytes) + " bytes");
    }
    ctx_.counters->restores.fetch_add(1, std::memory_order_relaxed);
    CKPT_ASSIGN_OR_RETURN(manifest_, reader_.Manifest(record_.seq));
    range_ = std::make_pair(bytes.first, std::min(bytes.second, record_.raw_bytes - 1));
    size_ = range_->second - range_->first + 1;
    position_ = 0;
    return Status::Ok();
  }

  // The next piece of the range: the pieces of the whole body that overlap it, clipped; the
  // chunks before it are skipped without being read.
  Result<std::span<const uint8_t>> NextInRange() {
    auto clip = [&](std::span<const uint8_t> piece) {
      const uint64_t begin = position_, end = position_ + piece.size();
      position_ = end;
      const uint64_t from = std::max(begin, range_->first);
      const uint64_t to = std::min(end, range_->second + 1);
      return piece.subspan(from - begin, to - from);
    };
    if (!header_sent_) {
      header_sent_ = true;
      const std::span<const uint8_t> header(
          reinterpret_cast<const uint8_t*>(record_.raw_header.data()), record_.raw_header.size());
      if (header.size() > range_->first) return clip(header);
      position_ = header.size();
    }
    while (next_view_ < manifest_->tensors.size() && position_ <= range_->second) {
      const ManifestTensor& t = manifest_->tensors[next_view_];
      if (next_chunk_ >= t.chunk_count || record_.Dropped(next_view_)) {
        ++next_view_;
        next_chunk_ = 0;
        continue;
      }
      if (!t.tile_counts.empty()) {  // a band at a time, where the range meets it
        if (!band_row_ && position_ + t.byte_size <= range_->first) {
          position_ += t.byte_size;
          ++next_view_;
          continue;
        }
        CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());  // rank >= 1 then
        const uint32_t tensor = next_view_;
        const uint64_t row = band_row_.value_or(0);
        const uint64_t end = grid.BandEnd(row);
        const uint64_t bytes = (end - row) * (t.byte_size / t.shape[0]);
        band_row_ = end;
        if (end == t.shape[0]) {
          ++next_view_;
          band_row_.reset();
        }
        if (position_ + bytes <= range_->first) {
          position_ += bytes;
          continue;
        }
        TensorBox band = WholeBox(t.shape);
        band.offsets[0] = row;
        band.shape[0] = end - row;
        CKPT_ASSIGN_OR_RETURN(piece_, Assemble(tensor, t, grid, band));
        return clip(std::span<const uint8_t>(*piece_));
      }
      const uint64_t length = ChainReader::ChunkLength(t, next_chunk_);
      if (position_ + length <= range_->first) {
        position_ += length;
        ++next_chunk_;
        continue;
      }
      CKPT_RETURN_IF_ERROR(
          reader_.DecodeSharedChunk(record_.seq, next_view_, next_chunk_++, &piece_));
      if (piece_->size() != length) {
        return Status::DataLoss("a decoded chunk differs in length from its record");
      }
      return clip(std::span<const uint8_t>(*piece_));
    }
    return std::span<const uint8_t>();
  }

  // The band of box `box` of tiled tensor `t` (index `tensor`) that starts at row *band_row_
  // (ChunkGrid::BandEnd, within the box), in row-major order; moves band_row_ past it.
  Result<ReferenceCache::Chunk> AssembleBand(uint32_t tensor, const ManifestTensor& t,
                                             const TensorBox& box) {
    CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());  // rank >= 1 then
    const uint64_t end = std::min(box.offsets[0] + box.shape[0], grid.BandEnd(*band_row_));
    TensorBox band = box;
    band.offsets[0] = *band_row_;
    band.shape[0] = end - *band_row_;
    band_row_ = end;
    return Assemble(tensor, t, grid, band);
  }

  // Box `box` of tiled tensor `t` (index `tensor`, chunks cut by `grid`), in its row-major order:
  // each chunk holding part of it decoded once.
  Result<ReferenceCache::Chunk> Assemble(uint32_t tensor, const ManifestTensor& t,
                                         const ChunkGrid& grid, const TensorBox& box) {
    const uint64_t element = DTypeSize(t.dtype);
    auto out = std::make_shared<std::vector<uint8_t>>(box.element_count() * element);
    ReferenceCache::Chunk chunk;
    for (const auto& [begin, end] : grid.ChunkRanges(box)) {
      for (uint32_t c = begin; c < end; ++c) {
        CKPT_RETURN_IF_ERROR(reader_.DecodeSharedChunk(record_.seq, tensor, c, &chunk));
        if (chunk->size() != grid.ChunkElements(c) * element) {
          return Status::DataLoss("a decoded chunk differs in length from its record");
        }
        CopyChunkToBox(grid, box, c, element, *chunk, *out);
      }
    }
    return ReferenceCache::Chunk(std::move(out));
  }

  // The next bytes of box `v` of `t`, empty once the box is done: a run's part within one
  // decoded chunk is sent from the chunk itself when it is large (a slice along dimension 0 is
  // one run, so it is never copied); smaller parts (rows of a column slice) are gathered.
  Result<std::span<const uint8_t>> Gather(const ViewTensor& v, const ManifestTensor& t) {
    const uint64_t element = DTypeSize(t.dtype);
    if (!runs_) {
      runs_.emplace(t.shape, v.box);
      run_begin_ = run_end_ = 0;
    }
    gathered_.clear();
    while (gathered_.size() < kGatherBytes) {
      if (run_begin_ == run_end_) {
        uint64_t first = 0, count = 0;
        if (!runs_->Next(&first, &count)) break;
        run_begin_ = first * element;
        run_end_ = (first + count) * element;
      }
      const uint32_t chunk = static_cast<uint32_t>(run_begin_ / t.chunk_bytes);
      const uint64_t chunk_begin = uint64_t{chunk} * t.chunk_bytes;
      const uint64_t in_chunk = std::min(run_end_, chunk_begin + t.chunk_bytes) - run_begin_;
      // A large part goes out on its own; what was gathered before it goes first.
      if (in_chunk >= kDirectBytes && !gathered_.empty()) break;
      if (!chunk_ || chunk_index_ != chunk) {
        CKPT_RETURN_IF_ERROR(reader_.DecodeSharedChunk(record_.seq, v.tensor, chunk, &chunk_));
        chunk_index_ = chunk;
      }
      if (chunk_begin + chunk_->size() < run_begin_ + in_chunk) {
        return Status::DataLoss("a decoded chunk is shorter than recorded");
      }
      const uint8_t* from = chunk_->data() + (run_begin_ - chunk_begin);
      if (in_chunk >= kDirectBytes) {
        run_begin_ += in_chunk;
        return std::span<const uint8_t>(from, in_chunk);
      }
      const uint64_t take = std::min<uint64_t>(in_chunk, kGatherBytes - gathered_.size());
      gathered_.insert(gathered_.end(), from, from + take);
      run_begin_ += take;
    }
    if (gathered_.empty()) chunk_.reset();
    return std::span<const uint8_t>(gathered_);
  }

  const StoreContext& ctx_;
  const ScopedSnapshot snapshot_;  // first: released after everything reading through it
  VersionInfo info_;
  VersionRecord record_;
  ChainReader reader_;
  const ManifestRecord* manifest_ = nullptr;
  std::vector<ViewTensor> view_;
  std::string header_bytes_;
  uint64_t size_ = 0;
  bool header_sent_ = false;
  size_t next_view_ = 0;
  uint32_t next_chunk_ = 0;           // whole tensors: the next chunk to send
  std::optional<uint64_t> band_row_;  // tiled tensors: the first row of the next band
  ReferenceCache::Chunk piece_;       // the chunk handed out last
  // Boxes: the runs left, the current run's byte range, the chunk it reads.
  std::optional<BoxRuns> runs_;
  uint64_t run_begin_ = 0, run_end_ = 0;
  ReferenceCache::Chunk chunk_;
  uint32_t chunk_index_ = 0;
  std::vector<uint8_t> gathered_;
  // A byte range of the whole body: [first, last], and the body offset of the next piece.
  std::optional<std::pair<uint64_t, uint64_t>> range_;
  uint64_t position_ = 0;
};

}  // namespace

Result<std::unique_ptr<RestoreStream>> OpenRestoreView(const StoreContext& ctx,
                                                       ScopedSnapshot snapshot, std::string model,
                                                       VersionInfo info, VersionRecord record,
                                                       uint64_t cache_generation,
                                                       const RestoreSelection& selection) {
  auto view =
      std::make_unique<RestoreViewImpl>(ctx, std::move(snapshot), std::move(model), std::move(info),
                                        std::move(record), cache_generation);
  CKPT_RETURN_IF_ERROR(view->Init(selection));
  return std::unique_ptr<RestoreStream>(std::move(view));
}

Result<std::string> ShardLayoutOf(const VersionRecord& record) {
  CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, StoredHeaderOf(record));
  if (auto it = header.metadata.find(std::string(kLayoutMetadataKey));
      it != header.metadata.end()) {
    return it->second;
  }
  json tensors = json::object();
  for (const TensorInfo& t : header.tensors) {
    tensors[t.name] = {
        {"dtype", std::string(DTypeName(t.dtype))},
        {"global_shape", t.shape},
        {"slices", json::array({{{"shard", 0},
                                 {"offsets", std::vector<uint64_t>(t.shape.size(), 0)},
                                 {"shape", t.shape}}})}};
  }
  return json{{"format", 1},
              {"shards", 1},
              {"shard_sha256", json::array({record.sha256_hex})},
              {"tensors", std::move(tensors)}}
      .dump();
}

}  // namespace ckpt
