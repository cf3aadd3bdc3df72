#include "encoding_stream.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>

namespace ckpt {

// How much encoded body may wait for the connection: enough to keep a fast link busy while the
// encoder works on the next window of chunks.
constexpr size_t kQueuedBytes = 64 << 20;

Status PieceQueue::Put(std::string_view piece) {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return cancelled_ || queued_ < capacity_; });
  if (cancelled_) return Status::Aborted(std::string(EncodingStream::kUploadStopped));
  pieces_.emplace_back(piece);
  queued_ += piece.size();
  changed_.notify_all();
  return Status::Ok();
}

void PieceQueue::Close(Status status) {
  std::lock_guard lock(mu_);
  closed_ = true;
  status_ = std::move(status);
  changed_.notify_all();
}

void PieceQueue::Cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  changed_.notify_all();
}

Result<size_t> PieceQueue::Read(char* buffer, size_t capacity) {
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

EncodingStream::EncodingStream(const CodingPlan& plan, const CheckpointView& checkpoint,
                               const CheckpointView* reference, int threads,
                               std::string restored_path)
    : plan_(plan),
      checkpoint_(checkpoint),
      reference_(reference),
      threads_(threads),
      restored_path_(std::move(restored_path)),
      queue_(kQueuedBytes),
      coded_(Status::Internal("not coded")) {}

EncodingStream::~EncodingStream() {
  Stop();
  if (!restored_path_.empty()) {
    restored_out_.reset();
    std::error_code ignored;
    std::filesystem::remove(restored_path_, ignored);
  }
}

Status EncodingStream::Start() {
  RestoredSink restored_sink;
  if (!restored_path_.empty()) {
    CKPT_ASSIGN_OR_RETURN(WritebackFile file, WritebackFile::Create(restored_path_));
    restored_out_.emplace(std::move(file));
    restored_sink = [this](std::span<const uint8_t> piece) { return restored_out_->Write(piece); };
  }
  encoder_ = std::thread([this, restored_sink = std::move(restored_sink)] {
    // Nothing thrown may leave the thread (it would end the process, a Python one included).
    try {
      coded_ = EncodeByPlan(
          plan_, checkpoint_, reference_, threads_,
          [this](std::string_view piece) { return queue_.Put(piece); }, restored_sink);
    } catch (const std::bad_alloc&) {
      coded_ = Status::ResourceExhausted("out of memory while coding the checkpoint");
    } catch (const std::exception& e) {
      coded_ = Status::Internal(std::string("coding the checkpoint failed: ") + e.what());
    }
    queue_.Close(coded_.ok() ? Status::Ok() : coded_.status());
  });
  return Status::Ok();
}

void EncodingStream::Stop() {
  queue_.Cancel();
  if (encoder_.joinable()) encoder_.join();
}

Result<EdgeEncoding> EncodingStream::Finish() {
  Stop();
  if (!coded_.ok()) return coded_.status();
  if (restored_out_) CKPT_RETURN_IF_ERROR(restored_out_->Close());
  return coded_;
}

Status EncodingStream::KeepRestoredAs(const std::string& path) {
  if (restored_path_.empty()) return Status::Internal("no restored body was written");
  std::error_code ec;
  std::filesystem::rename(restored_path_, path, ec);
  if (ec) return Status::IoError("cannot keep '" + path + "': " + ec.message());
  restored_path_.clear();
  return Status::Ok();
}

Result<EncodedPut> PutEncoded(const std::vector<ServerEndpoint>& servers,
                              const ClientOptions& options, TlsContext* tls,
                              const std::string& target, std::string_view media_type,
                              EncodingStream& stream, std::optional<EdgeEncoding>* coded_anyway) {
  CKPT_RETURN_IF_ERROR(stream.Start());
  PutBody body;
  body.read = [&](char* buffer, size_t capacity) { return stream.Read(buffer, capacity); };
  body.content_type = media_type;
  auto answer = StreamPut(servers, options, tls, target, body);
  auto coded = stream.Finish();
  if (!answer.ok()) {
    if (!coded.ok() && coded.status().message() != EncodingStream::kUploadStopped) {
      return coded.status();
    }
    // Only a refusal sent once the body was read whole (from the commit it completed).
    if (coded.ok() && coded_anyway != nullptr &&
        answer.status().subcode() == StatusSubcode::kShardsDropped) {
      *coded_anyway = std::move(coded).value();
    }
    return answer.status();
  }
  if (!coded.ok()) return coded.status();
  return EncodedPut{std::move(answer).value(), std::move(coded).value()};
}

int CodecThreads(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace ckpt
