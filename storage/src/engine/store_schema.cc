// The store's column families and their options (store_schema.h).
#include "engine/store_schema.h"

#include <rocksdb/options.h>
#include <rocksdb/table.h>

#include <algorithm>

#include "engine/directory_bytes.h"
#include "engine/engine_logger.h"
#include "engine/rocks_status.h"

namespace ckpt {
namespace {

constexpr char kModelsFamily[] = "models";
constexpr char kVersionsFamily[] = "versions";
constexpr char kManifestsFamily[] = "manifests";
constexpr char kChunksFamily[] = "chunks";
constexpr char kCodecStateFamily[] = "codec_state";
constexpr char kTagsFamily[] = "tags";

// Chunk payloads at least this large live in blob files rather than in the LSM tree.
constexpr uint64_t kMinBlobBytes = 4096;

// SST block sizes. A version record (mostly the pushed safetensors header) and a manifest are a
// few KiB and nearly equal from one version to the next: 64 KiB blocks let zstd code a dozen of
// them together (the versions family's SSTs shrink several times against 4 KiB blocks). The chunks
// family holds small payloads and blob references, read in key order by a restore.
constexpr size_t kMetadataBlockBytes = 64 << 10;
constexpr size_t kChunkBlockBytes = 16 << 10;

// The MANIFEST (the log of the engine's file changes) grows by a record per flush, compaction
// and blob file, and starts again from a snapshot of the live files once it passes
// max_manifest_file_size (RocksDB's default is 1 GiB). A daemon that runs for months would keep
// megabytes of it beside a small store: rolling it at a small fraction of what the directory
// holds keeps it in proportion. The limit is fixed when the database opens (RocksDB 7.8 cannot
// change it later), and once the snapshot alone exceeds it every change writes a new MANIFEST:
// the floor holds the snapshot of thousands of files, which a store that starts empty reaches
// only after thousands of versions in one run; each start sets the limit from the store again.
constexpr uint64_t kMinManifestBytes = 1 << 20;
constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr uint64_t kDirectoryBytesPerManifestByte = 256;

uint64_t ManifestLimit(const std::string& data_dir) {
  const uint64_t bytes = DirectoryBytes(data_dir).value_or(0);
  return std::clamp(bytes / kDirectoryBytesPerManifestByte, kMinManifestBytes, kMaxManifestBytes);
}

}  // namespace

Status OpenStoreDatabase(const std::string& data_dir, rocksdb::Env* env,
                         std::shared_ptr<rocksdb::EventListener> listener,
                         std::function<void(std::string_view)> engine_log,
                         std::unique_ptr<rocksdb::DB>* db, StoreFamilies* families) {
  rocksdb::DBOptions db_options;
  if (env != nullptr) db_options.env = env;
  if (listener) db_options.listeners.push_back(std::move(listener));
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.info_log = NewEngineLogger(db_options.info_log_level, std::move(engine_log));
  db_options.max_background_jobs = 2;
  // The store resumes after an engine error itself (StoreHealth). RocksDB's own recovery of
  // retryable I/O errors runs on a thread of its own, which the listener cannot turn off, and a
  // Close() that meets that thread as it starts can wait forever (RocksDB 7.8; upstream issue
  // facebook/rocksdb#11440): the daemon's shutdown would hang after a failed log write.
  db_options.max_bgerror_resume_count = 0;
  // Old WAL files are kept alive by the smallest family's memtable; cap their total so the
  // metadata families get flushed and the WAL does not grow with the chunk traffic. Every
  // pushed byte passes through the WAL before its blob file: this cap (plus the log file being
  // written) is the space a push needs beyond what it stores, which the free-space reserve
  // (StoreOptions::min_free_bytes) must cover.
  db_options.max_total_wal_size = 64ull << 20;
  // Log and blob files are not preallocated: the space the data directory takes is what it
  // holds, also while a push is under way.
  db_options.allow_fallocate = false;
  db_options.max_manifest_file_size = ManifestLimit(data_dir);

  rocksdb::ColumnFamilyOptions meta;
  meta.compression = rocksdb::kZSTD;
  rocksdb::BlockBasedTableOptions meta_table;
  meta_table.block_size = kMetadataBlockBytes;
  meta.table_factory.reset(rocksdb::NewBlockBasedTableFactory(meta_table));
  meta.write_buffer_size = 8 << 20;

  rocksdb::ColumnFamilyOptions chunks;
  // Large payloads go to blob files as they are (already entropy-coded); the LSM tree holds
  // small payloads and blob references, whose headers and keys compress well.
  chunks.compression = rocksdb::kZSTD;
  rocksdb::BlockBasedTableOptions chunk_table;
  chunk_table.block_size = kChunkBlockBytes;
  chunks.table_factory.reset(rocksdb::NewBlockBasedTableFactory(chunk_table));
  chunks.enable_blob_files = true;
  chunks.min_blob_size = kMinBlobBytes;
  chunks.blob_file_size = 64ull << 20;
  chunks.blob_compression_type = rocksdb::kNoCompression;
  // Deleted payloads stay in their blob files until no table refers to them, or garbage
  // collection moves the live ones out. The writers keep records that die together in files of
  // their own (the rearrangement's keyframes, which the next pass deletes, apart from the
  // reverse deltas that stay: StoreBackend::SealChunkWrites), so most garbage leaves with whole
  // files and compactions need not copy live blobs: only those in the oldest quarter of the
  // files are moved, and such files a quarter garbage get compactions of their own.
  chunks.enable_blob_garbage_collection = true;
  chunks.blob_garbage_collection_age_cutoff = 0.25;
  chunks.blob_garbage_collection_force_threshold = 0.25;
  // Memtables hold chunk values until they are flushed into blob files: 2 x 32 MiB bounds
  // that memory while keeping flushes large.
  chunks.write_buffer_size = 32 << 20;
  chunks.max_write_buffer_number = 2;

  const std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, meta},
      {kModelsFamily, meta},
      {kVersionsFamily, meta},
      {kManifestsFamily, meta},
      {kChunksFamily, chunks},
      {kCodecStateFamily, meta},
      {kTagsFamily, meta},
  };
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  CKPT_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(db_options, data_dir, descriptors, &handles, &raw),
                "opening the database"));
  db->reset(raw);
  families->all = handles;
  families->models = handles[1];
  families->versions = handles[2];
  families->manifests = handles[3];
  families->chunks = handles[4];
  families->codec_state = handles[5];
  families->tags = handles[6];
  return Status::Ok();
}

}  // namespace ckpt
