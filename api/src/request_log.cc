// The access log's facts and lines (request_log.h).
#include "request_log.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

namespace ckpt::api {

bool SaneRequestId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string NewRequestId() {
  static const uint32_t prefix = std::random_device{}();
  static std::atomic<uint32_t> counter{0};
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", prefix, counter.fetch_add(1));
  return id;
}

void LogRequest(const RequestLog& log, std::string_view remote, bool json) {
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - log.start)
          .count();
  if (json) {
    nlohmann::json line = {{"request_id", log.id},       {"remote", remote},
                           {"principal", log.principal}, {"method", log.method},
                           {"target", log.target},       {"route", log.route},
                           {"status", log.status},       {"bytes_in", log.bytes_in},
                           {"bytes_out", log.bytes_out}, {"ms", std::round(ms * 10) / 10}};
    if (!log.error_detail.empty()) line["error_detail"] = log.error_detail;
    spdlog::info("{}", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  spdlog::info("{} {} {} {} {} status={} in={} out={} {:.1f}ms{}{}", remote, log.id, log.principal,
               log.method, log.target, log.status, log.bytes_in, log.bytes_out, ms,
               log.error_detail.empty() ? "" : " error_detail=", log.error_detail);
}

void LogEscapedException(std::exception_ptr error) {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    spdlog::error("a connection was dropped by an unexpected exception: {}", e.what());
  } catch (...) {
    spdlog::error("a connection was dropped by an unexpected non-standard exception");
  }
}

}  // namespace ckpt::api
