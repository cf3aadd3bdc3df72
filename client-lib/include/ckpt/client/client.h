// ckpt::Client: a C++ client for the ckptd HTTP API (docs/api.md).
//
// Large bodies are streamed: PushFile reads the file in pieces while sending, PullToFile writes
// pieces as they arrive and verifies the SHA-256 the server announces (X-Ckpt-Sha256) before
// renaming the finished file into place, so a failed or corrupted pull never leaves a file that
// looks complete. Errors from the server keep their meaning: 400 -> InvalidArgument,
// 404 -> NotFound, 409 -> FailedPrecondition, 413 -> ResourceExhausted, network -> Unavailable.
//
// Thread-compatible: one Client per thread (each call opens its own connection).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

struct ClientOptions {
  // Base URL of the daemon, "http://HOST:PORT". Several daemons of one deployment (on one Ceph
  // pool) may be listed, separated by commas, all with the same scheme: each request goes to the
  // first that accepts a connection (list the nearest first). Default: http://127.0.0.1:8420.
  std::string server = "http://127.0.0.1:8420";
  // Called during transfers with bytes done and the total (0 if unknown).
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Size of the pieces bodies are streamed in. Default: 1 MiB.
  size_t io_buffer_bytes = 1 << 20;
  // Bearer token sent with every request (daemons with [[auth.tokens]]). Default: none.
  std::string token;
  // https:// servers: the PEM file of CAs the server's certificate must chain to (default: the
  // system's trust store), and an optional client certificate and key (daemons that require
  // one, server.tls_client_ca_file). The certificate must name the URL's host.
  std::string ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

struct TlsContext;     // client.cc: the TLS settings of an https:// client
struct ShardCoding;    // encoded_shard_push.h: what coding one shard on the client came to
struct ShardInput;     // encoded_shard_push.h: one shard's tensors and plain body
class CheckpointView;  // ckpt/codec/edge_encoder.h

// One daemon a client may talk to.
struct ServerEndpoint {
  std::string host;
  std::string port;
};

// What a push carries besides the body (query parameters; docs/api.md).
struct PushMetadata {
  std::map<std::string, double> metrics;      // metric.<name>=<number>, e.g. {"loss", 1.23}
  std::map<std::string, std::string> labels;  // label.<name>=<text>
  std::vector<std::string> tags;              // tag=<name>
};

// How PushFileEncoded codes a checkpoint on the client (docs/api.md, "plan").
struct EncodedPushOptions {
  // Where the client keeps, per model, the restored body of its last encoded push or pull of
  // it (<dir>/<model>.safetensors, with <model>.json naming its version and SHA-256): the
  // reference its next push's deltas are coded against. Empty: nothing is kept, and a plan
  // with deltas pulls its base first.
  std::string reference_dir;
  int threads = 0;  // encoder threads; 0: the machine's cores
  // New plans asked for when the model moved on while this push was coded (another writer
  // pushed a version: 409 STALE_PLAN), each pulling the new base and coding again.
  int replans = 3;
};

// How PushFileSharded sends one file as the shards of a sharded version (docs/api.md,
// "Sharded versions"), each over a connection of its own.
struct ShardedPushOptions {
  uint32_t shards = 4;  // 1 to 65536: large tensors are cut by rows, small ones go whole
  // Attempts after the first, per shard, for errors that may pass: the network, 503, 5xx, a
  // model busy (409 ABORTED). Each re-sends the whole shard (the server replaces an earlier
  // attempt of it).
  int retries = 3;
  std::chrono::milliseconds backoff{500};  // before a shard's first retry; doubled each time
  // Set: each shard is coded here, as PushFileEncoded codes a file, against this machine's
  // reconstruction of the same shard of the model's latest version (kept in
  // encoded->reference_dir as <model>.rank<i>-of-<shards>, or pulled as that rank's part). A
  // shard that cannot be coded here (no plan: another version's upload is in progress; no part
  // of the base holds its slices) is sent for the server to code.
  std::optional<EncodedPushOptions> encoded;
};

struct PushResult {
  std::string model;
  uint64_t version = 0;
  std::string kind;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::string sha256;         // of the body a restore sends
  std::string pushed_sha256;  // of the body pushed (differs from sha256 when lossy)
  bool lossy = false;         // some tensor was quantized: restores are within the bound
  std::string created_at;     // the server's answer, as `ls` shows it
  uint32_t tensor_count = 0;
  std::vector<std::string> tags;
  std::map<std::string, double> metrics;
  std::map<std::string, std::string> labels;
  uint64_t sent_bytes = 0;  // body bytes sent (the file's, unless encoded)
  bool encoded = false;     // coded by the client (PushFileEncoded)
  // PushFileEncoded: how it came by the reference of its deltas: "" (none needed, or the push
  // fell back to the server's coding), "held" (kept from the last push), "pulled" (the base
  // version was pulled first); and, in words, anything about it worth saying: that the one held
  // did not restore the base, that the version pushed could not be kept as the next reference,
  // or why the server coded the push.
  std::string reference;
  std::string reference_note;
};

// How PullEncoded fetches a version (docs/api.md, "Encoded pull").
struct EncodedPullOptions {
  // As EncodedPushOptions::reference_dir: when the restored body of an earlier version of the
  // model is held there, only what turns it into the version pulled is sent (the chains' deltas
  // after it); the version pulled becomes the one held unless it is older (or the one held
  // proved damaged). Empty: nothing is kept, and each pull receives the chains from their
  // keyframes.
  std::string reference_dir;
  int threads = 0;  // decoder threads; 0: the machine's cores
};

struct PullResult {
  uint64_t version = 0;
  uint64_t bytes = 0;  // of the whole body, resumed bytes included
  std::string sha256;
  // The server announced the body's SHA-256 and it matched (a part of a version, selected by
  // PullOptions, has none to check).
  bool verified = false;
  // Bytes taken from an earlier, interrupted pull's .partial file (PullToFile), 0 if none.
  uint64_t resumed_bytes = 0;
  // PullEncoded: the bytes received (the stored records), and the version whose
  // reconstruction they were sent against (0: none, the chains from their keyframes).
  uint64_t received_bytes = 0;
  uint64_t since_version = 0;
};

// Which part of a version to pull (docs/api.md, "restore"); empty: the whole version.
struct PullOptions {
  std::vector<std::string> tensors;  // name patterns ('*', '?'); empty: every tensor
  // The resharded view for rank `rank` of `ranks` (ranks 0: not resharded).
  uint32_t rank = 0;
  uint32_t ranks = 0;
  // A file of the Hugging Face view (".../versions/{v}/hf/<file>?max_shard_bytes=N") instead.
  std::string hf_file;
  uint64_t hf_max_file_bytes = 0;
};

struct ModelSummary {
  std::string name;
  std::optional<uint64_t> latest_version;
  uint64_t version_count = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
};

struct VersionSummary {
  uint64_t version = 0;
  std::string kind;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::string created_at;
  std::string sha256;
  bool lossy = false;            // some tensor was quantized: restores are within the bound
  uint32_t dropped_tensors = 0;  // tensors retention's tensor rules dropped from it
  std::string pushed_sha256;     // of the body pushed (sha256: of the body a restore sends)
  uint32_t tensor_count = 0;
  std::vector<std::string> tags;
  std::map<std::string, double> metrics;
  std::map<std::string, std::string> labels;
};

class Client {
 public:
  // Fails with InvalidArgument if the server URL is not http://HOST:PORT or https://HOST:PORT,
  // or a TLS file cannot be loaded.
  static Result<Client> Create(ClientOptions options);

  Result<PushResult> PushFile(std::string_view model, uint64_t version, const std::string& path,
                              const PushMetadata& metadata = {});
  Result<PushResult> PushBuffer(std::string_view model, uint64_t version, std::string_view body,
                                const PushMetadata& metadata = {});
  // Pushes a file as `sharded.shards` shards sent at once, each over its own connection and
  // retried by itself; the version appears when the last one is stored, exactly as a whole push
  // of the file would (its tensors, as global tensors; metadata from the file and `metadata`).
  // options.progress sees the bytes of every shard together. A shard that fails every attempt
  // fails the push; the shards already stored stay in the upload, so calling this again sends
  // them again and completes it (or the upload expires on the server).
  Result<PushResult> PushFileSharded(std::string_view model, uint64_t version,
                                     const std::string& path, const ShardedPushOptions& sharded,
                                     const PushMetadata& metadata = {});

  // Codes the file on this machine as the server would (its plan: POST .../plan), sending only
  // the stored bytes, and keeps the restored body as the reference of the next push. Deltas
  // need the restored body of the model's latest version: the one kept in
  // options.reference_dir when it is that version, else it is pulled first (and kept). When the
  // base can be had neither way (its version was deleted), the file is pushed for the server to
  // code, and PushResult::reference says so. A kept reference the server finds does not
  // restore the base (REFERENCE_DRIFTED: a damaged file) is forgotten and the base pulled,
  // once. The plan may go stale while coding (another push committed): planned again up to
  // encoded.replans times, then FailedPrecondition (StalePlan).
  Result<PushResult> PushFileEncoded(std::string_view model, uint64_t version,
                                     const std::string& path, const EncodedPushOptions& encoded,
                                     const PushMetadata& metadata = {});

  // `version` is a decimal number, "latest" or "tag:<name>". `path` "-" writes to stdout.
  // A whole version is written to `path`.partial and renamed into place once verified. A pull
  // the network cut off keeps `path`.partial (and the body's ETag beside it, `path`.partial.etag)
  // and fails with Unavailable; the next pull to `path` resumes it with Range + If-Range, or
  // starts over if the version's body is no longer the same ("latest" moved on). Any other
  // failure removes both.
  Result<PullResult> PullToFile(std::string_view model, std::string_view version,
                                const std::string& path, const PullOptions& part = {});
  Result<std::string> PullToBuffer(std::string_view model, std::string_view version);
  // Pulls the stored chunk records of a version and decodes them here into `path` (renamed into
  // place once its SHA-256 matches the version's): the wire carries the stored bytes, not the
  // restored ones. See EncodedPullOptions for what a held reconstruction saves. A `part`
  // (tensors, a rank's view) receives the records of the chunks that hold it and writes the
  // body a pull of that part writes (each chunk checked by its record's checksum; no SHA-256 is
  // announced for a part); it neither uses nor replaces the reconstruction held.
  Result<PullResult> PullEncoded(std::string_view model, std::string_view version,
                                 const std::string& path, const EncodedPullOptions& encoded,
                                 const PullOptions& part = {});
  // The Hugging Face view of a version into `dir` (created if needed):
  // model.safetensors.index.json and the files it lists, each at most `max_file_bytes`.
  // Returns the files written, the index first.
  Result<std::vector<std::string>> PullHfDir(std::string_view model, std::string_view version,
                                             const std::string& dir, uint64_t max_file_bytes);

  // The number of the version `version` names: a decimal number (checked to exist), "latest" or
  // "tag:<name>". NotFound if there is none.
  Result<uint64_t> ResolveVersion(std::string_view model, std::string_view version);

  Result<std::vector<ModelSummary>> ListModels();
  Result<ModelSummary> GetModel(std::string_view model);
  Result<std::vector<VersionSummary>> ListVersions(std::string_view model);
  // GET .../versions/{version}?detail=1 as JSON text: the version with each tensor's codec,
  // bound and stored bytes.
  Result<std::string> VersionDetail(std::string_view model, uint64_t version);
  Status DeleteVersion(std::string_view model, uint64_t version);
  Status DeleteModel(std::string_view model);
  // The policy as JSON text.
  Result<std::string> GetPolicy(std::string_view model);
  Result<std::string> SetPolicy(std::string_view model, std::string_view policy_json);

  // Tags (a tagged version is pinned; a tag moves if another version holds it).
  Status SetTag(std::string_view model, uint64_t version, std::string_view tag);
  Status RemoveTag(std::string_view model, uint64_t version, std::string_view tag);

  // The retention policy as JSON text; SetRetention replaces it.
  Result<std::string> GetRetention(std::string_view model);
  Result<std::string> SetRetention(std::string_view model, std::string_view policy_json);
  // Runs retention now (or, with `dry_run`, reports what it would delete); `policy_json`, if
  // not empty, is evaluated instead of the stored policy. Answers the report as JSON text.
  Result<std::string> ApplyRetention(std::string_view model, bool dry_run,
                                     std::string_view policy_json = {});

  // Administrative calls, answered as JSON text: retention + garbage collection of every model,
  // a scrub of everything stored, an online backup into `dir` (a path on the server).
  Result<std::string> CollectGarbage();
  Result<std::string> Scrub();
  Result<std::string> Backup(std::string_view dir);

  // The daemons of ClientOptions::server, in order.
  const std::vector<ServerEndpoint>& endpoints() const { return endpoints_; }

 private:
  // Sends shard `index` of `count` of `version` coded here, planned again on StalePlan up to
  // encoded.replans times; `query` is the shard PUT's and `options` this shard's (its
  // progress).
  Status PushShardEncoded(std::string_view model, uint64_t version, uint32_t index, uint32_t count,
                          const ShardInput& shard, const EncodedPushOptions& encoded,
                          const std::string& query, const ClientOptions& options,
                          ShardCoding* coding);
  // One plan of it, coded and sent; against the part held only when `use_held` (else pulled).
  Status PushShardEncodedOnce(std::string_view model, uint64_t version, uint32_t index,
                              uint32_t count, const ShardInput& shard,
                              const EncodedPushOptions& encoded, const std::string& query,
                              const ClientOptions& options, bool use_held, ShardCoding* coding);
  // PullEncoded with the model's reference already claimed (ReferenceLock) by the caller.
  Result<PullResult> PullEncodedClaimed(std::string_view model, std::string_view version,
                                        const std::string& path, const EncodedPullOptions& encoded);
  // One plan, coded and sent: StalePlan when the model moved on meanwhile.
  Result<PushResult> PushEncodedOnce(std::string_view model, uint64_t version,
                                     const std::string& path, const CheckpointView& checkpoint,
                                     const EncodedPushOptions& encoded,
                                     const PushMetadata& metadata);

  Client(ClientOptions options, std::vector<ServerEndpoint> endpoints,
         std::shared_ptr<TlsContext> tls)
      : options_(std::move(options)), endpoints_(std::move(endpoints)), tls_(std::move(tls)) {}

  ClientOptions options_;
  std::vector<ServerEndpoint> endpoints_;
  std::shared_ptr<TlsContext> tls_;  // null: plain HTTP
};

}  // namespace ckpt
