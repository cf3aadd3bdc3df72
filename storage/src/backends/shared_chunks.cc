// Chunk objects in shared stores (shared_chunks.h).
#include "backends/shared_chunks.h"

namespace ckpt {

Status ChunkWriteQueue::Add(std::unique_ptr<ChunkStore::PendingPut> write) {
  std::unique_ptr<ChunkStore::PendingPut> oldest;
  {
    std::lock_guard lock(mu_);
    writes_.push_back(std::move(write));
    if (writes_.size() <= max_in_flight_) return Status::Ok();
    oldest = std::move(writes_.front());
    writes_.pop_front();
  }
  return oldest->Wait();
}

Status ChunkWriteQueue::WaitAll() {
  std::deque<std::unique_ptr<ChunkStore::PendingPut>> writes;
  {
    std::lock_guard lock(mu_);
    writes.swap(writes_);
  }
  Status first;
  for (auto& write : writes) {
    Status s = write->Wait();
    if (first.ok()) first = std::move(s);
  }
  return first;
}

std::vector<std::string> ChunkSetNames(
    const ChunkSet& set, const std::function<std::string(uint64_t, uint32_t, uint32_t)>& name) {
  std::vector<std::string> names;
  for (uint32_t t = 0; t < set.chunk_counts.size(); ++t) {
    for (uint32_t c = 0; c < set.chunk_counts[t]; ++c) names.push_back(name(set.seq, t, c));
  }
  return names;
}

void PinRecords(std::vector<std::string> bytes, std::vector<rocksdb::PinnableSlice>* records) {
  *records = std::vector<rocksdb::PinnableSlice>(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    *(*records)[i].GetSelf() = std::move(bytes[i]);
    (*records)[i].PinSelf();
  }
}

Status VisitListedChunks(ChunkStore& store, const std::vector<ListedChunk>& listed,
                         uint64_t seq_end, const StoreBackend::ChunkVisitor& visit) {
  for (const ListedChunk& c : listed) {
    if (c.seq >= seq_end) continue;
    auto record = store.Get(c.name);
    if (record.status().code() == StatusCode::kNotFound) continue;  // removed since listed
    CKPT_RETURN_IF_ERROR(record.status());
    visit(c.seq, c.tensor, c.chunk, *record);
  }
  return Status::Ok();
}

Result<uint64_t> RemoveListedOrphans(ChunkStore& store, const std::vector<ListedChunk>& listed,
                                     const std::set<uint64_t>& stored, uint64_t seq_end,
                                     const std::set<std::string>& deferred) {
  std::vector<std::string> orphans;
  for (const ListedChunk& c : listed) {
    if (c.seq < seq_end && !stored.count(c.seq) && !deferred.count(c.name)) {
      orphans.push_back(c.name);
    }
  }
  CKPT_RETURN_IF_ERROR(store.DeleteAll(orphans));
  return static_cast<uint64_t>(orphans.size());
}

}  // namespace ckpt
