// What the backends that keep chunk records as objects of a shared store (RADOS, S3) do alike:
// keep a model's chunk writes in flight, hand read objects to the store, visit and collect the
// objects a listing found. Internal to storage/.
#pragma once

#include <rocksdb/slice.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/chunk_store.h"
#include "backends/deferred_removals.h"
#include "backends/store_backend.h"
#include "ckpt/base/status.h"

namespace ckpt {

// Seqs a daemon allocates for a model lie above epoch << kSeqEpochShift: a writer that takes a
// model over raises the epoch, so its chunk names never meet a former writer's.
inline constexpr int kSeqEpochShift = 40;

// A chunk object a listing found, with the address its name encodes.
struct ListedChunk {
  std::string name;
  uint64_t seq;
  uint32_t tensor;
  uint32_t chunk;
};

// The chunk writes of one model in flight. Thread safety: safe for concurrent use.
class ChunkWriteQueue {
 public:
  explicit ChunkWriteQueue(size_t max_in_flight = 16) : max_in_flight_(max_in_flight) {}

  // Starts the write of object `name` (`start`) and queues it; once more than the limit are in
  // flight, waits for the oldest (its error). A write of a name still in flight is waited for
  // first: an object store orders nothing between concurrent writes of one key, and a writer
  // that writes a name again (rearrangement replaces the reverse deltas of a tensor it gives up
  // on) means its last content. The ordering holds for writes of one name from one thread (the
  // one writer that rewrites names, rearrangement, writes from one).
  Status Add(const std::string& name,
             const std::function<std::unique_ptr<ChunkStore::PendingPut>()>& start);
  // Waits for every write in flight; the first error.
  Status WaitAll();

 private:
  struct Write {
    std::string name;
    std::unique_ptr<ChunkStore::PendingPut> pending;
  };
  const size_t max_in_flight_;
  std::mutex mu_;
  std::deque<Write> writes_;  // guarded by mu_
};

// The object names of a chunk set, `name(seq, tensor, chunk)` each.
std::vector<std::string> ChunkSetNames(
    const ChunkSet& set, const std::function<std::string(uint64_t, uint32_t, uint32_t)>& name);

// Moves read objects into the records the store reads (pinned, as RocksDB's are).
void PinRecords(std::vector<std::string> bytes, std::vector<rocksdb::PinnableSlice>* records);

// Reads and visits every listed chunk with seq below `seq_end` (scrub), several reads at a time;
// chunks whose removal is deferred (`deferred`: no commit refers to them any more) and chunks
// removed since they were listed are skipped.
Status VisitListedChunks(ChunkStore& store, const std::vector<ListedChunk>& listed,
                         uint64_t seq_end, const std::set<std::string>& deferred,
                         const StoreBackend::ChunkVisitor& visit);

// Removes the listed chunks with seq below `seq_end` that belong to no stored push (`stored`)
// and whose removal is not already deferred (`deferred`); how many.
Result<uint64_t> RemoveListedOrphans(ChunkStore& store, const std::vector<ListedChunk>& listed,
                                     const std::set<uint64_t>& stored, uint64_t seq_end,
                                     const std::set<std::string>& deferred);

// How long chunks a commit made unreachable stay readable: two leases, at least 5 minutes (a
// multi-gigabyte restore another daemon started on the previous generation must be able to
// finish).
inline RemovalClock::duration RemovalGrace(std::chrono::milliseconds lease) {
  return std::max<RemovalClock::duration>(lease * 2, std::chrono::minutes(5));
}

}  // namespace ckpt
