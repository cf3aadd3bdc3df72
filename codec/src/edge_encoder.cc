#include "ckpt/codec/edge_encoder.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "ckpt/base/binary.h"
#include "ckpt/base/hashing.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/encoded_body.h"
#include "ckpt/codec/lossy_codec.h"

namespace ckpt {
namespace {

// The plan describes the checkpoint: the same tensors, in the same order, of the same type,
// shape and size; in a plan of a shard, each tensor the slice the shard declares.
Status CheckPlanDescribes(const CodingPlan& plan, const SafetensorsHeader& header) {
  if (plan.tensors.size() != header.tensors.size()) {
    return Status::InvalidArgument(
        "the plan has " + std::to_string(plan.tensors.size()) + " tensors, the checkpoint " +
        std::to_string(header.tensors.size()) + ": ask for a plan of this checkpoint");
  }
  std::map<std::string, SliceDeclaration> slices;
  if (plan.shard) {
    CKPT_ASSIGN_OR_RETURN(slices, ParseSliceDeclarations(header.metadata));
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& p = plan.tensors[i];
    const TensorInfo& t = header.tensors[i];
    bool same = p.name == t.name && p.dtype == t.dtype;
    if (plan.shard) {
      const auto declared = slices.find(t.name);
      const TensorBox box = declared == slices.end()
                                ? TensorBox{std::vector<uint64_t>(t.shape.size(), 0), t.shape}
                                : TensorBox{declared->second.offsets, t.shape};
      same = same && p.slice && p.slice->box == box &&
             (declared == slices.end() ? t.shape == p.shape
                                       : declared->second.global_shape == p.shape);
    } else {
      same = same && p.shape == t.shape && p.byte_size == t.byte_size();
    }
    if (!same) {
      return Status::InvalidArgument("tensor " + std::to_string(i) + " ('" + t.name +
                                     "') is not the plan's ('" + p.name +
                                     "'): ask for a plan of this checkpoint");
    }
  }
  return Status::Ok();
}

// A tensor's bytes in the body: each chunk in a plan of the whole checkpoint; in a plan of a
// shard, the chunks it owns and, around them, the bytes it sends raw.
struct Segment {
  bool raw = false;
  uint32_t chunk = 0;   // !raw
  uint64_t offset = 0;  // in the tensor's bytes (of the shard's slice)
  uint64_t length = 0;
};

std::vector<Segment> SegmentsOf(const PlannedTensor& t) {
  std::vector<Segment> out;
  if (!t.slice) {
    // A tiled tensor's chunks are gathered from it (their offsets are not used).
    for (uint32_t c = 0; c < t.chunk_count; ++c) {
      out.push_back(
          {false, c, t.tile_counts.empty() ? uint64_t{c} * t.chunk_bytes : 0, t.ChunkLength(c)});
    }
    return out;
  }
  const uint64_t element = DTypeSize(t.dtype);
  const uint64_t bytes = t.slice->box.element_count() * element;
  if (t.slice->owned_begin == t.slice->owned_end) {
    if (bytes > 0) out.push_back({true, 0, 0, bytes});
    return out;
  }
  // Owned chunks exist only in a slice that is one run of the global tensor, or a tile (whose
  // chunks are runs of its own bytes).
  const uint64_t first = BoxElementSpan(t.shape, t.slice->box).first * element;
  const uint64_t owned_from =
      t.tile_counts.empty() ? uint64_t{t.slice->owned_begin} * t.chunk_bytes - first : 0;
  if (owned_from > 0) out.push_back({true, 0, 0, owned_from});
  uint64_t at = owned_from;
  for (uint32_t c = t.slice->owned_begin; c < t.slice->owned_end; ++c) {
    out.push_back({false, c, at, t.ChunkLength(c)});
    at += t.ChunkLength(c);
  }
  if (at < bytes) out.push_back({true, 0, at, bytes - at});
  return out;
}

// One chunk to encode and, once encoded, its frame and reconstruction; or bytes sent raw (their
// frame's head, then `data`).
struct ChunkJob {
  uint32_t tensor = 0;
  uint32_t chunk = 0;
  bool raw = false;
  std::span<const uint8_t> data;
  std::optional<std::span<const uint8_t>> reference;
  // A chunk of a tiled tensor of a whole checkpoint: `data` and `reference` are the whole
  // tensors, gathered into `gathered` (and `gathered_reference`) by the worker.
  const ChunkGrid* grid = nullptr;
  uint64_t length = 0;  // of the chunk's data
  std::vector<uint8_t> gathered, gathered_reference;
  Status status;
  std::string frame;
  std::vector<uint8_t> reconstruction;  // empty when it is the input
};

class CodecSet {
 public:
  const TensorCodec* For(const PlannedTensor& t) {
    if (!t.lossy) return lossless_.get();
    for (const auto& [options, codec] : lossy_) {
      if (options == t.lossy_options) return codec.get();
    }
    lossy_.emplace_back(t.lossy_options, NewLossyCodec(t.lossy_options));
    return lossy_.back().second.get();
  }

 private:
  std::unique_ptr<TensorCodec> lossless_ = NewLosslessCodec();
  std::vector<std::pair<LossyCodecOptions, std::unique_ptr<TensorCodec>>> lossy_;
};

void Encode(const PlannedTensor& t, const TensorCodec* codec, ChunkJob& job) {
  if (job.raw) return;
  if (job.grid != nullptr) {
    const TensorBox whole = WholeBox(t.shape);
    const size_t element = DTypeSize(t.dtype);
    job.gathered.resize(job.length);
    CopyBoxToChunk(*job.grid, whole, job.chunk, element, job.data, job.gathered);
    job.data = job.gathered;
    if (job.reference) {
      job.gathered_reference.resize(job.length);
      CopyBoxToChunk(*job.grid, whole, job.chunk, element, *job.reference, job.gathered_reference);
      job.reference = std::span<const uint8_t>(job.gathered_reference);
    }
  }
  auto encoded = codec->Encode(t.dtype, job.data, job.reference);
  if (!encoded.ok()) {
    job.status = encoded.status();
    return;
  }
  const std::span<const uint8_t> restored = encoded->reconstruction_is_input
                                                ? job.data
                                                : std::span<const uint8_t>(encoded->reconstruction);
  const std::string record = ChunkRecord::EncodeChunk(*encoded, t.kind, restored);
  job.frame = EncodeChunkFrame({job.tensor, job.chunk, encoded->info, record});
  if (!encoded->reconstruction_is_input) job.reconstruction = std::move(encoded->reconstruction);
}

// The most raw bytes handed to the writer at once.
constexpr uint64_t kRawPieceBytes = 1 << 20;
// How far the encoder's workers may run ahead of the chunk written next: a few chunks, or as
// many as hold this much data. Tensors differ in cost by orders of magnitude (a weight
// matrix's low-rank fit beside a bias), and a window of a few chunks leaves a worker idle
// behind one large chunk; every chunk coded ahead holds its frame and reconstruction.
constexpr uint64_t kWindowBytes = 32 << 20;

}  // namespace

RestoredSink CollectInto(std::vector<uint8_t>* out) {
  out->clear();
  return [out](std::span<const uint8_t> piece) {
    out->insert(out->end(), piece.begin(), piece.end());
    return Status::Ok();
  };
}

Result<CheckpointView> CheckpointView::Parse(std::span<const uint8_t> body) {
  if (body.size() < 8) {
    return Status::InvalidArgument("not a safetensors file: shorter than 8 bytes");
  }
  ByteReader r(body, "checkpoint");
  uint64_t json_size = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&json_size));
  // As a push the daemon codes says (ReadSafetensorsFileHeader).
  if (json_size > body.size() - 8 || json_size > kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument("not a safetensors file: header length " +
                                   std::to_string(json_size) +
                                   " is larger than the file or the 100 MB limit");
  }
  const std::string_view json(reinterpret_cast<const char*>(body.data()) + 8, json_size);
  CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(json, body.size()));
  const std::span<const uint8_t> data = body.subspan(8 + json_size);
  std::vector<std::span<const uint8_t>> tensor_data;
  tensor_data.reserve(header.tensors.size());
  for (const TensorInfo& t : header.tensors) {
    tensor_data.push_back(data.subspan(t.begin, t.byte_size()));
  }
  return CheckpointView(body.first(8 + json_size), std::move(header), std::move(tensor_data));
}

Result<CheckpointView> CheckpointView::FromParts(
    std::span<const uint8_t> raw_header, std::vector<std::span<const uint8_t>> tensor_data) {
  CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ParseRawSafetensorsHeader(
                            {reinterpret_cast<const char*>(raw_header.data()), raw_header.size()}));
  if (tensor_data.size() != header.tensors.size()) {
    return Status::InvalidArgument("checkpoint: the header names " +
                                   std::to_string(header.tensors.size()) + " tensors, " +
                                   std::to_string(tensor_data.size()) + " were given");
  }
  for (size_t i = 0; i < tensor_data.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    if (tensor_data[i].size() != t.byte_size()) {
      return Status::InvalidArgument("checkpoint: tensor '" + t.name + "' has " +
                                     std::to_string(t.byte_size()) + " bytes in the header, " +
                                     std::to_string(tensor_data[i].size()) + " were given");
    }
  }
  return CheckpointView(raw_header, std::move(header), std::move(tensor_data));
}

std::string CheckpointView::Sha256Hex() const {
  // The tensors tile the data buffer in body order: header then tensors is the body.
  Sha256 sha;
  sha.Update(raw_header());
  for (const std::span<const uint8_t> data : tensor_data_) sha.Update(data);
  return sha.FinishHex();
}

std::optional<std::span<const uint8_t>> CheckpointView::TensorData(std::string_view name) const {
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    if (header_.tensors[i].name == name) return TensorData(i);
  }
  return std::nullopt;
}

Result<EdgeEncoding> EncodeByPlan(const CodingPlan& plan, const CheckpointView& checkpoint,
                                  const CheckpointView* reference, int threads,
                                  const std::function<Status(std::string_view)>& write,
                                  const RestoredSink& restored_sink) {
  CKPT_RETURN_IF_ERROR(CheckPlanDescribes(plan, checkpoint.header()));
  const bool has_deltas =
      std::any_of(plan.tensors.begin(), plan.tensors.end(), [](const PlannedTensor& t) {
        return t.kind == FrameKind::kDelta && t.byte_size > 0 &&
               (!t.slice || t.slice->owned_begin < t.slice->owned_end);
      });
  if (has_deltas && reference == nullptr) {
    return Status::FailedPrecondition("the plan codes deltas against version " +
                                      std::to_string(plan.base->version) +
                                      ", and no reference is held: pull that version first");
  }
  // A shard's reference is its part of the base, which has no digest of its own: the caller
  // knows it by the version it holds (PlanShard::base_shard_sha256, or a part pulled).
  if (has_deltas && !plan.shard && !plan.base->restored_sha256.empty()) {
    if (reference->Sha256Hex() != plan.base->restored_sha256) {
      return Status::FailedPrecondition("the reference held is not the reconstruction of version " +
                                        std::to_string(plan.base->version) +
                                        ": pull that version again");
    }
  }

  // A shard's reference must hold the same slices (a rank whose part changed pulls it again).
  std::map<std::string, SliceDeclaration> reference_slices;
  if (has_deltas && plan.shard) {
    CKPT_ASSIGN_OR_RETURN(reference_slices, ParseSliceDeclarations(reference->header().metadata));
  }
  // Every chunk (and raw part of a shard), in body order; a tiled tensor's in chunk order.
  std::vector<ChunkJob> jobs;
  std::vector<std::optional<ChunkGrid>> grids(plan.tensors.size());
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    if (!t.tile_counts.empty() && !t.slice) {
      CKPT_ASSIGN_OR_RETURN(grids[i], t.Grid());
    }
    const std::span<const uint8_t> data = checkpoint.TensorData(i);
    const std::vector<Segment> segments = SegmentsOf(t);
    const bool codes_deltas =
        t.kind == FrameKind::kDelta &&
        std::any_of(segments.begin(), segments.end(), [](const Segment& s) { return !s.raw; });
    std::optional<std::span<const uint8_t>> base;
    if (codes_deltas) {
      base = reference->TensorData(t.name);
      if (!base || base->size() != data.size()) {
        return Status::FailedPrecondition("the reference has no tensor '" + t.name + "' of " +
                                          std::to_string(data.size()) +
                                          " bytes to code its delta against");
      }
      if (t.slice) {
        const auto declared = reference_slices.find(t.name);
        const std::vector<uint64_t> offsets = declared == reference_slices.end()
                                                  ? std::vector<uint64_t>(t.shape.size(), 0)
                                                  : declared->second.offsets;
        if (offsets != t.slice->box.offsets) {
          return Status::FailedPrecondition("the reference holds another part of tensor '" +
                                            t.name + "': pull this shard's part first");
        }
      }
    }
    for (const Segment& segment : segments) {
      ChunkJob job;
      job.tensor = i;
      job.chunk = segment.chunk;
      job.raw = segment.raw;
      job.length = segment.length;
      if (grids[i]) {
        job.grid = &*grids[i];
        job.data = data;
        job.reference = base;
      } else {
        job.data = data.subspan(segment.offset, segment.length);
        if (segment.raw) {
          job.frame = EncodeRawFrameHead(i, segment.offset, segment.length);
        } else if (base) {
          job.reference = base->subspan(segment.offset, segment.length);
        }
      }
      jobs.push_back(std::move(job));
    }
  }

  // The preamble goes out first (the server waits for the body); both digests are taken as the
  // chunks are written, in body order, which covers the data buffer end to end.
  EdgeEncoding result;
  result.raw_bytes = checkpoint.byte_size();
  Sha256 pushed, restored;
  const std::string_view raw_header = checkpoint.raw_header();
  pushed.Update(raw_header);
  restored.Update(raw_header);
  if (restored_sink) {
    CKPT_RETURN_IF_ERROR(
        restored_sink({reinterpret_cast<const uint8_t*>(raw_header.data()), raw_header.size()}));
  }
  const std::string preamble =
      EncodePreamble({plan.Digest(), plan.base ? plan.base->reference : 0, std::string(raw_header),
                      plan.shard ? kEncodedShardFormatVersion : kEncodedBodyFormatVersion});
  CKPT_RETURN_IF_ERROR(write(preamble));
  result.encoded_bytes += preamble.size();

  // Chunks are encoded by `threads` workers while this thread hashes and writes the finished
  // ones in order: a worker takes the next chunk while it lies within a window of the first one
  // not yet written (`window` chunks, or kWindowBytes of data), so at most a window's frames and
  // reconstructions are held at once, and no worker waits for the slowest chunk of a batch.
  CodecSet codecs;
  std::vector<const TensorCodec*> codec_of;
  for (const PlannedTensor& t : plan.tensors) codec_of.push_back(codecs.For(t));
  const size_t workers = std::min(static_cast<size_t>(std::max(1, threads)), jobs.size());
  const size_t window = std::max<size_t>(workers * 2, 4);
  std::vector<uint64_t> bytes_through(jobs.size());  // data bytes of jobs 0..k
  for (size_t k = 0, sum = 0; k < jobs.size(); ++k) {
    sum += jobs[k].length;
    bytes_through[k] = sum;
  }
  std::mutex mu;
  std::condition_variable changed;
  std::vector<char> done(jobs.size(), 0);  // guarded by mu
  size_t next = 0, written = 0;            // guarded by mu
  bool stop = false;                       // guarded by mu: the writer gave up
  // Whether chunk `k` lies within the window of the first chunk not written. Called under mu.
  const auto within_window = [&](size_t k) {
    const uint64_t before = written == 0 ? 0 : bytes_through[written - 1];
    return k < written + window || bytes_through[k] - before <= kWindowBytes;
  };
  auto work = [&] {
    for (;;) {
      size_t k;
      {
        std::unique_lock lock(mu);
        changed.wait(lock, [&] { return stop || next >= jobs.size() || within_window(next); });
        if (stop || next >= jobs.size()) return;
        k = next++;
      }
      // Nothing thrown may leave a worker (it would end the process, a Python one included).
      try {
        Encode(plan.tensors[jobs[k].tensor], codec_of[jobs[k].tensor], jobs[k]);
      } catch (const std::bad_alloc&) {
        jobs[k].status = Status::ResourceExhausted("out of memory coding a chunk");
      } catch (const std::exception& e) {
        jobs[k].status = Status::Internal(std::string("coding a chunk: ") + e.what());
      }
      {
        std::lock_guard lock(mu);
        done[k] = 1;
      }
      changed.notify_all();
    }
  };
  std::vector<std::thread> pool;
  // However this function ends (a write that throws included), the workers stop and are joined.
  struct StopAndJoin {
    std::mutex& mu;
    std::condition_variable& changed;
    bool& stop;
    std::vector<std::thread>& pool;
    ~StopAndJoin() {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      changed.notify_all();
      for (std::thread& t : pool) {
        if (t.joinable()) t.join();
      }
    }
  } stop_and_join{mu, changed, stop, pool};
  for (size_t w = 0; w < workers; ++w) pool.emplace_back(work);
  // A tiled tensor's reconstruction, put back in row-major order before it is hashed.
  std::vector<uint8_t> tiled_restored;
  auto write_job = [&](ChunkJob& job) -> Status {
    CKPT_RETURN_IF_ERROR(job.status);
    const std::span<const uint8_t> restored_chunk =
        job.reconstruction.empty() ? job.data : std::span<const uint8_t>(job.reconstruction);
    if (job.grid != nullptr) {
      const PlannedTensor& t = plan.tensors[job.tensor];
      const std::span<const uint8_t> tensor = checkpoint.TensorData(job.tensor);
      if (job.chunk == 0) {
        pushed.Update(tensor);
        tiled_restored.resize(tensor.size());
      }
      CopyChunkToBox(*job.grid, WholeBox(t.shape), job.chunk, DTypeSize(t.dtype), restored_chunk,
                     tiled_restored);
      if (job.chunk + 1 == t.chunk_count) {
        restored.Update(tiled_restored);
        if (restored_sink) CKPT_RETURN_IF_ERROR(restored_sink(tiled_restored));
        tiled_restored = {};
      }
    } else {
      pushed.Update(job.data);
      restored.Update(restored_chunk);
      if (restored_sink) CKPT_RETURN_IF_ERROR(restored_sink(restored_chunk));
    }
    CKPT_RETURN_IF_ERROR(write(job.frame));
    result.encoded_bytes += job.frame.size();
    // Raw bytes go in pieces: the writer may copy what it is given.
    for (uint64_t at = 0; job.raw && at < job.data.size(); at += kRawPieceBytes) {
      const std::span<const uint8_t> piece =
          job.data.subspan(at, std::min<uint64_t>(kRawPieceBytes, job.data.size() - at));
      CKPT_RETURN_IF_ERROR(write({reinterpret_cast<const char*>(piece.data()), piece.size()}));
      result.encoded_bytes += piece.size();
    }
    return Status::Ok();
  };
  Status status;
  for (size_t k = 0; k < jobs.size() && status.ok(); ++k) {
    {
      std::unique_lock lock(mu);
      changed.wait(lock, [&] { return done[k] != 0; });
    }
    status = write_job(jobs[k]);
    jobs[k] = ChunkJob{};  // frees the frame and the reconstruction
    {
      std::lock_guard lock(mu);
      written = k + 1;
      if (!status.ok()) stop = true;
    }
    changed.notify_all();
  }
  CKPT_RETURN_IF_ERROR(status);
  result.pushed_sha256 = pushed.FinishHex();
  result.restored_sha256 = restored.FinishHex();
  const std::string end = EncodeEnd({result.pushed_sha256, result.restored_sha256});
  CKPT_RETURN_IF_ERROR(write(end));
  result.encoded_bytes += end.size();
  return result;
}

}  // namespace ckpt
