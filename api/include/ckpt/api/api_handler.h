// ApiHandler: the HTTP API of ckptd as a pure function of the request, independent of sockets.
//
// The HTTP session (src/server/session.cc) parses the request line and headers, classifies the
// route (routes.h), and then either passes a small body to Handle() or — for the two
// streaming routes — drives a PushSession / RestoreStream obtained from the handler. Every
// Status is turned into an HTTP response in exactly one place, ErrorResponse().
//
// The API contract is documented in docs/api.md.
//
// Thread safety: safe for concurrent use (it holds only a pointer to a thread-safe store).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/api/metrics.h"
#include "ckpt/api/routes.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"
#include "ckpt/storage/maintenance_service.h"

namespace ckpt::api {

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // The request changed nothing because its model was busy (ABORTED): it may be retried.
  bool model_busy = false;
  // An error's detail for the server's log (Status::detail), never sent.
  std::string error_detail;
};

// Called with the model's name whenever its versions changed: after every committed push and
// every DELETE of a version (the daemon schedules the passes that follow: the latest's
// rearrangement, retention and the reclaim of what a deleted version held).
using VersionsChangedHook = std::function<void(const std::string& model)>;

// A request body streamed into the store (RequestPlan::kPush): a whole version, or one shard
// of a sharded version. Thread-compatible; destroying it unfinished aborts the body.
class PushBody {
 public:
  virtual ~PushBody() = default;
  virtual Status Write(std::span<const uint8_t> bytes) = 0;
  // Ends the body and renders the answer: 201 with the version committed, 202 with the
  // upload's state for a shard stored before the last, 200 for a shard sent again after its
  // version was committed, or the error.
  virtual ApiResponse Finish() = 0;
};

class ApiHandler {
 public:
  // `decode_encoded_payloads`: PushOptions::decode_encoded_payloads of every encoded push.
  explicit ApiHandler(CheckpointStore* store, VersionsChangedHook on_versions_changed = nullptr,
                      bool decode_encoded_payloads = true)
      : store_(store),
        maintenance_(store),
        on_versions_changed_(std::move(on_versions_changed)),
        decode_encoded_payloads_(decode_encoded_payloads) {}

  // The metrics GET /metrics reports; the server records each finished request here.
  ServerMetrics& metrics() { return metrics_; }

  // Handles a non-streaming request. `body` is the full request body.
  ApiResponse Handle(std::string_view method, const Route& route, std::string_view body);

  // With a cluster: for a request that changes a model another daemon writes (holds the lease
  // of), the 307 redirect to that daemon (`target`: the request target, kept as is), or 503 when
  // the owner advertises no URL. nullopt: handle the request here.
  std::optional<ApiResponse> WriteRedirect(std::string_view method, const Route& route,
                                           std::string_view target);

  // Starts a push for PUT /v1/models/{model}/versions/{version}, or of one shard for PUT
  // .../versions/{version}/shards/{shard}?of=N.
  Result<std::unique_ptr<PushBody>> BeginPush(const Route& route,
                                              std::optional<uint64_t> content_length);
  // CheckpointStore::CallWhenModelFree for the route's model: a request refused as busy
  // (ApiResponse::model_busy, or a push's ABORTED) tries again once it is called.
  bool CallWhenModelFree(const Route& route, std::function<void()> on_free) {
    return store_->CallWhenModelFree(route.model, std::move(on_free));
  }
  // Finishes a push and renders its response (or the error); runs the push hook when a
  // version was committed.
  ApiResponse FinishPush(PushBody& body) { return body.Finish(); }

  // Opens a restore for GET/HEAD /v1/models/{model}/versions/{version|latest}, of the part
  // the query selects (ParseRestoreQuery).
  Result<std::unique_ptr<RestoreStream>> OpenRestore(const Route& route);
  // A restore answering the request's Range and If-Range headers (empty when absent): the
  // whole body (200), one byte range of it (206, with Content-Range), or a refusal (416 for a
  // range that starts past the end). Multiple ranges, malformed ones and an If-Range that
  // does not name the version's ETag get the whole body, as HTTP allows.
  struct RestoreAnswer {
    int status = 200;
    std::unique_ptr<RestoreStream> stream;  // null with a refusal
    std::vector<std::pair<std::string, std::string>> headers;
    std::optional<ApiResponse> refusal;
  };
  Result<RestoreAnswer> BeginRestore(const Route& route, std::string_view range,
                                     std::string_view if_range);

  // Headers describing a restore (Content-Length is set by the session).
  static std::vector<std::pair<std::string, std::string>> RestoreHeaders(const VersionInfo& info);

  // The only place where Status codes become HTTP status codes.
  static ApiResponse ErrorResponse(const Status& status);
  static int HttpStatusFor(StatusCode code);
  // With the subcode: NO_SPACE is 507 Insufficient Storage.
  static int HttpStatusFor(const Status& status);
  // 405 with an Allow header listing what the route answers (its RouteSpec::methods).
  static ApiResponse MethodNotAllowed(std::string_view method, const Route& route);

 private:
  // "latest" (nullopt), a number, or "tag:<name>" resolved to its version.
  Result<std::optional<uint64_t>> ResolveVersion(const Route& route);
  ApiResponse HandleRetentionRun(const Route& route, std::string_view body);
  ApiResponse HandleUpload(std::string_view method, const Route& route);
  ApiResponse HandlePlan(const Route& route, std::string_view raw_header);
  ApiResponse HandleShardPlan(const Route& route, std::string_view raw_header);
  // BeginRestore for a client that accepts an encoded pull body (Route::encoded_pull).
  Result<RestoreAnswer> BeginEncodedRestore(const Route& route);
  ApiResponse HandleUploadCommit(const Route& route);
  // The response to a shard stored or a version committed by one; runs the push hook.
  ApiResponse ShardResponse(const ShardResult& result);
  friend class ShardBody;
  friend class VersionBody;
  ApiResponse HandleAdminGc();
  ApiResponse HandleAdminScrub();
  ApiResponse HandleAdminBackup(std::string_view body);

  CheckpointStore* store_;
  MaintenanceService maintenance_;  // the admin passes
  VersionsChangedHook on_versions_changed_;
  const bool decode_encoded_payloads_;
  ServerMetrics metrics_;
};

// The query parameters of a push: metric.<name>=<number>, label.<name>=<text>, tag=<name>
// (repeatable), percent-decoded. Unknown parameters are InvalidArgument.
Result<PushOptions> ParsePushQuery(std::string_view query);

// JSON renderings shared with the daemon's logs and the offline `ckptd gc`.
std::string RetentionReportJson(const RetentionReport& report);
std::string ScrubReportJson(const ScrubReport& report);
std::string BackupResultJson(const BackupResult& backup);

// The query parameters of a restore: tensors=<glob>[,<glob>...] (repeatable), rank=<i>&of=<M>
// (the resharded view), tensor=<name>&offsets=<a,b,...>&shape=<c,d,...> (one box). Unknown
// parameters are InvalidArgument. With `since` (an encoded pull), since=<version> is taken too.
Result<RestoreSelection> ParseRestoreQuery(std::string_view query,
                                           std::optional<uint64_t>* since = nullptr);

// The query of the Hugging Face view: max_shard_bytes=<N> (the largest file), else
// `default_bytes`.
Result<uint64_t> ParseHfQuery(std::string_view query, uint64_t default_bytes);

// The query parameters of a shard push: of=<N> (required) and those of ParsePushQuery.
Result<std::pair<uint32_t, PushOptions>> ParseShardQuery(std::string_view query);

// A single byte range of a body of `size` bytes from a Range header ("bytes=a-b", "bytes=a-",
// "bytes=-n"): nullopt for anything else (the whole body is then sent); first > last when the
// range is unsatisfiable (it starts past the end).
std::optional<std::pair<uint64_t, uint64_t>> ParseByteRange(std::string_view header, uint64_t size);

// Parses a decimal u64 (no sign, no leading '+', no overflow).
Result<uint64_t> ParseVersionNumber(std::string_view text);

}  // namespace ckpt::api
