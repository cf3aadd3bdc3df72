#include "ckpt/base/status.h"

namespace ckpt {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kIoError:
      return "IO_ERROR";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

std::optional<StatusCode> StatusCodeFromName(std::string_view name) {
  for (StatusCode code :
       {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kNotFound,
        StatusCode::kAlreadyExists, StatusCode::kFailedPrecondition, StatusCode::kAborted,
        StatusCode::kResourceExhausted, StatusCode::kDataLoss, StatusCode::kUnavailable,
        StatusCode::kInternal, StatusCode::kIoError, StatusCode::kUnauthenticated,
        StatusCode::kPermissionDenied}) {
    if (StatusCodeName(code) == name) return code;
  }
  return std::nullopt;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

std::string Status::ToLogString() const {
  std::string out = ToString();
  if (!detail_.empty()) {
    out += " (";
    out += detail_;
    out += ")";
  }
  return out;
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  Status s = *this;
  s.message_ = std::string(prefix) + ": " + message_;
  return s;
}

Status Status::WithDetail(std::string detail) const {
  if (ok()) return *this;
  Status s = *this;
  s.detail_ = std::move(detail);
  return s;
}

}  // namespace ckpt
