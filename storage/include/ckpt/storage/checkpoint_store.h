// CheckpointStore: durable, versioned storage of safetensors checkpoints.
//
// A model is a named sequence of versions (training steps, strictly increasing). Each pushed
// checkpoint is cut into tensors and chunks; every chunk is stored as a keyframe or as a delta
// against the previous version's reconstruction of the same chunk (see docs/design.md). Any
// stored version restores to exactly the bytes that were pushed (lossless mode).
//
// The data lives in the local RocksDB (StoreOptions::data_dir), or with StoreOptions::cluster in
// a Ceph RADOS pool that several daemons share (ClusterOptions, docs/deployment.md).
//
// Thread safety: a CheckpointStore is safe for concurrent use by any number of threads.
// Pushes to one model are serialized (while one is in progress, a second BeginPush, delete or
// policy change of that model fails fast with Aborted; the HTTP layer waits and retries pushes);
// different models proceed in parallel; readers never observe a partially
// written version. PushSession and RestoreStream objects are thread-compatible: one thread at
// a time, and they must be destroyed before the store that created them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/model_name.h"
#include "ckpt/base/status.h"
#include "ckpt/base/tensor_slices.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/storage/codec_policy.h"
#include "ckpt/storage/retention.h"

namespace ckpt {

// Scale-out on Ceph (docs/deployment.md): several daemons share one RADOS pool. Chunk records
// and every metadata record live in the pool; the local data directory holds only a cache of the
// metadata that any daemon rebuilds from the cluster. Each model is written through one daemon
// at a time, the holder of its lease; the others serve its restores and redirect its writes.
struct ClusterOptions {
  std::string conf_file;                     // ceph.conf of the cluster (monitors, keyring)
  std::string client_name = "client.admin";  // the cephx user
  std::string pool = "ckptd";
  std::string object_namespace = "ckptd";  // RADOS namespace within the pool
  // How long a model's write lease lasts without renewal (renewed every third of it): the time
  // another daemon waits before taking over the models of a daemon that died.
  std::chrono::milliseconds lease{10000};
  // This daemon's base URL as clients reach it ("http://10.0.0.5:7070"): where other daemons
  // redirect writes of the models it owns.
  std::string advertise_url;
};

// Scale-out on an S3-compatible object store (docs/deployment.md, "S3"): chunk records and every
// metadata record live in a bucket that several daemons share, as with ClusterOptions; each model
// is written through one daemon at a time. The store must honour conditional PUTs
// (If-None-Match: *, If-Match); the daemon checks at start and refuses a store that does not.
struct S3Options {
  std::string endpoint;  // "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:7480"
  std::string bucket;    // must exist
  std::string prefix;    // every key of the store starts with it ("" or "team-a/ckptd")
  std::string region = "us-east-1";
  std::string access_key;  // never logged
  std::string secret_key;  // never logged
  // Addressing: "https://endpoint/bucket/key" (path style, what RGW and MinIO serve by default)
  // or "https://bucket.endpoint/key" (virtual-hosted, what AWS prefers).
  bool virtual_hosted = false;
  std::string ca_file;  // PEM bundle for HTTPS ("" : the system's)
  // Requests in flight at once (chunk writes and reads, removals).
  uint32_t parallelism = 16;
  // Chunk records are written packed, several to an object of up to this size, and read back
  // with Range requests: fewer requests (each is billed and rate limited). 0: an object per
  // record. Both layouts are read.
  uint64_t pack_bytes = 4ull << 20;
  // Objects larger than this are sent as multipart uploads of parts this size.
  uint64_t part_bytes = 32ull << 20;
  // Attempts per request before it fails (503 SlowDown, 500, timeouts, resets are retried with
  // jittered exponential back-off from 50 ms up to 5 s).
  uint32_t attempts = 8;
  // A request that has moved no byte for this long is abandoned (and retried).
  std::chrono::milliseconds request_timeout{30000};
  // As in ClusterOptions: the write lease of a model, and this daemon's URL for redirects.
  std::chrono::milliseconds lease{10000};
  std::string advertise_url;
};

struct StoreOptions {
  // Directory holding the RocksDB database; created if missing. Default: none (required).
  std::string data_dir;

  // Whether Open may create a new, empty store. Tools that work on an existing store (offline
  // scrub, gc and backup) turn it off, so that a mistyped data_dir fails with NotFound naming
  // it instead of checking, and reporting on, an empty store made there. Default: true.
  bool create_if_missing = true;

  // Tensors larger than this are cut into chunks of this many bytes (rounded down to whole
  // elements). Bounds the memory a push or restore needs per tensor and the size of any single
  // RocksDB value. Changing it affects new versions only; deltas need equal chunk sizes, so the
  // first push after a change stores keyframes. Default: 4 MiB.
  uint64_t chunk_bytes = 4 << 20;

  // Memory budget for the in-memory copy of each model's latest reconstruction (the reference
  // the next delta is taken against). Misses are decoded from the stored chain, so this trades
  // memory for push speed only. Default: 128 MiB.
  uint64_t reference_cache_bytes = 128 << 20;
  // Memory for the chunk records the store codes for followers: an encoded pull since a version
  // whose chains do not run to the one pulled (a rearranged latest, a new keyframe) is sent,
  // per chunk, a delta from the follower's version, coded and kept here for the followers that
  // ask the same after it. Also what one such pull may code beyond the records it finds here
  // (past it, chunks are sent as their chains). 0: none are coded. Default: 64 MiB.
  uint64_t since_delta_cache_bytes = 64 << 20;

  // Free space on the data directory's volume that pushes leave alone: a push whose size
  // (Content-Length) would cut into it is refused before its body is read, and one without a
  // known size as soon as the volume reaches it, with ResourceExhausted / NoSpace (HTTP 507).
  // Deletes, retention, garbage collection, tags, policies and reads keep working inside it,
  // so that space can be freed through the API. 0: no reserve. Default: 256 MiB.
  uint64_t min_free_bytes = 256ull << 20;

  // Where the storage engine's warnings and errors go, one line each (RocksDB keeps no log file
  // in data_dir: a full volume would break it first). Null: standard error.
  std::function<void(std::string_view)> engine_log;

  // Sync the write-ahead log before a push or delete is acknowledged. Turning it off risks
  // losing acknowledged versions on power failure or kernel crash (not on a process crash).
  // Default: true.
  bool sync_commits = true;

  // zstd level of the lossless codec. Default: 1.
  int zstd_level = 1;

  // Threads encoding and storing the chunks of one push, next to the connection's thread
  // (which receives, parses and hashes the body). Chunks are encoded concurrently and stored
  // in any order; what is stored does not depend on the number. A push then holds at most
  // (threads + 1) * chunk_bytes of body in memory. At least 1. Default: 2.
  size_t push_encoder_threads = 2;

  // Largest number of tensors in one pushed checkpoint; more is ResourceExhausted before any
  // tensor data is read. Default: 65536.
  uint32_t max_tensors_per_checkpoint = 65536;

  // How long a sharded upload (BeginShard) may stay uncommitted, counted from its last activity
  // (a shard begun or stored; never while one is being received): ExpireUploads then removes
  // it with its data. Default: 1 hour.
  std::chrono::seconds upload_expiry{3600};

  // Largest number of shards one version may be pushed as (BeginShard's shard_count).
  // Default: 1024.
  uint32_t max_shards_per_version = 1024;

  // Largest number of models; creating one more (a first push, or setting a policy) is
  // FailedPrecondition. Checked when a model is created, so concurrent first pushes of new
  // models can exceed it by their number. 0: no limit. Default: 100000.
  uint64_t max_models = 100000;

  // Policy of models that have none set. Default: lossless, keyframe_every 16.
  CodecPolicy default_policy;

  // Retention of models that have none set. Default: keep everything.
  RetentionPolicy default_retention;

  // When set, the store keeps its data in a RADOS pool shared with other daemons (see
  // ClusterOptions) instead of in data_dir alone. Default: unset (single node).
  std::optional<ClusterOptions> cluster;
  // When set, the store keeps its data in an S3 bucket shared with other daemons (S3Options).
  // Exclusive with `cluster`. Default: unset.
  std::optional<S3Options> s3;
};

// How a garbage collection treats one model (CheckpointStore::CollectGarbage).
struct GcOptions {
  // Kept versions whose delta chains run through deleted versions are re-encoded (rebased) so
  // the deleted data can go, once that data exceeds this fraction of the bytes the kept
  // versions hold themselves. 0 rebases whenever anything could be freed; a negative value
  // never rebases (only data no chain needs is removed).
  double rebase_min_dead_fraction = 0;
  // How the freed bytes leave the disk. Deleted data is removed from RocksDB at once, but its
  // bytes stay in table and blob files until a compaction rewrites them:
  //   kNone:   leave it to RocksDB's background compactions (cheapest; for frequent passes);
  //   kTables: compact the model's chunk key range, so blob files holding only deleted data are
  //            dropped (cheap: the tables hold small payloads and blob references);
  //   kFull:   also force blob garbage collection on that range: live blobs are moved out of
  //            blob files that also hold deleted data (rewrites the model's live payloads).
  // Compaction runs when this pass or an earlier one (since the last compaction of the model)
  // freed anything.
  enum class Compaction { kNone, kTables, kFull };
  Compaction compaction = Compaction::kFull;
  // Rebase only the kept versions whose chains run through this stored push (the seq of a
  // deleted latest version), leaving other deleted data to a later pass. Default: none (every
  // chain through deleted data, per rebase_min_dead_fraction).
  std::optional<uint64_t> rebase_only_through;
};

// What a garbage collection did for one model.
struct GcReport {
  std::string model;
  uint64_t manifests_removed = 0;        // stored pushes whose data was removed
  uint64_t bytes_freed = 0;              // stored bytes they held
  uint64_t versions_rebased = 0;         // kept versions re-encoded so that deleted data could go
  uint64_t bytes_rewritten = 0;          // stored bytes the rebases wrote
  uint64_t bytes_retained = 0;           // deleted versions' bytes kept because kept versions'
                                         // (lossy) chains still need them
  uint64_t dropped_tensors_removed = 0;  // tensors dropped from kept versions (retention's
                                         // tensor rules) whose chunks were removed
  uint64_t orphan_chunks_removed = 0;    // RADOS, S3: chunk objects of interrupted pushes removed
  bool compacted = false;
  // Bytes that earlier passes removed (background retention, rearrangement, DELETE) and that
  // this pass's compaction took off the volume, beside its own bytes_freed: what a user sees
  // the data directory shrink by.
  uint64_t bytes_reclaimed = 0;
};

// Monitoring figures of an open store: counters since it opened and the storage engine's sizes.
struct StoreStats {
  uint64_t pushes = 0;                      // committed pushes
  uint64_t push_raw_bytes = 0;              // their bodies' bytes
  uint64_t push_stored_bytes = 0;           // what they added to the store
  double encode_seconds = 0;                // codec time of pushes (encoding chunks)
  uint64_t versions_deleted = 0;            // by DELETE
  uint64_t retention_versions_deleted = 0;  // by retention passes
  uint64_t retention_tensors_dropped = 0;   // from kept versions, by retention's tensor rules
  uint64_t gc_bytes_freed = 0;              // stored bytes garbage collection removed
  uint64_t gc_versions_rebased = 0;
  uint64_t rearrangements = 0;  // RearrangeLatest passes that committed
  uint64_t restores = 0;        // restore streams opened (scrubs excluded)
  // Stored chunk payloads those restores decoded: a chunk replays its delta chain from the
  // keyframe or from the nearest link in the cache, so this over restores' chunks is the
  // average chain replayed.
  uint64_t restore_links_decoded = 0;
  // Chunk records encoded pulls had coded for them (a delta from the client's version, or an
  // exact keyframe in place of a chain), each a decode and an encode of the chunk here; records
  // found coded already are not counted.
  uint64_t pull_chunks_coded = 0;
  // RocksDB: table and blob files, and the bytes compactions still have to rewrite.
  uint64_t sst_bytes = 0;
  uint64_t blob_bytes = 0;
  uint64_t pending_compaction_bytes = 0;
  uint64_t running_compactions = 0;
  // The local backend's data directory, by what its bytes are (apparent file sizes): the chunk
  // records the models store (their stored_bytes summed), garbage awaiting collection (records
  // removed since their key range was last compacted, and the dead bytes the engine counted in
  // blob files that still hold live ones), and the rest, `metadata_bytes`: tables' keys and
  // indexes, the write-ahead log, the engine's own files, sharded uploads not yet committed.
  // Small records sit compressed in tables, so stored can exceed the directory's share of
  // them; metadata is then 0.
  bool space_known = false;  // local backend only
  uint64_t data_directory_bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t garbage_bytes = 0;
  uint64_t metadata_bytes = 0;
  // With a cluster (StoreOptions::cluster): this daemon's write leases.
  bool cluster = false;
  uint64_t models_owned = 0;     // leases held now
  uint64_t lease_takeovers = 0;  // leases taken since start (a model's first write here)
  uint64_t leases_lost = 0;      // renewals that found the lease taken (or the cluster away)
  uint64_t commits_fenced = 0;   // commits refused: another daemon had taken the model over
  // With S3 (StoreOptions::s3): requests sent to the bucket (retries included), and the body
  // bytes they sent and received.
  bool s3 = false;
  uint64_t s3_requests = 0;
  uint64_t s3_bytes_sent = 0;
  uint64_t s3_bytes_received = 0;
};

// Whether the store takes writes now, and why not (CheckpointStore::Health).
struct StoreHealthReport {
  enum class State {
    kWritable,  // every write is taken
    // The volume's free space is at the reserve (StoreOptions::min_free_bytes): pushes are
    // refused; deletes, retention, garbage collection, tags and policies work.
    kReserveReached,
    // The storage engine stopped writing after an error it can recover from (the volume ran
    // out of space, a write or sync failed): every write is refused until it resumes, which
    // the store tries by itself (at most a few times a second). Reads work.
    kSuspended,
    // An error that cannot be recovered from: writes are refused until a restart; reads work.
    kReadOnly,
  };
  State state = State::kWritable;
  // Why writes are refused (no server path); empty when kWritable.
  std::string reason;
  uint64_t free_bytes = 0;      // on the data directory's volume (0 if it cannot be read)
  uint64_t reserved_bytes = 0;  // StoreOptions::min_free_bytes
  uint64_t engine_errors = 0;   // storage engine errors seen since open
  uint64_t recoveries = 0;      // times writes resumed after one
};

// "writable", "reserve_reached", "suspended" or "read_only".
std::string_view StoreHealthStateName(StoreHealthReport::State state);

struct VersionInfo {
  std::string model;
  uint64_t version = 0;
  std::string kind;           // "keyframe", "delta" or "mixed" (per-tensor kinds differ)
  uint64_t raw_bytes = 0;     // size of the body a restore sends (the pushed body's, unless
                              // retention dropped tensors)
  uint64_t stored_bytes = 0;  // payload bytes this version added to the store
  int64_t created_at_ms = 0;  // Unix epoch milliseconds of the commit
  std::string sha256;         // SHA-256 (hex) of the body a restore sends
  std::string pushed_sha256;  // SHA-256 (hex) of the pushed body (equal unless lossy)
  bool lossy = false;         // some tensor was quantized: restores are within the bound
  uint32_t tensor_count = 0;
  // Tensors retention's tensor rules dropped: the version restores without them.
  uint32_t dropped_tensors = 0;
  std::map<std::string, double> metrics;      // pushed with the version
  std::map<std::string, std::string> labels;  // pushed with the version
  std::vector<std::string> tags;              // tags naming this version now (sorted)
};

// What a push carries besides the body: metrics (for keep_best), labels and tags. Metrics and
// labels are also read from the body's `__metadata__` entries named `metric.<name>` (a number)
// and `label.<name>`; these fields take precedence over them.
// What a push body is.
enum class PushBodyFormat : uint8_t {
  kSafetensors,  // the checkpoint itself: the store encodes it
  kEncoded,      // an encoded push body (ckpt/codec/encoded_body.h) that follows PlanPush's plan
};

struct PushOptions {
  std::map<std::string, double> metrics;
  std::map<std::string, std::string> labels;
  std::vector<std::string> tags;  // each moves to the new version if another one holds it
  PushBodyFormat body_format = PushBodyFormat::kSafetensors;
  // kEncoded: each payload is decoded against the store's reference and must give the bytes the
  // client says it reconstructed (a client whose reference drifted is refused). false: payloads
  // are checked by their checksums and structure only, and the client's digests are taken.
  bool decode_encoded_payloads = true;
};

// A sharded upload: a version pushed as shard_count shards (BeginShard), visible once every
// shard is stored and the version committed.
struct ShardUploadInfo {
  std::string model;
  uint64_t version = 0;
  uint32_t shard_count = 0;
  std::vector<uint32_t> received;  // shards stored, ascending
  uint64_t received_bytes = 0;     // their bodies' bytes
  int64_t created_at_ms = 0;       // when its first shard began
  int64_t expires_at_ms = 0;       // when ExpireUploads removes it unless a shard comes first
  bool committed = false;          // the version is committed (the upload is gone)
  // Set when every shard is stored but this daemon may not commit the upload (a cluster, where
  // another daemon writes the model): that daemon's advertised URL, where the commit goes.
  std::string commit_through;
};

// What storing one shard did.
struct ShardResult {
  ShardUploadInfo upload;
  // Set when this shard was the last one missing (or the shard was sent again after the
  // version was committed): the committed version.
  std::optional<VersionInfo> version;
  // The shard was sent again after its version was committed, with the same bytes.
  bool sent_again = false;
};

// Which part of a version a restore sends (CheckpointStore::OpenRestore). Empty: the whole
// version, byte for byte as pushed (or assembled from its shards).
struct RestoreSelection {
  // Tensor name patterns ('*' any run of characters, '?' one); a tensor is sent if it matches
  // any. Empty: every tensor.
  std::vector<std::string> tensors;
  // Exact tensor names (with `tensors`, a tensor is sent if either admits it). Empty: no
  // restriction by name.
  std::vector<std::string> names;
  // ranks > 0: the resharded view for `rank` of `ranks`. A tensor pushed as slices along one
  // dimension is split along that dimension into `ranks` consecutive parts (SplitExtent: the
  // first extent % ranks parts one longer); every other tensor is sent whole to every rank.
  // Each part carries its offsets and global shape in the body's kSlicesMetadataKey metadata.
  uint32_t rank = 0;
  uint32_t ranks = 0;
  // One box of one tensor (offsets and extent per dimension), sent as a tensor of that shape.
  std::optional<std::pair<std::string, TensorBox>> box;
  // Bytes [first, last] of the whole body (an HTTP Range): only the chunks that hold them are
  // decoded. Not combined with the fields above; `last` past the end is clipped.
  std::optional<std::pair<uint64_t, uint64_t>> bytes;

  bool whole() const { return tensors.empty() && names.empty() && ranks == 0 && !box && !bytes; }
};

// What rearranging a model's newest versions did (CheckpointStore::RearrangeLatest).
struct RearrangeReport {
  std::string model;
  uint64_t version = 0;            // the latest version; 0 when there was nothing to rearrange
  uint32_t tensors_keyframed = 0;  // its tensors stored as keyframes by this pass
  uint32_t tensors_reversed = 0;   // tensors of the version before now deltas against those
  uint32_t tensors_left = 0;       // left forward deltas: an exact re-encoding would cost more
  uint64_t bytes_before = 0;       // stored bytes of the manifests rewritten, before
  uint64_t bytes_after = 0;        // and after
};

// One retention pass over a model (CheckpointStore::ApplyRetention).
struct RetentionRun {
  bool dry_run = false;                   // decide and report, delete nothing
  std::optional<RetentionPolicy> policy;  // evaluate this instead of the model's policy
  GcOptions gc;                           // how the deleted versions' space is reclaimed
  int64_t now_ms = 0;                     // the clock for keep_within; 0: now
  // How long to wait for a model busy with a push before giving up with Aborted. Blocks the
  // calling thread. Default: 0 (fail fast).
  std::chrono::milliseconds lock_wait{0};
};

struct RetentionReport {
  std::string model;
  RetentionPolicy policy;                    // the policy evaluated
  std::vector<RetentionDecision> decisions;  // every version, ascending
  std::vector<uint64_t> deleted;             // deleted (dry run: would be deleted)
  // Tensors dropped from kept versions by the policy's tensor rules (dry run: would be).
  std::map<uint64_t, std::vector<std::string>> tensors_dropped;
  // Versions whose tensors could not be dropped (they do not restore), with why.
  std::vector<std::string> problems;
  bool dry_run = false;
  GcReport gc;  // what reclaiming did (empty on a dry run)
};

// How one tensor of a version is stored (GET .../versions/{v}?detail=1).
struct TensorDetail {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string kind;           // "keyframe" or "delta"
  std::string codec;          // "lossless" or "lossy"
  bool dropped = false;       // by retention's tensor rules: not restored any more
  std::string quantizer;      // lossy: the quantizer used ("uniform"); empty for lossless
  double bound = 0;           // lossy: the absolute error bound applied (largest over chunks)
  uint32_t chain_length = 0;  // deltas since the keyframe
  uint64_t chunk_bytes = 0;   // the length of its chunks (the last may be shorter)
  // The tiles its chunks follow, a count per dimension; empty when untiled (docs/api.md).
  std::vector<uint32_t> tiles;
  uint64_t raw_bytes = 0;               // the tensor's bytes in the body
  uint64_t stored_bytes = 0;            // its chunk records in this version
  uint64_t exact_elements = 0;          // lossy: elements stored verbatim to keep the bound
  double bits_per_element = 0;          // stored bits / elements
  double entropy_bits_per_element = 0;  // lossy: entropy of the coded symbols per element
};

struct VersionDetail {
  VersionInfo info;
  std::vector<TensorDetail> tensors;  // body order
};

struct ModelInfo {
  std::string name;
  std::optional<uint64_t> latest_version;  // newest live version; nullopt when none
  uint64_t version_count = 0;
  uint64_t raw_bytes = 0;     // sum of raw_bytes over live versions
  uint64_t stored_bytes = 0;  // payload bytes kept for the model (including data that deleted
                              // versions leave behind for later deltas)
  int64_t created_at_ms = 0;
};

// What a scrub of one model found (CheckpointStore::Scrub).
struct ScrubReport {
  std::string model;
  uint64_t versions_checked = 0;  // versions restored in full and checked against their SHA-256
  uint64_t chunks_checked = 0;    // stored chunk records read and checksum-verified
  uint64_t bytes_checked = 0;     // bytes of those records
  std::vector<uint64_t> damaged_versions;  // versions that cannot be restored exactly
  std::vector<std::string> problems;       // one line per problem, naming version/tensor/chunk
  uint64_t orphaned_manifests = 0;         // stored pushes that no version needs
  uint64_t orphaned_chunks = 0;            // chunk records that belong to no stored push
  bool clean() const {
    return damaged_versions.empty() && problems.empty() && orphaned_manifests == 0 &&
           orphaned_chunks == 0;
  }
};

// A model copied into another store (CheckpointStore::CopyModelTo).
struct ModelCopyReport {
  std::string model;
  uint64_t versions = 0;  // versions copied (with their tags and the model's policies)
  uint64_t chunks = 0;    // chunk records copied
  uint64_t bytes = 0;     // the bytes of those records
};

// A backup made by CheckpointStore::Backup.
struct BackupResult {
  std::string dir;         // the backup directory (holds every backup made into it)
  uint32_t backup_id = 0;  // this backup's number in it
  int64_t created_at_ms = 0;
  uint64_t size_bytes = 0;  // bytes of the files this backup consists of (shared ones included)
  uint32_t files = 0;
};

// Receives one checkpoint body, chunk by chunk, as it arrives from the network.
//
// The model is locked for pushes while the session lives. Destroying a session that was not
// committed aborts it: everything it wrote is removed and nothing becomes visible.
class PushSession {
 public:
  virtual ~PushSession() = default;
  // Consumes the next bytes of the safetensors body. After an error the session is failed and
  // only destruction (abort) remains.
  virtual Status Write(std::span<const uint8_t> bytes) = 0;
  // Declares the end of the body, then makes the version visible in one atomic, synced commit.
  virtual Result<VersionInfo> Commit() = 0;
};

// Streams one stored version back as a safetensors body.
class RestoreStream {
 public:
  virtual ~RestoreStream() = default;
  virtual const VersionInfo& info() const = 0;
  // Total body size (known before the first byte).
  virtual uint64_t size() const = 0;
  // Returns the next piece of the body (the header first, then decoded chunks in body order);
  // an empty piece means the end. Corrupt data yields DataLoss naming model, version, tensor.
  virtual Result<std::span<const uint8_t>> Next() = 0;
};

// Receives one shard of a sharded version as it arrives from the network.
//
// Destroying a session that was not finished discards its body; an earlier attempt of the same
// shard stays.
class ShardSession {
 public:
  virtual ~ShardSession() = default;
  // Consumes the next bytes of the shard's safetensors body. After an error the session is
  // failed and only destruction remains.
  virtual Status Write(std::span<const uint8_t> bytes) = 0;
  // Declares the end of the body, checks it against the shards already stored (slices within
  // their global shapes, dtypes and shapes that agree, no overlaps), and stores it durably in
  // place of an earlier attempt of the same shard. When it was the last shard missing, commits
  // the version (CheckpointStore::CommitUpload).
  virtual Result<ShardResult> Finish() = 0;
};

class CheckpointStore {
 public:
  // Opens (creating if needed, and options.create_if_missing allows) the store in
  // options.data_dir and runs recovery: data of pushes interrupted by a crash is removed. Fails
  // with NotFound when there is no store to open and none may be created.
  static Result<std::unique_ptr<CheckpointStore>> Open(const StoreOptions& options);

  virtual ~CheckpointStore() = default;

  // Validates model name and version and locks the model for a push. `body_size` is the
  // Content-Length if known. Fails with InvalidArgument (bad name), FailedPrecondition
  // (version not above the latest) or Aborted (another push to the model is in progress).
  virtual Result<std::unique_ptr<PushSession>> BeginPush(std::string_view model, uint64_t version,
                                                         std::optional<uint64_t> body_size,
                                                         const PushOptions& options = {}) = 0;

  // How a push of `version` of `model` whose safetensors header is `raw_header` (its 8-byte
  // length prefix and JSON) would be coded now: what a client encoding at the edge follows
  // (PushBodyFormat::kEncoded). Takes no lock; a push that commits meanwhile makes the plan
  // stale, and the encoded push is then refused with FailedPrecondition. Fails as BeginPush
  // does for the name and the version, InvalidArgument for a header that does not parse.
  virtual Result<CodingPlan> PlanPush(std::string_view model, uint64_t version,
                                      std::string_view raw_header) = 0;

  // How shard `shard` of `shard_count` of a sharded `version`, whose safetensors header is
  // `raw_header` (its slices declared as for BeginShard), is coded by its rank: each tensor's
  // global plan and the slice the shard holds, with the chunks inside it that the rank codes
  // (an encoded shard, BeginShard with PushBodyFormat::kEncoded). Takes no lock; errors as
  // PlanPush's, and InvalidArgument for slices that do not fit their tensors.
  virtual Result<CodingPlan> PlanShard(std::string_view model, uint64_t version, uint32_t shard,
                                       uint32_t shard_count, std::string_view raw_header) = 0;

  // Calls `on_free` once the writer now holding `model` (a push, another change of the model,
  // the commit of a sharded version) is done, so that a writer refused as busy (Aborted) tries
  // again then; returns false, without keeping `on_free`, if none holds the
  // model now. `on_free` runs on the finishing writer's thread: it must be quick and must not
  // call the store.
  virtual bool CallWhenModelFree(std::string_view model, std::function<void()> on_free) = 0;

  // Opens a restore of `version`, or of the latest version when nullopt. The stream reads a
  // consistent snapshot: concurrent pushes and deletes do not affect it. (With a cluster, data
  // that another daemon's deletion or garbage collection made unreachable stays readable for
  // two lease durations, at least 5 minutes; a restore still reading it after that fails with
  // an error, never with wrong bytes.)
  virtual Result<std::unique_ptr<RestoreStream>> OpenRestore(std::string_view model,
                                                             std::optional<uint64_t> version) = 0;

  // As OpenRestore, sending the stored chunk records that reconstruct the version (an encoded
  // pull body, ckpt/codec/encoded_pull.h) for a client that decodes them. With `since`, a
  // version the client holds the reconstruction of, chunks whose delta chains run through it are
  // sent as the deltas after it, the others as their chains from the keyframe. A `selection`
  // that is not whole sends the part it names (as OpenRestore with a selection does): the
  // records of the chunks that hold it, and the part's header (no SHA-256: each chunk is
  // checked by its record's checksum). NotFound for a `since` that is not a version of the
  // model; InvalidArgument for `since` with a part, a byte range, and as OpenRestore for the
  // selection.
  virtual Result<std::unique_ptr<RestoreStream>> OpenEncodedRestore(
      std::string_view model, std::optional<uint64_t> version, std::optional<uint64_t> since,
      const RestoreSelection& selection) = 0;

  // As OpenRestore, sending the part `selection` names (see RestoreSelection) as a safetensors
  // body of its own. Every chunk read is verified; the body's SHA-256 is not known in advance
  // (info().sha256 is empty) unless the selection is whole. InvalidArgument for a selection that
  // names no tensor, a box outside its tensor, or rank >= ranks.
  virtual Result<std::unique_ptr<RestoreStream>> OpenRestore(std::string_view model,
                                                             std::optional<uint64_t> version,
                                                             const RestoreSelection& selection) = 0;

  // How a version was pushed: {"shards": N, "shard_sha256": [...], "tensors": {name: {"dtype",
  // "global_shape", "slices": [{"shard", "offsets", "shape"}]}}} (docs/api.md); a version pushed
  // whole is one shard holding every tensor whole.
  virtual Result<std::string> GetShardLayout(std::string_view model,
                                             std::optional<uint64_t> version) = 0;

  // Sharded versions (docs/api.md, "Sharded versions"). A version may be pushed as
  // `shard_count` safetensors bodies by as many processes at once, each holding whole tensors
  // or slices of global tensors (kSlicesMetadataKey). Shards are stored apart from the model
  // (they neither lock it nor change it) until the last one arrives; the version then commits
  // as one push of the assembled global tensors, atomically: it is never visible in part.
  // A shard sent again replaces its earlier attempt; sent again after the commit with the same
  // bytes, it answers the committed version. Fails with InvalidArgument (names, shard >=
  // shard_count, shard_count 0 or above StoreOptions::max_shards_per_version, or differing
  // from the upload's), FailedPrecondition (version not above the latest) or NoSpace.
  // `options` (metrics, labels, tags) apply to the version when this shard commits it.
  virtual Result<std::unique_ptr<ShardSession>> BeginShard(std::string_view model, uint64_t version,
                                                           uint32_t shard, uint32_t shard_count,
                                                           std::optional<uint64_t> body_size,
                                                           const PushOptions& options = {}) = 0;
  // The upload of `version` (NotFound if none; a committed version's upload reports
  // committed).
  virtual Result<ShardUploadInfo> GetUpload(std::string_view model, uint64_t version) = 0;
  virtual Result<std::vector<ShardUploadInfo>> ListUploads() = 0;
  // Commits an upload whose shards are all stored (FailedPrecondition naming the missing ones
  // otherwise): checks that the slices tile every global tensor (InvalidArgument naming the
  // tensor and shards: the upload stays, for a corrected shard), then pushes the assembled
  // version. A failed commit changes nothing; it can be asked again.
  virtual Result<ShardResult> CommitUpload(std::string_view model, uint64_t version,
                                           const PushOptions& options = {}) = 0;
  // Removes an uncommitted upload and its data. NotFound if none.
  virtual Status AbortUpload(std::string_view model, uint64_t version) = 0;
  // Removes the uploads idle for longer than StoreOptions::upload_expiry; returns them.
  virtual Result<std::vector<ShardUploadInfo>> ExpireUploads() = 0;

  virtual Result<std::vector<ModelInfo>> ListModels() = 0;
  virtual Result<ModelInfo> GetModel(std::string_view model) = 0;
  virtual Result<std::vector<VersionInfo>> ListVersions(std::string_view model) = 0;
  virtual Result<VersionInfo> GetVersion(std::string_view model,
                                         std::optional<uint64_t> version) = 0;
  // The version's per-tensor storage: codec, quantizer, bound, bytes and bits per element.
  virtual Result<VersionDetail> GetVersionDetail(std::string_view model,
                                                 std::optional<uint64_t> version) = 0;

  // Deletes one version. Versions that still need its data (as a delta base) keep restoring
  // byte-identically; data no live version needs is dropped (CollectGarbage frees the rest).
  // FailedPrecondition if the version is tagged: remove its tags first.
  virtual Status DeleteVersion(std::string_view model, uint64_t version) = 0;

  // Tags: names unique per model (the model-name rule), each naming one version; a tagged
  // version is pinned (retention never removes it). SetTag moves the tag if another version
  // holds it; NotFound if the version does not exist. RemoveTag: NotFound if not set.
  virtual Status SetTag(std::string_view model, std::string_view tag, uint64_t version) = 0;
  virtual Status RemoveTag(std::string_view model, std::string_view tag) = 0;
  virtual Result<uint64_t> ResolveTag(std::string_view model, std::string_view tag) = 0;

  // The model's retention policy (the server default if none was set). NotFound for unknown
  // models. SetRetentionPolicy creates the model (without versions) if needed; it applies from
  // the next retention pass.
  virtual Result<RetentionPolicy> GetRetentionPolicy(std::string_view model) = 0;
  virtual Status SetRetentionPolicy(std::string_view model, const RetentionPolicy& policy) = 0;

  // Evaluates the retention policy, deletes what it does not keep (unless a dry run), then
  // reclaims the space. Aborted if the model is busy.
  virtual Result<RetentionReport> ApplyRetention(std::string_view model,
                                                 const RetentionRun& run) = 0;
  // Deletes a model with all its versions, policy and codec state.
  virtual Status DeleteModel(std::string_view model) = 0;

  // The model's codec policy (the default policy if none was set). NotFound for unknown models.
  virtual Result<CodecPolicy> GetPolicy(std::string_view model) = 0;
  // Sets the policy, creating the model (without versions) if needed. Applies from the next push.
  virtual Status SetPolicy(std::string_view model, const CodecPolicy& policy) = 0;

  // Removes the data of deleted versions of `model` that no kept version needs, rebasing kept
  // versions per `options` (see GcOptions). Never changes what any version restores to. Aborted
  // if the model is busy (a push is in progress).
  virtual Result<GcReport> CollectGarbage(std::string_view model, const GcOptions& options) = 0;

  // Arranges that restoring the latest version of `model` decodes one payload per chunk: a
  // push stores deltas against the version before, and this pass re-encodes the latest version
  // exactly as keyframes and the version before as deltas against them (reverse deltas), when
  // that costs at most 3% more than what it replaces (lossless tensors and lossy
  // ones on a chain-independent lattice; chains with element history or low-rank shifts stay
  // forward). Restoring any version still decodes at most keyframe_every payloads per chunk.
  // Never changes what any version restores to; crash-safe (a new manifest under a fresh seq,
  // switched in one synced batch, as a rebase). Aborted if the model is busy, or when a push
  // asks for the model or `cancelled` (if set, asked between chunks) returns true while the
  // pass runs: it then steps aside and leaves nothing behind.
  virtual Result<RearrangeReport> RearrangeLatest(std::string_view model,
                                                  const std::function<bool()>& cancelled) = 0;

  // Reads every stored chunk record of `model` (verifying its checksums), restores every version
  // in full (verifying each chain link and the body's SHA-256), and looks for data that nothing
  // needs. Read-only, on a snapshot; runs beside pushes (whose unfinished data is not counted).
  // Problems are in the report; an error Status means the scrub itself could not run.
  virtual Result<ScrubReport> Scrub(std::string_view model) = 0;

  // Makes a consistent online backup of the whole store into `backup_dir` (created if missing;
  // successive backups into one directory share unchanged files), with RocksDB's BackupEngine,
  // while pushes and restores continue: it holds exactly the versions committed when it
  // started. The backup is verified (file sizes and checksums) before this returns.
  virtual Result<BackupResult> Backup(const std::string& backup_dir) = 0;

  // Restores the newest backup in `backup_dir` into `data_dir`, which must not exist or be
  // empty; the store there then opens like the original at the time of the backup.
  static Status RestoreBackup(const std::string& backup_dir, const std::string& data_dir);

  // Copies `model` into `destination` (another store opened by Open, on any backend: a local
  // store into a bucket, a bucket back to a disk) as it is stored: every version, tag and policy,
  // the chunk records as they are (nothing decoded or re-encoded), so its versions restore
  // bit-identically there and its stored bytes are the same. The model must not exist in the
  // destination (FailedPrecondition; nothing is written). It appears there in one commit after
  // its chunks are durable: a failed copy leaves nothing visible and removes what it wrote (a
  // copy cut short by a crash leaves chunk records under the name, which a later copy of it
  // refuses to reuse). Holds the model's write lock (and, on a shared backend, its write lease)
  // in both stores meanwhile; the source's data is not changed.
  virtual Result<ModelCopyReport> CopyModelTo(std::string_view model,
                                              CheckpointStore& destination) = 0;

  // Where writes to `model` must go: nullopt when this daemon takes them (always, on a single
  // node; with a cluster, when it holds the model's lease or nobody does), else the base URL the
  // lease holder advertises (empty if it advertises none).
  virtual Result<std::optional<std::string>> WriteOwner(std::string_view model) = 0;
  // Whether shards of sharded versions go to the model's writer like other writes: true when
  // several daemons share the store but each spools shards on its own disk (the S3 backend);
  // false on a single node, or where any daemon takes any shard (RADOS: the spool is in the
  // pool).
  virtual bool ShardsGoToTheWriter() const { return false; }

  // Counters since open and the storage engine's sizes. Thread-safe, cheap (no scans).
  virtual StoreStats Stats() = 0;

  // Whether writes are taken now. When the storage engine stopped after an error it can
  // recover from, first tries to resume it (at most a few times a second, however often this
  // is called): the daemon calls this periodically, so writes come back without a request.
  virtual StoreHealthReport Health() = 0;

  // Flushes memtables and the WAL so the data directory holds only table and blob files.
  // Called by the daemon on clean shutdown; the destructor closes the database.
  virtual Status Flush() = 0;
};

}  // namespace ckpt
