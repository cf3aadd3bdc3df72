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

SinceDeltaCache::Record SinceDeltaCache::Get(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(MakeKey(key));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void SinceDeltaCache::Put(const Key& key, Record record) {
  if (record == nullptr || record->size() > budget_bytes_) return;
  std::string k = MakeKey(key);
  std::lock_guard lock(mu_);
  if (auto it = index_.find(k); it != index_.end()) {
    size_bytes_ -= it->second->second->size();
    lru_.erase(it->second);
    index_.erase(it);
  }
  size_bytes_ += record->size();
  lru_.emplace_front(k, std::move(record));
  index_[std::move(k)] = lru_.begin();
  while (size_bytes_ > budget_bytes_ && !lru_.empty()) {
    size_bytes_ -= lru_.back().second->size();
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

uint64_t SinceDeltaCache::size_bytes() const {
  std::lock_guard lock(mu_);
  return size_bytes_;
}

}  // namespace ckpt
