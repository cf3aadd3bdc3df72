// The XML of the S3 API that the S3 client reads and writes (ListObjectsV2 answers, error
// bodies, multipart uploads, multi-object deletes), through expat. Internal to storage/.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::s3_xml {

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

// One page of a ListObjectsV2 answer.
struct ListPage {
  std::vector<ListedObject> objects;
  std::vector<std::string> common_prefixes;  // with a delimiter
  bool truncated = false;
  std::string next_continuation_token;
};

Result<ListPage> ParseListPage(std::string_view xml);

// The Code and Message of an S3 error body (empty when the body is not one).
struct ErrorBody {
  std::string code;
  std::string message;
};
ErrorBody ParseError(std::string_view xml);

// The UploadId of an InitiateMultipartUploadResult.
Result<std::string> ParseUploadId(std::string_view xml);

// The ETag of a CompleteMultipartUploadResult (without quotes; empty if none).
std::string ParseCompletedEtag(std::string_view xml);

// A CompleteMultipartUpload body for parts 1..etags.size().
std::string CompleteMultipartBody(const std::vector<std::string>& etags);

// A Delete (multi-object delete) body, quiet: the answer lists only failures.
std::string DeleteBody(const std::vector<std::string>& keys);
// The keys a multi-object delete answer reports as not deleted, with their error codes.
Result<std::vector<std::pair<std::string, std::string>>> ParseDeleteErrors(std::string_view xml);

}  // namespace ckpt::s3_xml
