// Client::PullEncoded: a version received as its stored chunk records and decoded here
// (docs/api.md, "Encoded pull").
#include "ckpt/codec/encoded_pull.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>

#include "ckpt/base/model_name.h"
#include "ckpt/client/client.h"
#include "ckpt/codec/edge_encoder.h"
#include "encoded_part_pull.h"
#include "encoding_stream.h"
#include "held_reference.h"
#include "put_stream.h"
#include "query_strings.h"

namespace ckpt {
namespace {

// One attempt: the version (a part of it unless `whole`) since `since` (0: none) into `partial`,
// and into `kept_partial` too unless it is empty (the copy that becomes the reference held).
Result<PullResult> PullOnce(const std::vector<ServerEndpoint>& servers,
                            const ClientOptions& options, TlsContext* tls,
                            const std::string& target, bool whole, const CheckpointView* since,
                            const std::string& partial, const std::string& kept_partial,
                            int threads) {
  CKPT_ASSIGN_OR_RETURN(WritebackFile out, WritebackFile::Create(partial));
  std::optional<WritebackFile> kept;
  if (!kept_partial.empty()) {
    CKPT_ASSIGN_OR_RETURN(WritebackFile file, WritebackFile::Create(kept_partial));
    kept.emplace(std::move(file));
  }
  EncodedPullDecoder decoder(
      since,
      [&](std::string_view bytes) {
        CKPT_RETURN_IF_ERROR(out.Write(bytes));
        return kept ? kept->Write(bytes) : Status::Ok();
      },
      threads);
  CKPT_ASSIGN_OR_RETURN(
      PullResult received,
      StreamGet(servers, options, tls, target, kEncodedPullMediaType,
                [&](const char* data, size_t n) {
                  return decoder.Feed({reinterpret_cast<const uint8_t*>(data), n});
                }));
  CKPT_RETURN_IF_ERROR(decoder.Finish());
  if (decoder.whole_version() != whole) {
    return Status::DataLoss(whole ? "the server sent a part of the version asked for whole"
                                  : "the server sent the whole version where a part was asked");
  }
  CKPT_RETURN_IF_ERROR(out.Close());
  if (kept) CKPT_RETURN_IF_ERROR(kept->Close());
  PullResult result;
  result.version = decoder.version();
  result.since_version = decoder.since_version();
  result.bytes = decoder.restored_bytes();
  result.sha256 = decoder.sha256();
  result.verified = decoder.whole_version();
  result.received_bytes = received.bytes;
  return result;
}

// Whether renaming a file to `path` replaces the directory entry `entry` (the same name in the
// same directory); false when that cannot be told.
bool ReplacesEntry(const std::string& path, const std::string& entry) {
  std::error_code ec;
  const std::filesystem::path a = std::filesystem::absolute(path, ec);
  if (ec) return false;
  const std::filesystem::path b = std::filesystem::absolute(entry, ec);
  if (ec || a.filename() != b.filename()) return false;
  return std::filesystem::equivalent(a.parent_path(), b.parent_path(), ec) && !ec;
}

}  // namespace

Result<PullResult> PullEncodedPart(const std::vector<ServerEndpoint>& servers,
                                   const ClientOptions& options, TlsContext* tls,
                                   const std::string& target, const std::string& path,
                                   int threads) {
  const std::string partial = path + ".partial";
  auto pulled =
      PullOnce(servers, options, tls, target, /*whole=*/false, nullptr, partial, "", threads);
  std::error_code ec;
  if (pulled.ok()) std::filesystem::rename(partial, path, ec);
  if (!pulled.ok() || ec) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    if (ec) return Status::IoError("cannot rename '" + partial + "': " + ec.message());
  }
  return pulled;
}

Result<PullResult> Client::PullEncoded(std::string_view model, std::string_view version,
                                       const std::string& path, const EncodedPullOptions& encoded,
                                       const PullOptions& part) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  if (!part.hf_file.empty()) {
    return Status::InvalidArgument("an encoded pull does not send the Hugging Face view");
  }
  if (!part.tensors.empty() || part.ranks > 0) {
    return PullEncodedPart(
        endpoints_, options_, tls_.get(),
        "/v1/models/" + std::string(model) + "/versions/" + std::string(version) + PullQuery(part),
        path, CodecThreads(encoded.threads));
  }
  if (encoded.reference_dir.empty()) return PullEncodedClaimed(model, version, path, encoded);
  CKPT_ASSIGN_OR_RETURN(const ReferenceLock lock,
                        ReferenceLock::Acquire(encoded.reference_dir, model));
  return PullEncodedClaimed(model, version, path, encoded);
}

Result<PullResult> Client::PullEncodedClaimed(std::string_view model, std::string_view version,
                                              const std::string& path,
                                              const EncodedPullOptions& encoded) {
  const std::string& dir = encoded.reference_dir;
  const int threads = CodecThreads(encoded.threads);
  std::optional<HeldReference> held;
  std::optional<MappedFile> held_file;
  std::optional<CheckpointView> since;
  if (!dir.empty()) {
    held = HeldReferenceOf(dir, model);
    if (held->version > 0) {
      auto mapped = MappedFile::Open(held->path);
      if (mapped.ok()) {
        held_file.emplace(std::move(mapped).value());
        auto view = CheckpointView::Parse(held_file->bytes());
        if (view.ok()) since.emplace(std::move(view).value());
      }
    }
  }
  const std::string partial = path + ".partial";
  // The version pulled becomes the one held (the base of the next sync or push) unless it is
  // older than the one held, which is then nearer the next sync and is the next push's base
  // (pushes code against the latest). It is written beside the reference as it comes, unless
  // the pull's rename replaces the reference's own directory entry (a link to it is replaced,
  // not the file it names), or a numbered version older than the one held is asked for. The
  // reference's lock is held, so the copy has a fixed name: a pull cut off leaves it to the
  // next one to truncate.
  const bool output_is_reference = held && ReplacesEntry(path, held->path);
  uint64_t asked = 0;
  const char* const version_end = version.data() + version.size();
  const auto [parsed_end, parse_error] = std::from_chars(version.data(), version_end, asked);
  const bool older_asked = parse_error == std::errc() && parsed_end == version_end && held &&
                           since && asked < held->version;
  const bool keeps_copy = held && !output_is_reference && !older_asked;
  const std::string kept_partial = keeps_copy ? held->path + ".pulling" : std::string();
  const std::string base = "/v1/models/" + std::string(model) + "/versions/" + std::string(version);
  auto pulled = since ? PullOnce(endpoints_, options_, tls_.get(),
                                 base + "?since=" + std::to_string(held->version), /*whole=*/true,
                                 &*since, partial, kept_partial, threads)
                      : Result<PullResult>(Status::NotFound("no reconstruction held"));
  // What is held could not serve (unreadable, not what its sidecar says, or a version the
  // server no longer has): it is kept no longer, whatever the version pulled.
  const bool held_unusable = held && held->version > 0 && (!since || !pulled.ok());
  // Without a usable reconstruction (none, or one that is not what its sidecar says, or a
  // version the server no longer has), the chains from their keyframes.
  if (!pulled.ok() && (!since || pulled.status().code() == StatusCode::kNotFound ||
                       pulled.status().code() == StatusCode::kDataLoss ||
                       pulled.status().code() == StatusCode::kFailedPrecondition)) {
    pulled = PullOnce(endpoints_, options_, tls_.get(), base, /*whole=*/true, nullptr, partial,
                      kept_partial, threads);
  }
  const auto remove_partials = [&] {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    if (keeps_copy) std::filesystem::remove(kept_partial, ignored);
  };
  if (!pulled.ok()) {
    remove_partials();
    return pulled.status();
  }
  held_file.reset();
  const bool newer = held && pulled->version >= held->version;
  // The reference becomes the version pulled (a copy was written, or the output is it).
  const bool replaces_reference =
      held && (output_is_reference || (keeps_copy && (newer || held_unusable)));
  // Until the new sidecar is written, nothing claims what the reference holds; one that could
  // not serve and is not replaced is forgotten.
  if (replaces_reference || (held && held_unusable)) CKPT_RETURN_IF_ERROR(ForgetSidecar(*held));
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    remove_partials();
    return Status::IoError("cannot rename '" + partial + "': " + ec.message());
  }
  if (keeps_copy && !replaces_reference) {
    std::error_code ignored;
    std::filesystem::remove(kept_partial, ignored);
  }
  if (replaces_reference) {
    if (keeps_copy) std::filesystem::rename(kept_partial, held->path, ec);
    if (ec) {
      remove_partials();
      return Status::IoError("cannot keep '" + held->path + "': " + ec.message());
    }
    CKPT_RETURN_IF_ERROR(WriteSidecar(*held, pulled->version, pulled->sha256));
  }
  return pulled;
}

}  // namespace ckpt
