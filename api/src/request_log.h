// RequestLog: the facts of one request for the access log, request ids, the log line, and the
// log of a session that ended by an exception.
// Internal to api/.
//
// Thread safety: a RequestLog belongs to its session; the functions are safe to call from
// any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace ckpt::api {

// Per-request facts for the access log.
struct RequestLog {
  std::string id;  // X-Request-Id: the client's if it sent a sane one, else generated
  std::string_view route = "unknown";
  std::string method;
  std::string target;
  std::string principal = "-";  // the token's name, "-" without authorization
  int status = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  // An error's detail for the log only (ApiResponse::error_detail): file names, the storage
  // engine's wording.
  std::string error_detail;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

// A request id the client may choose: 1..64 characters of [A-Za-z0-9._-].
bool SaneRequestId(std::string_view id);

// A fresh request id: a per-process random prefix and a counter, 16 hex digits.
std::string NewRequestId();

// Writes the request's access-log line (a JSON object when `json`).
void LogRequest(const RequestLog& log, std::string_view remote, bool json);

// Logs an exception that ended a session coroutine. Expected failures are Status values, so
// one is a bug: the connection is gone, the daemon serves on, and the log says why.
void LogEscapedException(std::exception_ptr error);

}  // namespace ckpt::api
