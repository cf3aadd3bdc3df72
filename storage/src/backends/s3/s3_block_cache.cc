// Read blocks kept in memory (s3_block_cache.h).
#include "backends/s3/s3_block_cache.h"

namespace ckpt {
namespace {

void DeleteBlock(const rocksdb::Slice&, void* value) {
  delete static_cast<S3BlockCache::Block*>(value);
}

}  // namespace

S3BlockCache::S3BlockCache(size_t capacity_bytes) : cache_(rocksdb::NewLRUCache(capacity_bytes)) {}

Result<S3BlockCache::Block> S3BlockCache::Get(const std::string& key, uint64_t offset,
                                              uint64_t length,
                                              const std::function<Result<std::string>()>& fetch) {
  const std::string id = key + "@" + std::to_string(offset) + "+" + std::to_string(length);
  std::promise<Result<Block>> promise;
  std::shared_future<Result<Block>> reading;
  {
    std::lock_guard lock(mu_);
    if (rocksdb::Cache::Handle* handle = cache_->Lookup(id)) {
      Block block = *static_cast<Block*>(cache_->Value(handle));
      cache_->Release(handle);
      return block;
    }
    if (auto it = reading_.find(id); it != reading_.end()) {
      reading = it->second;
    } else {
      reading_[id] = promise.get_future().share();
    }
  }
  if (reading.valid()) return reading.get();
  Result<Block> read = [&]() -> Result<Block> {
    CKPT_ASSIGN_OR_RETURN(std::string bytes, fetch());
    return std::make_shared<const std::string>(std::move(bytes));
  }();
  std::lock_guard lock(mu_);
  if (read.ok()) {
    // Not kept when larger than the whole cache (the insert fails): the readers still get it.
    (void)cache_->Insert(id, new Block(*read), (*read)->size(), &DeleteBlock);
  }
  promise.set_value(read);
  reading_.erase(id);
  return read;
}

}  // namespace ckpt
