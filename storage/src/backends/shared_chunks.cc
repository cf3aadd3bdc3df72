// Chunk objects in shared stores (shared_chunks.h).
#include "backends/shared_chunks.h"

#include <algorithm>

namespace ckpt {

Status ChunkWriteQueue::Add(const std::string& name,
                            const std::function<std::unique_ptr<ChunkStore::PendingPut>()>& start) {
  std::unique_ptr<ChunkStore::PendingPut> earlier;
  {
    std::lock_guard lock(mu_);
    auto same = std::find_if(writes_.begin(), writes_.end(),
                             [&](const Write& w) { return w.name == name; });
    if (same != writes_.end()) {
      earlier = std::move(same->pending);
      writes_.erase(same);
    }
  }
  if (earlier) CKPT_RETURN_IF_ERROR(earlier->Wait());
  std::unique_ptr<ChunkStore::PendingPut> started = start();
  std::unique_ptr<ChunkStore::PendingPut> oldest;
  {
    std::lock_guard lock(mu_);
    writes_.push_back({name, std::move(started)});
    if (writes_.size() <= max_in_flight_) return Status::Ok();
    oldest = std::move(writes_.front().pending);
    writes_.pop_front();
  }
  return oldest->Wait();
}

Status ChunkWriteQueue::WaitAll() {
  std::deque<Write> writes;
  {
    std::lock_guard lock(mu_);
    writes.swap(writes_);
  }
  Status first;
  for (Write& write : writes) {
    Status s = write.pending->Wait();
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
                         uint64_t seq_end, const std::set<std::string>& deferred,
                         const StoreBackend::ChunkVisitor& visit) {
  // Batches bound the records held at once while keeping the reads of a remote store in flight.
  constexpr size_t kBatch = 64;
  std::vector<const ListedChunk*> batch;
  std::vector<std::string> names;
  auto visit_batch = [&]() -> Status {
    auto records = store.GetAll(names);
    if (records.status().code() == StatusCode::kNotFound) {
      // One was removed since it was listed: read them one by one, skipping what is gone.
      for (const ListedChunk* c : batch) {
        auto record = store.Get(c->name);
        if (record.status().code() == StatusCode::kNotFound) continue;
        CKPT_RETURN_IF_ERROR(record.status());
        visit(c->seq, c->tensor, c->chunk, *record);
      }
    } else {
      CKPT_RETURN_IF_ERROR(records.status());
      for (size_t i = 0; i < batch.size(); ++i) {
        visit(batch[i]->seq, batch[i]->tensor, batch[i]->chunk, (*records)[i]);
      }
    }
    batch.clear();
    names.clear();
    return Status::Ok();
  };
  for (const ListedChunk& c : listed) {
    if (c.seq >= seq_end || deferred.count(c.name)) continue;
    batch.push_back(&c);
    names.push_back(c.name);
    if (batch.size() == kBatch) CKPT_RETURN_IF_ERROR(visit_batch());
  }
  return batch.empty() ? Status::Ok() : visit_batch();
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
