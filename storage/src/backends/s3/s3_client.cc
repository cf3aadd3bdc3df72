// The S3 API over libcurl (s3_client.h).
#include "backends/s3/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

namespace ckpt {
namespace {

constexpr size_t kDeleteBatch = 1000;  // S3's limit per multi-object delete
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kLastBackoff = std::chrono::milliseconds(5000);

// libcurl's global state, set up once before the first handle.
void InitCurlOnce() {
  static const bool done = [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return true;
  }();
  (void)done;
}

// RFC 3986 percent-encoding with uppercase hex, as SigV4 wants; '/' kept in paths.
std::string Encode(std::string_view s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string Base64Md5(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_md5(), nullptr);
  unsigned char out[64];
  const int n = EVP_EncodeBlock(out, digest, static_cast<int>(length));
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
}

std::string Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

bool TransientCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct S3Client::Request {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string key;     // relative to the prefix; empty for bucket requests
  std::string query;   // sorted, every parameter with '='
  std::string_view body;
  std::vector<std::string> headers;
  bool conditional = false;  // a 409 is a racing conditional write: retried
};

struct S3Client::Response {
  long status = 0;
  std::string body;
  std::string etag;
  std::optional<uint64_t> content_length;
  int64_t last_modified = 0;
  int64_t date = 0;
};

S3Client::S3Client(S3Options options, std::shared_ptr<S3FaultInjector> faults)
    : options_(std::move(options)),
      faults_(std::move(faults)),
      sigv4_("aws:amz:" + options_.region + ":s3"),
      credentials_(options_.access_key + ":" + options_.secret_key) {
  InitCurlOnce();
}

S3Client::~S3Client() {
  {
    std::lock_guard lock(jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  for (CURL* curl : handles_) curl_easy_cleanup(curl);
}

uint64_t S3Client::requests() const {
  std::lock_guard lock(stats_mu_);
  return requests_;
}

uint64_t S3Client::bytes_sent() const {
  std::lock_guard lock(stats_mu_);
  return bytes_sent_;
}

uint64_t S3Client::bytes_received() const {
  std::lock_guard lock(stats_mu_);
  return bytes_received_;
}

std::string S3Client::FullKey(std::string_view key) const {
  if (options_.prefix.empty()) return std::string(key);
  std::string full = options_.prefix;
  if (full.back() != '/') full += '/';
  return full + std::string(key);
}

std::string S3Client::Url(std::string_view key, std::string_view query) const {
  std::string endpoint = options_.endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  std::string url;
  if (options_.virtual_hosted) {
    const size_t scheme_end = endpoint.find("://");
    const size_t host = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    url = endpoint.substr(0, host) + options_.bucket + "." + endpoint.substr(host) + "/";
  } else {
    url = endpoint + "/" + Encode(options_.bucket, false) + "/";
  }
  if (!key.empty()) url += Encode(FullKey(key), true);
  if (!query.empty()) url += "?" + std::string(query);
  return url;
}

CURL* S3Client::TakeHandle() {
  {
    std::lock_guard lock(handles_mu_);
    if (!handles_.empty()) {
      CURL* curl = handles_.back();
      handles_.pop_back();
      return curl;
    }
  }
  return curl_easy_init();
}

void S3Client::ReturnHandle(CURL* curl) {
  std::lock_guard lock(handles_mu_);
  handles_.push_back(curl);
}

Result<S3Client::Response> S3Client::Attempt(Request& request, CURL* curl, int attempt) {
  {
    std::lock_guard lock(stats_mu_);
    ++requests_;
  }
  auto answer = [](long status, std::string body) {
    Response r;
    r.status = status;
    r.body = std::move(body);
    return r;
  };
  const S3Fault fault =
      faults_ ? faults_->Next(request.method, request.key, attempt) : S3Fault::kNone;
  switch (fault) {
    case S3Fault::kSlowDown:
      return answer(503, "<Error><Code>SlowDown</Code><Message>injected</Message></Error>");
    case S3Fault::kInternalError:
      return answer(500, "<Error><Code>InternalError</Code><Message>injected</Message></Error>");
    case S3Fault::kPreconditionLost:
      return answer(412, "<Error><Code>PreconditionFailed</Code></Error>");
    case S3Fault::kTimeout:
      return Status::Unavailable("timed out (injected)");
    case S3Fault::kReset:
      return Status::Unavailable("connection reset (injected)");
    default:
      break;
  }

  curl_easy_reset(curl);
  Response response;
  struct Upload {
    std::string_view body;
    size_t offset = 0;
  } upload{request.body};
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  const std::string url = Url(request.key, request.query);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(curl, CURLOPT_USERPWD, credentials_.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min<int64_t>(options_.request_timeout.count(), 10000)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(
      curl, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(1, options_.request_timeout.count() / 1000)));
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(curl, CURLOPT_READDATA, &upload);
    curl_easy_setopt(
        curl, CURLOPT_READFUNCTION,
        +[](char* out, size_t size, size_t count, void* data) -> size_t {
          auto* u = static_cast<Upload*>(data);
          const size_t n = std::min(size * count, u->body.size() - u->offset);
          std::memcpy(out, u->body.data() + u->offset, n);
          u->offset += n;
          return n;
        });
    // A rewind for curl's own resend (a redirect, an auth retry).
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &upload);
    curl_easy_setopt(
        curl, CURLOPT_SEEKFUNCTION, +[](void* data, curl_off_t offset, int) -> int {
          static_cast<Upload*>(data)->offset = static_cast<size_t>(offset);
          return CURL_SEEKFUNC_OK;
        });
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    headers = curl_slist_append(headers, "Content-Type: application/xml");
  } else if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* in, size_t size, size_t count, void* data) -> size_t {
        static_cast<Response*>(data)->body.append(in, size * count);
        return size * count;
      });
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response);
  curl_easy_setopt(
      curl, CURLOPT_HEADERFUNCTION, +[](char* in, size_t size, size_t count, void* data) -> size_t {
        auto* r = static_cast<Response*>(data);
        std::string_view line(in, size * count);
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos) return size * count;
        std::string name(line.substr(0, colon));
        std::transform(name.begin(), name.end(), name.begin(), ::tolower);
        const std::string value = Trim(line.substr(colon + 1));
        if (name == "etag") {
          r->etag = value;
          if (r->etag.size() >= 2 && r->etag.front() == '"') {
            r->etag = r->etag.substr(1, r->etag.size() - 2);
          }
        } else if (name == "last-modified") {
          r->last_modified = std::max<int64_t>(0, curl_getdate(value.c_str(), nullptr));
        } else if (name == "date") {
          r->date = std::max<int64_t>(0, curl_getdate(value.c_str(), nullptr));
        } else if (name == "content-length") {
          r->content_length = std::strtoull(value.c_str(), nullptr, 10);
        }
        return size * count;
      });
  const CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (code != CURLE_OK) {
    const std::string error = curl_easy_strerror(code);
    if (TransientCurlError(code)) return Status::Unavailable(error);
    return Status::IoError(error);
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  if (faults_) faults_->Answered(request.method, request.key, response.status);
  {
    std::lock_guard lock(stats_mu_);
    bytes_sent_ += request.body.size();
    bytes_received_ += response.body.size();
  }
  if (fault == S3Fault::kLostAnswer) return Status::Unavailable("connection reset (injected)");
  if (fault == S3Fault::kShortBody && !response.body.empty()) {
    response.body.resize(response.body.size() / 2);
  }
  if (request.method != "HEAD" && response.content_length &&
      response.body.size() != *response.content_length) {
    return Status::Unavailable("answer cut short (" + std::to_string(response.body.size()) +
                               " of " + std::to_string(*response.content_length) + " bytes)");
  }
  return response;
}

Result<S3Client::Response> S3Client::Send(Request& request) {
  thread_local std::minstd_rand random(std::random_device{}());
  const std::string what = request.method + " " + (request.key.empty() ? "/" : request.key);
  std::string last_error;
  const uint32_t attempts = std::max<uint32_t>(1, options_.attempts);
  for (uint32_t attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      auto backoff = std::min<std::chrono::milliseconds>(
          kLastBackoff, kFirstBackoff * (1 << std::min<uint32_t>(attempt - 1, 10)));
      std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
      std::this_thread::sleep_for(std::chrono::milliseconds(jitter(random)));
    }
    CURL* curl = TakeHandle();
    if (!curl) return Status::ResourceExhausted("s3: cannot create a connection handle");
    Result<Response> response = Attempt(request, curl, static_cast<int>(attempt));
    ReturnHandle(curl);
    if (!response.ok()) {
      if (response.status().code() != StatusCode::kUnavailable) {
        return Status::IoError("s3: " + what + ": " + response.status().message());
      }
      last_error = response.status().message();
      continue;
    }
    const long status = response->status;
    if (status >= 200 && status < 300) return response;
    const s3_xml::ErrorBody error = s3_xml::ParseError(response->body);
    const std::string detail = std::to_string(status) +
                               (error.code.empty() ? "" : " " + error.code) +
                               (error.message.empty() ? "" : ": " + error.message);
    const bool transient = status == 500 || status == 502 || status == 503 || status == 504 ||
                           status == 408 || status == 429 || (status == 409 && request.conditional);
    if (transient) {
      last_error = detail;
      continue;
    }
    const std::string message = "s3: " + what + ": " + detail;
    if (status == 404 && error.code == "NoSuchBucket") {
      // Not a missing object, and no lost race: the store is not there.
      return Status::Unavailable("s3: bucket '" + options_.bucket + "' does not exist at " +
                                 options_.endpoint);
    }
    if (status == 404) return Status::NotFound(message);
    if (status == 412) return Status::FailedPrecondition(message);
    if (status == 401 || status == 403) return Status::PermissionDenied(message);
    return Status::InvalidArgument(message);
  }
  return Status::Unavailable("s3 store at " + options_.endpoint + " unavailable: " + what +
                             " failed " + std::to_string(attempts) + " times; last: " + last_error);
}

Result<std::string> S3Client::Put(std::string_view key, std::string_view body,
                                  const S3Condition& condition) {
  const bool conditional = condition.if_none_match || !condition.if_match.empty();
  if (body.size() > options_.part_bytes && !conditional) return PutMultipart(key, body);
  Request request{"PUT", std::string(key), "", body, {}, conditional};
  if (condition.if_none_match) request.headers.push_back("If-None-Match: *");
  if (!condition.if_match.empty()) {
    request.headers.push_back(
        "If-Match: " + (quote_if_match_ ? "\"" + condition.if_match + "\"" : condition.if_match));
  }
  CKPT_ASSIGN_OR_RETURN(Response response, Send(request));
  return response.etag;
}

Result<std::string> S3Client::PutMultipart(std::string_view key, std::string_view body) {
  Request begin{"POST", std::string(key), "uploads=", {}, {}, false};
  CKPT_ASSIGN_OR_RETURN(Response begun, Send(begin));
  CKPT_ASSIGN_OR_RETURN(const std::string upload_id, s3_xml::ParseUploadId(begun.body));
  const std::string id_query = "uploadId=" + Encode(upload_id, false);
  auto result = [&]() -> Result<std::string> {
    std::vector<std::string> etags;
    for (uint64_t offset = 0; offset < body.size(); offset += options_.part_bytes) {
      Request part{"PUT",
                   std::string(key),
                   "partNumber=" + std::to_string(etags.size() + 1) + "&" + id_query,
                   body.substr(offset, options_.part_bytes),
                   {},
                   false};
      CKPT_ASSIGN_OR_RETURN(Response put, Send(part));
      etags.push_back(put.etag);
    }
    const std::string xml = s3_xml::CompleteMultipartBody(etags);
    Request complete{"POST", std::string(key), id_query, xml, {}, false};
    auto completed = Send(complete);
    if (completed.status().code() == StatusCode::kNotFound) {
      // A retry after an answer lost on the way: the first completion made the object, and the
      // upload is gone. The object of this size is ours.
      CKPT_ASSIGN_OR_RETURN(const uint64_t size, Size(key));
      if (size == body.size()) return std::string();
      return completed.status();
    }
    CKPT_ASSIGN_OR_RETURN(Response done, std::move(completed));
    // A completion can fail after its 200 began: the error is in the body.
    const s3_xml::ErrorBody error = s3_xml::ParseError(done.body);
    if (!error.code.empty()) {
      return Status::Unavailable("s3: completing the upload of " + std::string(key) + ": " +
                                 error.code);
    }
    return s3_xml::ParseCompletedEtag(done.body);
  }();
  if (!result.ok()) {
    Request abort{"DELETE", std::string(key), id_query, {}, {}, false};
    (void)Send(abort);
  }
  return result;
}

Result<S3Object> S3Client::Get(std::string_view key, uint64_t offset, uint64_t length) {
  Request request{"GET", std::string(key), "", {}, {}, false};
  if (offset > 0 || length > 0) {
    request.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" +
                              (length > 0 ? std::to_string(offset + length - 1) : ""));
  }
  CKPT_ASSIGN_OR_RETURN(Response response, Send(request));
  return S3Object{std::move(response.body), std::move(response.etag), response.last_modified,
                  response.date};
}

Result<uint64_t> S3Client::Size(std::string_view key) {
  Request request{"HEAD", std::string(key), "", {}, {}, false};
  CKPT_ASSIGN_OR_RETURN(Response response, Send(request));
  return response.content_length.value_or(0);
}

Status S3Client::Delete(std::string_view key) {
  Request request{"DELETE", std::string(key), "", {}, {}, false};
  auto response = Send(request);
  if (response.status().code() == StatusCode::kNotFound) return Status::Ok();
  return response.status();
}

Status S3Client::DeleteMany(const std::vector<std::string>& keys) {
  Status first;
  for (size_t begin = 0; begin < keys.size(); begin += kDeleteBatch) {
    std::vector<std::string> full;
    for (size_t i = begin; i < std::min(keys.size(), begin + kDeleteBatch); ++i) {
      full.push_back(FullKey(keys[i]));
    }
    const std::string xml = s3_xml::DeleteBody(full);
    Request request{"POST", "", "delete=", xml, {"Content-MD5: " + Base64Md5(xml)}, false};
    Status s = [&]() -> Status {
      CKPT_ASSIGN_OR_RETURN(Response response, Send(request));
      CKPT_ASSIGN_OR_RETURN(auto errors, s3_xml::ParseDeleteErrors(response.body));
      if (errors.empty()) return Status::Ok();
      return Status::IoError("s3: removing " + errors.front().first + ": " + errors.front().second +
                             " (" + std::to_string(errors.size()) + " objects not removed)");
    }();
    if (first.ok()) first = std::move(s);
  }
  return first;
}

Result<s3_xml::ListPage> S3Client::ListPage(std::string_view prefix, std::string_view start_after,
                                            uint32_t max_keys, std::string_view continuation,
                                            std::string_view delimiter) {
  // Parameters in the order SigV4 signs them (sorted by name).
  std::string query;
  if (!continuation.empty()) query += "continuation-token=" + Encode(continuation, false) + "&";
  if (!delimiter.empty()) query += "delimiter=" + Encode(delimiter, false) + "&";
  query += "list-type=2&";
  if (max_keys > 0) query += "max-keys=" + std::to_string(max_keys) + "&";
  query += "prefix=" + Encode(FullKey(prefix), false);
  if (!start_after.empty()) query += "&start-after=" + Encode(FullKey(start_after), false);
  Request request{"GET", "", query, {}, {}, false};
  CKPT_ASSIGN_OR_RETURN(Response response, Send(request));
  CKPT_ASSIGN_OR_RETURN(s3_xml::ListPage page, s3_xml::ParseListPage(response.body));
  const size_t strip = FullKey("").size();
  for (s3_xml::ListedObject& object : page.objects) object.key.erase(0, strip);
  for (std::string& common : page.common_prefixes) common.erase(0, strip);
  return page;
}

Result<std::vector<s3_xml::ListedObject>> S3Client::ListAll(std::string_view prefix) {
  std::vector<s3_xml::ListedObject> all;
  std::string token;
  do {
    CKPT_ASSIGN_OR_RETURN(s3_xml::ListPage page, ListPage(prefix, "", 0, token));
    for (auto& object : page.objects) all.push_back(std::move(object));
    token = page.truncated ? page.next_continuation_token : "";
  } while (!token.empty());
  return all;
}

Status WaitForAll(std::vector<std::future<Status>>& jobs) {
  Status first;
  for (auto& job : jobs) {
    Status s = job.get();
    if (first.ok()) first = std::move(s);
  }
  return first;
}

std::future<Status> S3Client::Async(std::function<Status()> job) {
  std::packaged_task<Status()> task(std::move(job));
  std::future<Status> done = task.get_future();
  {
    std::lock_guard lock(jobs_mu_);
    jobs_.push_back(std::move(task));
    if (workers_.size() < std::max<uint32_t>(1, options_.parallelism) && jobs_.size() > 0) {
      workers_.emplace_back([this] { Work(); });
    }
  }
  jobs_cv_.notify_one();
  return done;
}

void S3Client::Work() {
  std::unique_lock lock(jobs_mu_);
  while (true) {
    jobs_cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    std::packaged_task<Status()> task = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

Status S3Client::Probe() {
  std::random_device device;
  const std::string key = ".ckptd-probe/" + std::to_string(device()) + std::to_string(device());
  auto fail = [&](const std::string& what) {
    (void)Delete(key);
    return Status::FailedPrecondition(
        "s3: the store at " + options_.endpoint + " (bucket '" + options_.bucket + "') " + what +
        "; ckptd commits with conditional writes and cannot run on it (docs/deployment.md, S3)");
  };
  Request bucket{"HEAD", "", "", {}, {}, false};
  auto found = Send(bucket);
  if (found.status().code() == StatusCode::kNotFound) {
    return Status::FailedPrecondition("s3: bucket '" + options_.bucket + "' does not exist at " +
                                      options_.endpoint + "; create it first");
  }
  if (!found.ok()) return found.status().WithContext("s3: probing the bucket");
  S3Condition create;
  create.if_none_match = true;
  auto first = Put(key, "probe", create);
  if (!first.ok()) return first.status().WithContext("s3: probing the bucket");
  auto again = Put(key, "probe again", create);
  if (again.ok()) return fail("replaced an object under If-None-Match: *");
  if (again.status().code() != StatusCode::kFailedPrecondition) return again.status();
  S3Condition wrong;
  wrong.if_match = "0123456789abcdef0123456789abcdef";
  auto stale = Put(key, "stale", wrong);
  if (stale.ok()) return fail("replaced an object under If-Match with another ETag");
  if (stale.status().code() != StatusCode::kFailedPrecondition) return stale.status();
  S3Condition match;
  match.if_match = *first;
  quote_if_match_ = true;
  auto quoted = Put(key, "swap", match);
  if (!quoted.ok()) {
    if (quoted.status().code() != StatusCode::kFailedPrecondition) return quoted.status();
    quote_if_match_ = false;
    auto bare = Put(key, "swap", match);
    if (!bare.ok()) {
      quote_if_match_ = true;
      if (bare.status().code() != StatusCode::kFailedPrecondition) return bare.status();
      return fail("refused If-Match with the object's current ETag");
    }
  }
  return Delete(key);
}

}  // namespace ckpt
