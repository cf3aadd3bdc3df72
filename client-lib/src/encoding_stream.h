// A checkpoint coded by a plan on a thread of its own while the caller sends what is ready: the
// encoded body is read piece by piece (a connection's body source), the restored body written to
// a file that becomes the next reference once the push is committed. Used by the C++ client and
// the Python module (client-lib/python/native). Internal to client-lib.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "ckpt/base/status.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "held_reference.h"
#include "put_stream.h"

namespace ckpt {

// Pieces of an encoded body on their way from the encoding thread to the connection, at most
// `capacity` bytes of them at once (the encoder waits beyond). Thread-safe: one producer, one
// consumer.
class PieceQueue {
 public:
  explicit PieceQueue(size_t capacity) : capacity_(capacity) {}

  // The producer's side: Aborted once the consumer cancelled.
  Status Put(std::string_view piece);
  // The producer is done; `status` is what Read reports after the last piece.
  void Close(Status status);
  // The consumer gives up: Put stops waiting and fails from now on.
  void Cancel();

  // The consumer's side: up to `capacity` bytes; 0 at the end; the producer's error if any.
  Result<size_t> Read(char* buffer, size_t capacity);

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

// Owns the encoding thread of one push and the file the restored body goes to. The plan and
// the views must outlive it. Thread-compatible: Read from one thread; Finish and the
// destructor stop and join the encoder.
class EncodingStream {
 public:
  // `restored_path`: where the restored body is written as it is coded (empty: not kept).
  EncodingStream(const CodingPlan& plan, const CheckpointView& checkpoint,
                 const CheckpointView* reference, int threads, std::string restored_path);
  EncodingStream(const EncodingStream&) = delete;
  EncodingStream& operator=(const EncodingStream&) = delete;
  // Stops the encoder; removes the restored file unless it was kept.
  ~EncodingStream();

  // Opens the restored file and starts the encoder.
  Status Start();
  // The next bytes of the encoded body (0: its end); the encoder's error if it failed.
  Result<size_t> Read(char* buffer, size_t capacity) { return queue_.Read(buffer, capacity); }
  // Stops the encoder (if the body was not read to its end) and waits for it: what it coded, or
  // why it stopped (Aborted "the upload stopped" when the reader gave up first).
  Result<EdgeEncoding> Finish();
  // After a successful Finish: renames the restored body to `path`.
  Status KeepRestoredAs(const std::string& path);

  // The message of Finish's error when the reader stopped before the encoder.
  static constexpr std::string_view kUploadStopped = "the upload stopped";

 private:
  void Stop();

  const CodingPlan& plan_;
  const CheckpointView& checkpoint_;
  const CheckpointView* const reference_;
  const int threads_;
  std::string restored_path_;  // empty once kept
  std::optional<WritebackFile> restored_out_;
  PieceQueue queue_;
  std::thread encoder_;
  Result<EdgeEncoding> coded_;  // written by the encoder; read after it is joined
};

// What an encoded PUT came to: the server's answer and what the encoder coded.
struct EncodedPut {
  PutAnswer answer;
  EdgeEncoding coded;
};

// Starts `stream` and PUTs its encoded body to `target` as `media_type` while it is coded. On
// failure, the encoder's own error where it explains a body that ended early, else the PUT's;
// then, with `coded_anyway`, what was coded when the answer is SHARDS_DROPPED (sent once the
// body was read whole and stored).
Result<EncodedPut> PutEncoded(const std::vector<ServerEndpoint>& servers,
                              const ClientOptions& options, TlsContext* tls,
                              const std::string& target, std::string_view media_type,
                              EncodingStream& stream,
                              std::optional<EdgeEncoding>* coded_anyway = nullptr);

// The threads a coding or decoding runs on for `requested` (0 or less: the machine's cores).
int CodecThreads(int requested);

}  // namespace ckpt
