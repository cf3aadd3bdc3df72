#include "context/since_delta_cache.h"

namespace ckpt {

std::string SinceDeltaCache::MakeKey(const Key& key) {
  std::string out = std::to_string(key.generation);
  out.push_back('\0');
  out.append(key.model);
  out.push_back('\0');
  out += std::to_string(key.target_seq) + "/" + std::to_string(key.since_seq) + "/" +
         std::to_string(key.tensor) + "/" + std::to_string(key.chunk);
  return out;
}

SinceDeltaCache::Known SinceDeltaCache::Get(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(MakeKey(key));
  if (it == index_.end()) return {};
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->known;
}

void SinceDeltaCache::Put(const Key& key, Record record) {
  if (record == nullptr || record->size() > budget_bytes_) return;
  const uint64_t bytes = record->size();
  Insert(key, {std::move(record), bytes}, bytes);
}

void SinceDeltaCache::PutSizeOnly(const Key& key, uint64_t record_bytes) {
  if (record_bytes == 0 || kSizeOnlyEntryBytes > budget_bytes_) return;
  Insert(key, {nullptr, record_bytes}, kSizeOnlyEntryBytes);
}

void SinceDeltaCache::Insert(const Key& key, Known known, uint64_t charged_bytes) {
  std::string k = MakeKey(key);
  std::lock_guard lock(mu_);
  if (auto it = index_.find(k); it != index_.end()) {
    // A record is worth more than its size (another pull, whose chain was shorter, found it no
    // smaller): kept.
    if (known.record == nullptr && it->second->known.record != nullptr) return;
    size_bytes_ -= it->second->charged_bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  size_bytes_ += charged_bytes;
  lru_.push_front({k, std::move(known), charged_bytes});
  index_[std::move(k)] = lru_.begin();
  while (size_bytes_ > budget_bytes_ && !lru_.empty()) {
    size_bytes_ -= lru_.back().charged_bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

uint64_t SinceDeltaCache::size_bytes() const {
  std::lock_guard lock(mu_);
  return size_bytes_;
}

}  // namespace ckpt
