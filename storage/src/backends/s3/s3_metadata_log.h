// The metadata of a model in an S3 bucket: a log of commits, one object per generation created
// with If-None-Match: * (so exactly one writer wins each generation), and snapshots of every
// record as of a generation, from which a daemon rebuilds its cache without the whole log.
// Internal to storage/; layout and protocol in docs/format.md ("S3 bucket").
//
//   models/<model>/log/<g>        the commit of generation g (LogEntry)
//   models/<model>/snapshot/<g>   every record of the model as of generation g (Snapshot)
//   models/<model>/lease          the model's write lease (s3_leases.h)
//   models/<model>/kept/<g>       generation g's entry is never compacted away: a takeover
//                                 entry, or one a settled commit's generation holds
//
// <g> is ~generation in 16 hex digits, so that a listing (in key order) returns the newest
// first: one LIST of one key finds the head of the log.
//
// Written to the bucket: encodings and names never change; a new encoding bumps kFormatVersion
// and old daemons refuse what they cannot read.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "backends/model_records.h"
#include "backends/shared_chunks.h"
#include "ckpt/base/status.h"

namespace ckpt::s3_layout {

// Format 2: entries and snapshots may carry pack indexes (control records, s3_packs.h), which a
// daemon of format 1 would drop from the snapshots it writes; the encoding is format 1's.
inline constexpr uint32_t kFormatVersion = 2;

// One commit.
struct LogEntry {
  uint64_t generation = 0;
  // The model's epoch from this commit on: a takeover or a whole-model deletion increments it.
  uint64_t epoch = 0;
  // Random, unique to the commit: a writer whose create was answered 412 reads the entry back
  // and knows by its token whether the create that won was its own (an answer lost on the way).
  std::string token;
  std::string writer_url;  // who committed (for messages and operators)
  RecordMap sets;
  std::set<std::string> removals;
};

struct Snapshot {
  uint64_t generation = 0;
  uint64_t epoch = 0;
  RecordMap records;
};

std::string EncodeLogEntry(const LogEntry& entry);
// DataLoss when the bytes are not an entry (checksum, truncation), FailedPrecondition when a
// newer ckptd wrote it.
Result<LogEntry> DecodeLogEntry(std::string_view bytes);
std::string EncodeSnapshot(const Snapshot& snapshot);
Result<Snapshot> DecodeSnapshot(std::string_view bytes);

std::string ModelPrefix(std::string_view model);  // "models/<model>/"
std::string LogPrefix(std::string_view model);
std::string LogKey(std::string_view model, uint64_t generation);
std::string SnapshotPrefix(std::string_view model);
std::string SnapshotKey(std::string_view model, uint64_t generation);
std::string LeaseKey(std::string_view model);
// An empty object per log entry that compaction must keep (written before the entry can exist).
std::string KeptPrefix(std::string_view model);
std::string KeptKey(std::string_view model, uint64_t generation);
// The generation a log or snapshot key names (nullopt if `key` is not one under `prefix`).
std::optional<uint64_t> GenerationOf(std::string_view prefix, std::string_view key);

// Chunk records: chunks/<h>/<model>/<seq>/<tensor>/<chunk>, <h> one hex digit of a hash of the
// model and seq, so that the writes of one push spread over 16 key prefixes (S3 limits requests
// per prefix).
inline constexpr int kChunkPrefixes = 16;
std::string ChunkKey(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
// The prefix of the chunk objects of `model` under `seq` (packs too, s3_packs.h).
std::string ChunkSeqPrefix(std::string_view model, uint64_t seq);
// The listing prefix of a model's chunks under hash prefix `h`.
std::string ChunkListPrefix(std::string_view model, int h);
// The chunk key's address, if `key` is one of `model`'s.
std::optional<ListedChunk> ParseChunkKey(std::string_view model, std::string key);

}  // namespace ckpt::s3_layout
