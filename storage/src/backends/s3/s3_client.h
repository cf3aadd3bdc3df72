// S3Client: the requests of the S3 API the store uses (conditional PUT, ranged GET, HEAD,
// DELETE, multi-object delete, ListObjectsV2, multipart upload), signed with SigV4 by libcurl,
// over a pool of reused connections, retried with jittered back-off. Internal to storage/.
//
// Keys are relative to the bucket and S3Options::prefix. Every request that fails transiently
// (503 SlowDown, 500/502/504, 409 from a racing conditional write, timeouts, resets, short
// bodies) is retried up to S3Options::attempts times; what is left fails with Unavailable naming
// the request and the last error. Answers map to: 404 NotFound, 412 FailedPrecondition (a
// condition did not hold), 403 PermissionDenied, other 4xx InvalidArgument.
//
// A retried request may have been applied by an attempt whose answer was lost: a conditional
// create then answers 412 to its own retry. Callers that must tell the two apart read the
// object back (the store's commits carry a unique token for that).
//
// Thread safety: safe for concurrent use. Async runs its jobs on up to S3Options::parallelism
// threads of the client.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/s3/s3_xml.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

typedef void CURL;

namespace ckpt {

// A fault the tests inject into one attempt of a request (S3Options::faults).
enum class S3Fault {
  kNone,
  kSlowDown,         // answered 503 SlowDown, not applied
  kInternalError,    // answered 500, not applied
  kTimeout,          // no answer, not applied
  kReset,            // connection reset before the request was applied
  kLostAnswer,       // applied, then the connection reset before the answer
  kShortBody,        // applied; the answer's body cut short
  kPreconditionLost  // answered 412, not applied (a race lost to another writer)
};

// Decides the fault of each attempt: `method` and `key` of the request, `attempt` from 0.
class S3FaultInjector {
 public:
  virtual ~S3FaultInjector() = default;
  virtual S3Fault Next(std::string_view method, std::string_view key, int attempt) = 0;
  // Called when an attempt's answer (HTTP `status`) has arrived, before the client acts on it:
  // where a test ends its process to simulate a crash right after a request was applied.
  virtual void Answered(std::string_view /*method*/, std::string_view /*key*/, long /*status*/) {}
};

// The condition of a PUT.
struct S3Condition {
  bool if_none_match = false;  // If-None-Match: *  (create only)
  std::string if_match;        // If-Match: <etag>  (replace only that content)
};

struct S3Object {
  std::string body;
  std::string etag;  // without quotes
  // The server's clock: when the object was last written, and when it answered (seconds since
  // the epoch; 0 when the answer did not say). Their difference is an age on one clock.
  int64_t last_modified = 0;
  int64_t server_date = 0;
};

// Waits for every job (so that what they reference may go); the first error.
Status WaitForAll(std::vector<std::future<Status>>& jobs);

class S3Client {
 public:
  // Checks nothing; Probe does.
  explicit S3Client(S3Options options, std::shared_ptr<S3FaultInjector> faults = nullptr);
  ~S3Client();

  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Writes the whole object; returns its ETag. Bodies over S3Options::part_bytes go as a
  // multipart upload (unconditional only; its ETag may be empty when a retried completion found
  // the object made). A multipart upload a lost answer left begun is not removed: give the
  // bucket a lifecycle rule that aborts incomplete uploads (docs/deployment.md).
  Result<std::string> Put(std::string_view key, std::string_view body,
                          const S3Condition& condition = {});
  // The object, or `length` bytes of it from `offset` (length 0: to the end).
  Result<S3Object> Get(std::string_view key, uint64_t offset = 0, uint64_t length = 0);
  // The object's size (HEAD); NotFound if there is none.
  Result<uint64_t> Size(std::string_view key);
  // Removes the object (Ok if there was none).
  Status Delete(std::string_view key);
  // Removes the objects, 1000 per request; the first error after trying all.
  Status DeleteMany(const std::vector<std::string>& keys);
  // One page of the keys starting with `prefix` in key order, after `start_after`
  // (`max_keys` 0: the server's page size), grouped by `delimiter` if one is given. Keys and
  // common prefixes are returned relative to the store's prefix.
  Result<s3_xml::ListPage> ListPage(std::string_view prefix, std::string_view start_after,
                                    uint32_t max_keys, std::string_view continuation = {},
                                    std::string_view delimiter = {});
  // Every key starting with `prefix`.
  Result<std::vector<s3_xml::ListedObject>> ListAll(std::string_view prefix);

  // Runs `job` on one of the client's threads.
  std::future<Status> Async(std::function<Status()> job);

  // Checks that the bucket answers and honours what the store relies on: If-None-Match: *
  // refuses to replace an object, If-Match takes the current ETag and refuses another. Writes
  // and removes a probe object under the prefix. FailedPrecondition naming what is missing.
  Status Probe();

  // How If-Match names an ETag on this server: quoted ("etag", the standard) or bare (what Ceph
  // RGW 16 compares). Found by Probe; quoted until then.
  bool quotes_if_match() const { return quote_if_match_; }

  const S3Options& options() const { return options_; }
  // Requests sent (attempts included) since the client was made, and their body bytes each way,
  // for the figures.
  uint64_t requests() const;
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  struct Request;
  struct Response;
  Result<Response> Send(Request& request);
  Result<Response> Attempt(Request& request, CURL* curl, int attempt);
  std::string Url(std::string_view key, std::string_view query) const;
  std::string FullKey(std::string_view key) const;
  Result<std::string> PutMultipart(std::string_view key, std::string_view body);
  CURL* TakeHandle();
  void ReturnHandle(CURL* curl);
  void Work();

  const S3Options options_;
  const std::shared_ptr<S3FaultInjector> faults_;
  const std::string sigv4_;        // "aws:amz:<region>:s3"
  const std::string credentials_;  // "<access>:<secret>", handed to curl, never logged
  std::atomic<bool> quote_if_match_{true};

  std::mutex handles_mu_;
  std::vector<CURL*> handles_;  // idle handles, their connections kept alive

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<std::packaged_task<Status()>> jobs_;  // guarded by jobs_mu_
  bool stopping_ = false;                          // guarded by jobs_mu_
  std::vector<std::thread> workers_;               // started as jobs need them

  mutable std::mutex stats_mu_;
  uint64_t requests_ = 0;        // guarded by stats_mu_
  uint64_t bytes_sent_ = 0;      // guarded by stats_mu_
  uint64_t bytes_received_ = 0;  // guarded by stats_mu_
};

}  // namespace ckpt
