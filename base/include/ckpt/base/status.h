// Status and Result<T>: how every ckptd function that can fail reports it.
//
// Modeled on absl::Status / rocksdb::Status. Expected failures (bad input, missing
// version, I/O errors) are values, never exceptions. Codes are canonical and map to HTTP
// status codes in exactly one place (ApiHandler::HttpStatusFor, api/src/api_handler.cc).
//
// Thread safety: Status and Result are values; distinct objects may be used concurrently,
// a single object needs external synchronization like any other value type.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ckpt {

// Canonical error codes. The numeric values are not persisted anywhere.
enum class StatusCode {
  kOk,
  kInvalidArgument,     // the caller's input is malformed (HTTP 400)
  kNotFound,            // model or version does not exist (HTTP 404)
  kAlreadyExists,       // the thing to create already exists (HTTP 409)
  kFailedPrecondition,  // the request conflicts with the current state (HTTP 409)
  kAborted,             // a concurrent operation holds what is needed; retrying may succeed
                        // (HTTP 409)
  kResourceExhausted,   // a configured size limit was exceeded (HTTP 413)
  kDataLoss,            // stored or transmitted bytes are corrupt (HTTP 500)
  kUnavailable,         // shutting down or temporarily unable to serve (HTTP 503)
  kInternal,            // a bug or an unexpected library failure (HTTP 500)
  kIoError,             // the storage engine failed to read or write (HTTP 500)
  kUnauthenticated,     // no valid credentials were presented (HTTP 401)
  kPermissionDenied,    // the credentials do not cover the request (HTTP 403)
};

// Refines a code where a client acts differently on the refinement; HTTP maps it too.
enum class StatusSubcode {
  kNone,
  // Refines kResourceExhausted: the data volume is full or at its free-space reserve (HTTP 507),
  // rather than a configured size limit of the request (HTTP 413). Freeing space helps;
  // resending the same request unchanged does not, until then.
  kNoSpace,
  // Refines kFailedPrecondition: an encoded push was coded by a plan that is no longer the
  // model's (another version was pushed since, or its policy changed; HTTP 409). Asking for a
  // new plan, pulling its base and encoding again helps; resending the same body does not.
  kStalePlan,
  // Refines kInvalidArgument: a delta of an encoded push does not decode, against the base's
  // reconstruction, to what its client reconstructed (HTTP 400): the client's reference is not
  // that reconstruction. Pulling the base and encoding again helps; resending does not.
  kReferenceDrifted,
  // Refines kFailedPrecondition: the shard a request sent is stored, but the commit its arrival
  // completed dropped other ranks' shards (coded by a plan that is no longer the model's, or
  // against a reference that drifted; HTTP 409): the version commits when their ranks send them
  // again. This shard needs nothing more.
  kShardsDropped,
};

// Returns a stable upper-snake name such as "INVALID_ARGUMENT", used in JSON error bodies.
std::string_view StatusCodeName(StatusCode code);
// The code named `name` (StatusCodeName's inverse); nullopt for any other text.
std::optional<StatusCode> StatusCodeFromName(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Unauthenticated(std::string msg) {
    return {StatusCode::kUnauthenticated, std::move(msg)};
  }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }
  // kResourceExhausted refined by kNoSpace.
  static Status NoSpace(std::string msg) {
    Status s(StatusCode::kResourceExhausted, std::move(msg));
    s.subcode_ = StatusSubcode::kNoSpace;
    return s;
  }

  // kFailedPrecondition refined by kStalePlan.
  static Status StalePlan(std::string msg) {
    Status s(StatusCode::kFailedPrecondition, std::move(msg));
    s.subcode_ = StatusSubcode::kStalePlan;
    return s;
  }

  // kInvalidArgument refined by kReferenceDrifted.
  static Status ReferenceDrifted(std::string msg) {
    Status s(StatusCode::kInvalidArgument, std::move(msg));
    s.subcode_ = StatusSubcode::kReferenceDrifted;
    return s;
  }

  // kFailedPrecondition refined by kShardsDropped.
  static Status ShardsDropped(std::string msg) {
    Status s(StatusCode::kFailedPrecondition, std::move(msg));
    s.subcode_ = StatusSubcode::kShardsDropped;
    return s;
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  StatusSubcode subcode() const { return subcode_; }
  // What a client is told: never a server path or an internal file name.
  const std::string& message() const { return message_; }
  // What only the server's log shows beside the message (the storage engine's own wording,
  // with file names); empty when the message says everything.
  const std::string& detail() const { return detail_; }

  // "INVALID_ARGUMENT: message", or "OK". Without the detail: safe to send.
  std::string ToString() const;
  // ToString() followed by " (detail)" when there is a detail: for logs.
  std::string ToLogString() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK. Keeps the subcode and
  // the detail.
  Status WithContext(std::string_view prefix) const;
  // Returns a copy carrying `detail` for the log; OK stays OK.
  Status WithDetail(std::string detail) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.subcode_ == b.subcode_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  StatusSubcode subcode_ = StatusSubcode::kNone;
  std::string message_;
  std::string detail_;
};

// Either a value of type T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(state_).ok() && "Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(state_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace ckpt

#define CKPT_STATUS_CONCAT_INNER(a, b) a##b
#define CKPT_STATUS_CONCAT(a, b) CKPT_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (a Status); returns it from the enclosing function if not OK.
#define CKPT_RETURN_IF_ERROR(expr)                       \
  do {                                                   \
    ::ckpt::Status ckpt_status_tmp_ = (expr);            \
    if (!ckpt_status_tmp_.ok()) return ckpt_status_tmp_; \
  } while (0)

// Evaluates `rexpr` (a Result<T>); on error returns its Status, else moves the value into `lhs`.
#define CKPT_ASSIGN_OR_RETURN(lhs, rexpr) \
  CKPT_ASSIGN_OR_RETURN_IMPL(CKPT_STATUS_CONCAT(ckpt_result_, __LINE__), lhs, rexpr)
#define CKPT_ASSIGN_OR_RETURN_IMPL(result, lhs, rexpr) \
  auto result = (rexpr);                               \
  if (!result.ok()) return result.status();            \
  lhs = std::move(result).value()
