#include "context/reference_cache.h"

#include "records/keys.h"

namespace ckpt {

std::string ReferenceCache::MakeKey(std::string_view model, uint64_t seq, uint32_t tensor,
                                    uint32_t chunk) {
  return storage_keys::ChunkKey(model, seq, tensor, chunk);
}

ReferenceCache::Chunk ReferenceCache::Get(std::string_view model, uint64_t seq, uint32_t tensor,
                                          uint32_t chunk, uint64_t generation) {
  std::lock_guard lock(mu_);
  if (generation != kAnyGeneration && generation != generation_) return nullptr;
  auto it = index_.find(MakeKey(model, seq, tensor, chunk));
  if (it == index_.end()) return nullptr;
  List& list = ListOf(it->second->kind);
  list.splice(list.begin(), list, it->second);
  return it->second->data;
}

void ReferenceCache::Put(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                         Chunk data, Kind kind, uint64_t generation) {
  if (!data || data->size() > budget_bytes_) return;
  std::lock_guard lock(mu_);
  if (generation != kAnyGeneration && generation != generation_) return;
  std::string key = MakeKey(model, seq, tensor, chunk);
  auto it = index_.find(key);
  if (it != index_.end()) {
    if (it->second->kind == Kind::kReference) kind = Kind::kReference;
    RemoveLocked(ListOf(it->second->kind), it->second);
  }
  size_bytes_[static_cast<size_t>(kind)] += data->size();
  List& list = ListOf(kind);
  list.push_front(Entry{key, std::string(model), seq, kind, std::move(data)});
  index_.emplace(std::move(key), list.begin());
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
  RemoveLocked(ListOf(it->second->kind), it->second);
}

void ReferenceCache::Demote(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  std::lock_guard lock(mu_);
  auto it = index_.find(MakeKey(model, seq, tensor, chunk));
  if (it != index_.end() && it->second->kind == Kind::kReference) DemoteLocked(it->second);
}

void ReferenceCache::DemoteModelExcept(std::string_view model, uint64_t keep_seq) {
  std::lock_guard lock(mu_);
  // Oldest first, so that the restored chunks keep the references' order of use.
  List& references = ListOf(Kind::kReference);
  for (auto it = references.end(); it != references.begin();) {
    auto entry = std::prev(it);
    if (entry->model == model && entry->seq != keep_seq) {
      DemoteLocked(entry);  // `it` stays valid and now follows the entry before
    } else {
      it = entry;
    }
  }
}

void ReferenceCache::Rekey(std::string_view model, uint64_t old_seq, uint64_t new_seq) {
  std::lock_guard lock(mu_);
  const std::string old_prefix = storage_keys::NumberedKey(model, old_seq);
  const std::string new_prefix = storage_keys::NumberedKey(model, new_seq);
  for (List& list : lists_) {
    for (Entry& e : list) {
      if (e.model != model || e.seq != old_seq) continue;
      auto node = index_.extract(e.key);
      e.key = new_prefix + e.key.substr(old_prefix.size());
      e.seq = new_seq;
      node.key() = e.key;
      index_.insert(std::move(node));
    }
  }
}

void ReferenceCache::DropModelExcept(std::string_view model, uint64_t keep_seq) {
  std::lock_guard lock(mu_);
  if (keep_seq == 0) ++generation_;
  for (List& list : lists_) {
    for (auto it = list.begin(); it != list.end();) {
      if (it->model == model && it->seq != keep_seq) {
        it = RemoveLocked(list, it);
      } else {
        ++it;
      }
    }
  }
}

uint64_t ReferenceCache::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

uint64_t ReferenceCache::size_bytes() const {
  std::lock_guard lock(mu_);
  return size_bytes_[0] + size_bytes_[1];
}

uint64_t ReferenceCache::size_bytes(Kind kind) const {
  std::lock_guard lock(mu_);
  return size_bytes_[static_cast<size_t>(kind)];
}

ReferenceCache::List::iterator ReferenceCache::RemoveLocked(List& list, List::iterator it) {
  size_bytes_[static_cast<size_t>(it->kind)] -= it->data->size();
  index_.erase(it->key);
  return list.erase(it);
}

void ReferenceCache::DemoteLocked(List::iterator it) {
  const uint64_t bytes = it->data->size();
  size_bytes_[static_cast<size_t>(Kind::kReference)] -= bytes;
  size_bytes_[static_cast<size_t>(Kind::kRestored)] += bytes;
  it->kind = Kind::kRestored;
  List& restored = ListOf(Kind::kRestored);
  restored.splice(restored.begin(), ListOf(Kind::kReference), it);
}

void ReferenceCache::EvictLocked() {
  while (size_bytes_[0] + size_bytes_[1] > budget_bytes_) {
    List& list = ListOf(lists_[1].empty() ? Kind::kReference : Kind::kRestored);
    if (list.empty()) return;
    RemoveLocked(list, std::prev(list.end()));
  }
}

}  // namespace ckpt
