// Client::PushFileEncoded: a checkpoint coded on the client by the server's plan and streamed
// while it is coded (docs/api.md, "plan").
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/base/model_name.h"
#include "ckpt/client/client.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "held_reference.h"
#include "put_stream.h"
#include "query_strings.h"

namespace ckpt {
namespace {

using nlohmann::json;

// What the encoder is told once the connection gave up on the upload.
constexpr std::string_view kUploadStopped = "the upload stopped";

// Pieces of the encoded body on their way from the encoding thread to the connection, at most
// `capacity` bytes of them at once (the encoder waits beyond).
class PieceQueue {
 public:
  explicit PieceQueue(size_t capacity) : capacity_(capacity) {}

  // The encoder's side: Aborted (kUploadStopped) once the connection gave up.
  Status Put(std::string_view piece) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return cancelled_ || queued_ < capacity_; });
    if (cancelled_) return Status::Aborted(std::string(kUploadStopped));
    pieces_.emplace_back(piece);
    queued_ += piece.size();
    changed_.notify_all();
    return Status::Ok();
  }
  void Close(Status status) {
    std::lock_guard lock(mu_);
    closed_ = true;
    status_ = std::move(status);
    changed_.notify_all();
  }
  void Cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    changed_.notify_all();
  }

  // The connection's side: up to `capacity` bytes; 0 at the end; the encoder's error if any.
  Result<size_t> Read(char* buffer, size_t capacity) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return closed_ || !pieces_.empty(); });
    if (pieces_.empty()) {
      if (!status_.ok()) return status_;
      return size_t{0};
    }
    size_t n = 0;
    while (n < capacity && !pieces_.empty()) {
      std::string& front = pieces_.front();
      const size_t take = std::min(capacity - n, front.size() - offset_);
      std::memcpy(buffer + n, front.data() + offset_, take);
      n += take;
      offset_ += take;
      if (offset_ == front.size()) {
        queued_ -= front.size();
        pieces_.pop_front();
        offset_ = 0;
      }
    }
    changed_.notify_all();
    return n;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> pieces_;  // guarded by mu_
  size_t offset_ = 0;               // into pieces_.front(); guarded by mu_
  size_t queued_ = 0;               // bytes in pieces_; guarded by mu_
  bool closed_ = false;             // guarded by mu_
  bool cancelled_ = false;          // guarded by mu_
  Status status_;                   // guarded by mu_
};

bool NeedsReference(const CodingPlan& plan) {
  return std::any_of(plan.tensors.begin(), plan.tensors.end(), [](const PlannedTensor& t) {
    return t.kind == FrameKind::kDelta && t.byte_size > 0;
  });
}

}  // namespace

Result<PushResult> Client::PushFileEncoded(std::string_view model, uint64_t version,
                                           const std::string& path,
                                           const EncodedPushOptions& encoded,
                                           const PushMetadata& metadata) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  CKPT_ASSIGN_OR_RETURN(const MappedFile file, MappedFile::Open(path));
  auto parsed = CheckpointView::Parse(file.bytes());
  if (!parsed.ok()) return parsed.status().WithContext("'" + path + "'");
  const CheckpointView& checkpoint = *parsed;
  const std::string version_target = VersionTarget(model, std::to_string(version));
  CKPT_ASSIGN_OR_RETURN(const json plan_json,
                        PostForJson(endpoints_, options_, tls_.get(), version_target + "/plan",
                                    checkpoint.raw_header(), "application/octet-stream"));
  CKPT_ASSIGN_OR_RETURN(CodingPlan plan, CodingPlan::FromJson(plan_json.dump()));

  // The reference: the restored body of the plan's base, kept from before or pulled now.
  std::string reference_source;
  std::optional<MappedFile> reference_file;
  std::optional<CheckpointView> reference;
  const std::string dir = encoded.reference_dir;
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IoError("cannot create '" + dir + "': " + ec.message());
  }
  // Without a reference directory, a base that must be pulled goes to a private temporary one,
  // removed when the push ends.
  std::optional<ScratchDir> scratch;
  if (dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(ScratchDir made, ScratchDir::Make());
    scratch.emplace(std::move(made));
  }
  HeldReference held = HeldReferenceOf(scratch ? scratch->path() : dir, model);
  if (NeedsReference(plan)) {
    const std::string& base_sha = plan.base->restored_sha256;
    const bool held_is_base = !dir.empty() && !base_sha.empty() && held.restored_sha256 == base_sha;
    if (held_is_base) {
      reference_source = "held";
    } else if (!base_sha.empty()) {
      // Encoded, since what is held when that saves bytes; kept in `dir` as the reference.
      EncodedPullOptions pull;
      pull.reference_dir = dir;
      auto pulled = PullEncoded(model, std::to_string(plan.base->version), held.path, pull);
      if (!pulled.ok()) return pulled.status().WithContext("pulling the base version");
      if (pulled->sha256 != base_sha) {
        return Status::FailedPrecondition("version " + std::to_string(plan.base->version) +
                                          " changed while it was pulled: push again");
      }
      CKPT_RETURN_IF_ERROR(WriteSidecar(held, plan.base->version, base_sha));
      reference_source = "pulled";
    } else {
      // The base's version was deleted (its data is kept for the chains): nothing to pull.
      PushResult result;
      CKPT_ASSIGN_OR_RETURN(result, PushFile(model, version, path, metadata));
      result.reference =
          "the base version was deleted and cannot be pulled: the server coded this push";
      return result;
    }
    auto mapped = MappedFile::Open(held.path);
    if (!mapped.ok()) return mapped.status();
    reference_file.emplace(std::move(mapped).value());
    auto view = CheckpointView::Parse(reference_file->bytes());
    if (!view.ok()) return view.status().WithContext("the reference '" + held.path + "'");
    reference.emplace(std::move(view).value());
    // Its digest was checked when it was stored (or just now, pulled): not again here. The
    // server decodes every delta against its own reference and refuses a drifted one.
    plan.base->restored_sha256.clear();
  }

  // Encode on one thread while the connection sends what is ready.
  const int threads = encoded.threads > 0
                          ? encoded.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  PieceQueue queue(64 << 20);
  // The restored body goes to a file beside the reference as it is coded (not to memory), and
  // replaces the reference once the version is committed.
  const std::string restored_path = dir.empty() ? std::string() : TemporaryNameFor(held.path);
  struct RemoveUnlessKept {
    const std::string& path;
    ~RemoveUnlessKept() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove(path, ignored);
    }
  } remove_restored{restored_path};
  std::ofstream restored_out;
  RestoredSink restored_sink;
  if (!restored_path.empty()) {
    restored_out.open(restored_path, std::ios::binary | std::ios::trunc);
    if (!restored_out) return Status::IoError("cannot write '" + restored_path + "'");
    restored_sink = [&](std::span<const uint8_t> piece) {
      restored_out.write(reinterpret_cast<const char*>(piece.data()),
                         static_cast<std::streamsize>(piece.size()));
      return restored_out ? Status::Ok()
                          : Status::IoError("writing '" + restored_path + "' failed");
    };
  }
  Result<EdgeEncoding> coded = Status::Internal("not coded");
  std::thread encoder([&] {
    coded = EncodeByPlan(
        plan, checkpoint, reference ? &*reference : nullptr, threads,
        [&](std::string_view piece) { return queue.Put(piece); }, restored_sink);
    queue.Close(coded.ok() ? Status::Ok() : coded.status());
  });
  // However the upload ends (an exception included), the encoder stops and is joined.
  struct StopEncoder {
    PieceQueue& queue;
    std::thread& thread;
    ~StopEncoder() {
      queue.Cancel();
      if (thread.joinable()) thread.join();
    }
  } stop_encoder{queue, encoder};
  PutBody body;
  body.read = [&](char* buffer, size_t capacity) { return queue.Read(buffer, capacity); };
  body.content_type = kEncodedBodyMediaType;
  auto answer =
      StreamPut(endpoints_, options_, tls_.get(), version_target + PushQuery(metadata), body);
  queue.Cancel();
  encoder.join();
  if (!answer.ok()) {
    // The encoder's own failure explains a body that ended early.
    if (!coded.ok() && coded.status().message() != kUploadStopped) return coded.status();
    return answer.status();
  }
  if (!coded.ok()) return coded.status();
  if (answer->status != 201) return Status::Internal("push answered " + answer->body.dump());
  PushResult result = PushResultFromJson(answer->body);
  result.encoded = true;
  result.sent_bytes = coded->encoded_bytes;
  result.reference = reference_source;
  if (!restored_path.empty()) {
    restored_out.close();
    if (!restored_out) return Status::IoError("writing '" + restored_path + "' failed");
    std::error_code ec;
    std::filesystem::rename(restored_path, held.path, ec);
    if (ec) return Status::IoError("cannot keep '" + held.path + "': " + ec.message());
    CKPT_RETURN_IF_ERROR(WriteSidecar(held, version, coded->restored_sha256));
  }
  return result;
}

}  // namespace ckpt
