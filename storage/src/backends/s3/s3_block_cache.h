// S3BlockCache: read blocks of packs (s3_packs.h) kept in memory, so that the records of a block
// cost one request however many readers ask for them. Packs never change once written, so a
// cached block is exact for as long as anyone can name it. Internal to storage/.
//
// Thread safety: safe for concurrent use. Concurrent readers of one block wait for the one
// request that reads it.
#pragma once

#include <rocksdb/cache.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt {

class S3BlockCache {
 public:
  using Block = std::shared_ptr<const std::string>;

  // Keeps up to `capacity_bytes` of blocks, least recently used evicted first.
  explicit S3BlockCache(size_t capacity_bytes);

  // The bytes [offset, offset + length) of object `key`: from the cache, or read by `fetch`.
  Result<Block> Get(const std::string& key, uint64_t offset, uint64_t length,
                    const std::function<Result<std::string>()>& fetch);

 private:
  std::shared_ptr<rocksdb::Cache> cache_;
  std::mutex mu_;
  std::map<std::string, std::shared_future<Result<Block>>> reading_;  // guarded by mu_
};

}  // namespace ckpt
