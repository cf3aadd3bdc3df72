// Client::PushFileSharded: one file sent as the shards of a sharded version, in parallel.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "ckpt/base/model_name.h"
#include "ckpt/base/shard_split.h"
#include "ckpt/client/client.h"
#include "encoded_shard_push.h"
#include "encoding_stream.h"
#include "held_reference.h"
#include "put_stream.h"
#include "query_strings.h"

namespace ckpt {
namespace {

// Reads a shard's body: its header, then its ranges of the source file. Thread-compatible.
class ShardReader {
 public:
  ShardReader(int fd, const std::string& path, const ShardBodyPlan& plan)
      : fd_(fd), path_(path), plan_(plan) {}

  Result<size_t> Read(char* buffer, size_t capacity) {
    size_t n = 0;
    while (n < capacity) {
      if (header_done_ < plan_.header.size()) {
        const size_t take = std::min(capacity - n, plan_.header.size() - header_done_);
        std::memcpy(buffer + n, plan_.header.data() + header_done_, take);
        header_done_ += take;
        n += take;
        continue;
      }
      if (range_ == plan_.ranges.size()) break;
      const BodyRange& r = plan_.ranges[range_];
      const uint64_t at = r.begin + range_done_;
      const size_t want = static_cast<size_t>(std::min<uint64_t>(capacity - n, r.end - at));
      const ssize_t got = pread(fd_, buffer + n, want, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Status::IoError("reading '" + path_ + "': " + std::strerror(errno));
      if (got == 0) return Status::IoError("'" + path_ + "' became shorter while being pushed");
      n += static_cast<size_t>(got);
      range_done_ += static_cast<uint64_t>(got);
      if (r.begin + range_done_ == r.end) {
        ++range_;
        range_done_ = 0;
      }
    }
    return n;
  }

 private:
  const int fd_;
  const std::string& path_;
  const ShardBodyPlan& plan_;
  size_t header_done_ = 0;
  size_t range_ = 0;
  uint64_t range_done_ = 0;
};

// The shard `plan` cuts from `file` (the mapped source) as a view of the file's own bytes: each
// of its tensors with data is one of the plan's ranges, in body order.
Result<CheckpointView> ShardView(const ShardBodyPlan& plan, std::span<const uint8_t> file) {
  CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseRawSafetensorsHeader(plan.header));
  std::vector<std::span<const uint8_t>> tensors;
  size_t range = 0;
  for (const TensorInfo& t : header.tensors) {
    if (t.byte_size() == 0) {
      tensors.emplace_back();
      continue;
    }
    if (range == plan.ranges.size() || plan.ranges[range].end > file.size()) {
      return Status::Internal("shard of '" + t.name + "': no range of the file holds it");
    }
    const BodyRange& r = plan.ranges[range++];
    tensors.push_back(file.subspan(r.begin, r.end - r.begin));
  }
  const std::span<const uint8_t> raw_header(reinterpret_cast<const uint8_t*>(plan.header.data()),
                                            plan.header.size());
  return CheckpointView::FromParts(raw_header, std::move(tensors));
}

bool WorthRetrying(const Status& s) {
  switch (s.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kAborted:
    case StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

// The bytes every shard has sent, reported together. Thread-safe.
class CombinedProgress {
 public:
  CombinedProgress(const ClientOptions& options, uint64_t total, size_t shards)
      : report_(options.progress), total_(total), sent_(shards, 0) {}

  // What shard `i`'s attempt reports: the bytes of that attempt.
  void Update(size_t i, uint64_t sent) {
    if (!report_) return;
    std::lock_guard lock(mu_);
    done_ += sent - sent_[i];
    sent_[i] = sent;
    report_(done_, total_);
  }
  // A new attempt of shard `i` starts from nothing.
  void Restart(size_t i) { Update(i, 0); }

 private:
  const std::function<void(uint64_t, uint64_t)> report_;
  const uint64_t total_;
  std::mutex mu_;
  std::vector<uint64_t> sent_;  // guarded by mu_
  uint64_t done_ = 0;           // guarded by mu_
};

}  // namespace

Result<PushResult> Client::PushFileSharded(std::string_view model, uint64_t version,
                                           const std::string& path,
                                           const ShardedPushOptions& sharded,
                                           const PushMetadata& metadata) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open '" + path + "'");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IoError("cannot stat '" + path + "': " + ec.message());
  auto header = ReadSafetensorsFileHeader(in, size);
  if (!header.ok()) return header.status().WithContext("'" + path + "'");
  CKPT_ASSIGN_OR_RETURN(std::vector<ShardBodyPlan> plans, SplitIntoShards(*header, sharded.shards));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open '" + path + "': " + std::strerror(errno));

  uint64_t total = 0;
  for (const ShardBodyPlan& p : plans) total += p.size;
  // Coded shards send what they store, which is not known in advance.
  CombinedProgress progress(options_, sharded.encoded ? 0 : total, plans.size());
  const std::string query = PushQuery(metadata);
  const std::string shard_query =
      (query.empty() ? "?" : query + "&") + "of=" + std::to_string(plans.size());
  std::vector<Result<PutAnswer>> answers(plans.size(), Status::Internal("not sent"));
  std::vector<ShardCoding> codings(plans.size());
  // The shards are coded at once: by default they share the machine's cores.
  std::optional<EncodedPushOptions> encoded = sharded.encoded;
  if (encoded && encoded->threads <= 0) {
    encoded->threads =
        static_cast<int>(std::max<size_t>(1, static_cast<size_t>(CodecThreads(0)) / plans.size()));
  }
  // Shards coded here read their tensors where they lie in the file, mapped once.
  std::optional<MappedFile> mapped;
  if (encoded) {
    auto file = MappedFile::Open(path);
    if (!file.ok()) {
      close(fd);
      return file.status();
    }
    if (file->bytes().size() != size) {
      close(fd);
      return Status::IoError("'" + path + "' changed size while being pushed");
    }
    mapped.emplace(std::move(file).value());
  }
  auto send = [&](size_t i) {
    ClientOptions options = options_;
    options.progress = [&progress, i](uint64_t sent, uint64_t) { progress.Update(i, sent); };
    const std::string target = VersionTarget(model, std::to_string(version)) + "/shards/" +
                               std::to_string(i) + shard_query;
    std::optional<CheckpointView> view;
    if (encoded) {
      auto cut = ShardView(plans[i], mapped->bytes());
      if (!cut.ok()) {
        answers[i] = cut.status();
        return;
      }
      view.emplace(std::move(cut).value());
    }
    // The shard's whole body, read from the file (the server codes it).
    const auto plain_body = [&, i] {
      auto reader = std::make_shared<ShardReader>(fd, path, plans[i]);
      return PutBody{plans[i].size, [reader](char* b, size_t n) { return reader->Read(b, n); }};
    };
    auto delay = sharded.backoff;
    for (int attempt = 0;; ++attempt) {
      progress.Restart(i);
      if (encoded) {
        const Status sent = PushShardEncoded(
            model, version, static_cast<uint32_t>(i), static_cast<uint32_t>(plans.size()),
            ShardInput{*view, plain_body}, *encoded, shard_query, options, &codings[i]);
        answers[i] = sent.ok() ? Result<PutAnswer>(PutAnswer{200, codings[i].answer})
                               : Result<PutAnswer>(sent);
      } else {
        answers[i] = StreamPut(endpoints_, options, tls_.get(), target, plain_body());
      }
      if (answers[i].ok() || attempt >= sharded.retries || !WorthRetrying(answers[i].status())) {
        return;
      }
      std::this_thread::sleep_for(delay);
      delay *= 2;
    }
  };
  // Sends every shard but those known stored (answered SHARDS_DROPPED: the commit they
  // completed dropped others).
  const auto send_all = [&] {
    const auto stored = [&](size_t i) {
      return !answers[i].ok() && answers[i].status().subcode() == StatusSubcode::kShardsDropped;
    };
    std::vector<std::jthread> threads;
    for (size_t i = 1; i < plans.size(); ++i) {
      if (!stored(i)) threads.emplace_back(send, i);
    }
    if (!stored(0)) send(0);
  };
  std::optional<PushResult> result;
  std::string failed;
  std::optional<Status> dropped;  // the last answer that other shards were dropped
  const auto collect = [&] {
    result.reset();
    failed.clear();
    dropped.reset();
    for (size_t i = 0; i < answers.size(); ++i) {
      if (!answers[i].ok()) {
        // Stored, but the commit it completed dropped other shards: they go again below.
        if (encoded && answers[i].status().subcode() == StatusSubcode::kShardsDropped) {
          dropped = answers[i].status();
          continue;
        }
        failed += (failed.empty() ? "" : "; ") + std::string("shard ") + std::to_string(i) + ": " +
                  answers[i].status().message();
        continue;
      }
      const nlohmann::json& body = answers[i]->body;
      if (body.contains("version") && body["version"].is_object() && !result) {
        result = PushResultFromJson(body["version"]);
      }
    }
  };
  send_all();
  collect();
  if (encoded && failed.empty() && !result) {
    // A commit may drop shards coded by a plan gone stale (another writer moved the model on)
    // or against a part that drifted (SHARDS_DROPPED to the shard that completed the upload):
    // each is stored again (planned anew, or sent plain), and a
    // shard the version already holds is answered with the version.
    send_all();
    collect();
  }
  close(fd);

  if (!failed.empty()) {
    // The first failure's kind, every failure's reason.
    for (const auto& a : answers) {
      if (!a.ok()) return Status(a.status().code(), "sharded push failed: " + failed);
    }
  }
  if (!result && dropped) return *dropped;
  if (!result) {
    return Status::FailedPrecondition(
        "every shard was stored but none committed the version (see GET .../versions/" +
        std::to_string(version) + "/shards)");
  }
  if (encoded) {
    // Coded here when every shard was. The reference was pulled when some rank pulled its
    // part, held when every rank that needed one held it; the notes of every shard.
    result->encoded = true;
    result->sent_bytes = 0;
    std::set<std::string> notes;
    for (const ShardCoding& coding : codings) {
      result->encoded = result->encoded && coding.encoded;
      result->sent_bytes += coding.sent_bytes;
      if (coding.reference == "pulled" || result->reference.empty()) {
        result->reference = coding.reference;
      }
      if (!coding.reference_note.empty()) notes.insert(coding.reference_note);
    }
    for (const std::string& note : notes) {
      result->reference_note += (result->reference_note.empty() ? "" : "; ") + note;
    }
  } else {
    result->sent_bytes = total;  // every shard's body, as it is
  }
  return *result;
}

}  // namespace ckpt
