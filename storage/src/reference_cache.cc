#include "reference_cache.h"

#include "keys.h"

namespace ckpt {

std::string ReferenceCache::MakeKey(std::string_view model, uint64_t seq, uint32_t tensor,
                                    uint32_t chunk) {
  return storage_keys::ChunkKey(model, seq, tensor, chunk);
}

ReferenceCache::Chunk ReferenceCache::Get(std::string_view model, uint64_t seq, uint32_t tensor,
                                          uint32_t chunk) {
  std::lock_guard lock(mu_);
  auto it = index_.find(MakeKey(model, seq, tensor, chunk));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->data;
}

void ReferenceCache::Put(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                         Chunk data) {
  if (!data || data->size() > budget_bytes_) return;
  std::lock_guard lock(mu_);
  std::string key = MakeKey(model, seq, tensor, chunk);
  auto it = index_.find(key);
  if (it != index_.end()) {
    size_bytes_ -= it->second->data->size();
    lru_.erase(it->second);
    index_.erase(it);
  }
  size_bytes_ += data->size();
  lru_.push_front(Entry{key, std::string(model), seq, std::move(data)});
  index_.emplace(std::move(key), lru_.begin());
  EvictLocked();
}

bool ReferenceCache::Contains(std::string_view model, uint64_t seq, uint32_t tensor,
                              uint32_t chunk) const {
  std::lock_guard lock(mu_);
  return index_.count(MakeKey(model, seq, tensor, chunk)) > 0;
}

void ReferenceCache::Erase(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  std::lock_guard lock(mu_);
  auto it = index_.find(MakeKey(model, seq, tensor, chunk));
  if (it == index_.end()) return;
  size_bytes_ -= it->second->data->size();
  lru_.erase(it->second);
  index_.erase(it);
}

void ReferenceCache::Rekey(std::string_view model, uint64_t old_seq, uint64_t new_seq) {
  std::lock_guard lock(mu_);
  const std::string old_prefix = storage_keys::NumberedKey(model, old_seq);
  const std::string new_prefix = storage_keys::NumberedKey(model, new_seq);
  for (Entry& e : lru_) {
    if (e.model != model || e.seq != old_seq) continue;
    auto node = index_.extract(e.key);
    e.key = new_prefix + e.key.substr(old_prefix.size());
    e.seq = new_seq;
    node.key() = e.key;
    index_.insert(std::move(node));
  }
}

void ReferenceCache::DropModelExcept(std::string_view model, uint64_t keep_seq) {
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->model == model && it->seq != keep_seq) {
      size_bytes_ -= it->data->size();
      index_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t ReferenceCache::size_bytes() const {
  std::lock_guard lock(mu_);
  return size_bytes_;
}

void ReferenceCache::EvictLocked() {
  while (size_bytes_ > budget_bytes_ && !lru_.empty()) {
    size_bytes_ -= lru_.back().data->size();
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

}  // namespace ckpt
