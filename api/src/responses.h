// The JSON renderings and response shapes shared by the API's handlers. Internal to api/.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/api/api_handler.h"

namespace ckpt::api {

// Serializes a response document. Invalid UTF-8 (a label or a path segment echoed in an error
// message can hold any bytes) becomes U+FFFD instead of an exception.
std::string Dump(const nlohmann::json& doc);

// "2026-01-02T03:04:05.678Z" for Unix epoch milliseconds.
std::string Iso8601(int64_t ms);

nlohmann::json VersionJson(const VersionInfo& v);
nlohmann::json UploadJson(const ShardUploadInfo& upload);

// A JSON response of `status` with `body` (and a final newline).
ApiResponse JsonResponse(int status, const nlohmann::json& body);

// The error object of every error body: {"code": ..., "message": ...} (and "reason" for a
// refined code).
nlohmann::json ErrorObject(std::string_view code, std::string_view message);
nlohmann::json ErrorObject(const Status& status);

ApiResponse NoContent();

}  // namespace ckpt::api
