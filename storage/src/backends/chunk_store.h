// ChunkStore: the payload backend of the checkpoint store — immutable named objects holding
// chunk records (keyframes and deltas). Internal to storage/.
//
// The store names each chunk so that a name is written by one writer, before any commit refers
// to it (model, seq, writer epoch, tensor, chunk): a retried or duplicated Put writes the same
// bytes again and is harmless, and a fenced former owner can never overwrite a live chunk. (A
// writer may write a name again before its commit — rearrangement does — and means the last
// content: ChunkWriteQueue orders those writes.) That makes the interface the smallest one
// every object store offers: put, get, delete, list by prefix. The RADOS and S3 backends keep
// their chunk records in one.
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

class ChunkStore {
 public:
  virtual ~ChunkStore() = default;

  // Writes the whole object `name` (replacing it if it exists). Durable when it returns Ok.
  virtual Status Put(std::string_view name, std::string_view bytes) = 0;
  // The whole object. NotFound if there is none.
  virtual Result<std::string> Get(std::string_view name) = 0;

  // Starts writing `name` (the bytes are copied); durable once Wait() returns Ok. Lets a writer
  // keep several writes in flight. Must be waited for before the store is destroyed.
  class PendingPut {
   public:
    virtual ~PendingPut() = default;
    virtual Status Wait() = 0;
  };
  virtual std::unique_ptr<PendingPut> PutAsync(std::string_view name, std::string_view bytes) {
    struct Done : PendingPut {
      explicit Done(Status s) : status(std::move(s)) {}
      Status Wait() override { return status; }
      Status status;
    };
    return std::make_unique<Done>(Put(name, bytes));
  }
  // Reads every object in `names` (implementations may read concurrently); fails with the first
  // error (NotFound if one is missing).
  virtual Result<std::vector<std::string>> GetAll(const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const std::string& name : names) {
      CKPT_ASSIGN_OR_RETURN(std::string bytes, Get(name));
      out.push_back(std::move(bytes));
    }
    return out;
  }

  // Removes the object; Ok if there was none (deletion is idempotent).
  virtual Status Delete(std::string_view name) = 0;
  // Removes every object in `names` (implementations may run the removals concurrently); the
  // first error, after trying all.
  virtual Status DeleteAll(const std::vector<std::string>& names) {
    Status first;
    for (const std::string& name : names) {
      Status s = Delete(name);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }
  // The names that start with `prefix`, in no particular order. Cost: a scan of the store's
  // objects (for garbage collection of orphans, not for the data path).
  virtual Result<std::vector<std::string>> List(std::string_view prefix) = 0;
};

// Where a RADOS chunk store keeps its objects.
struct RadosChunkStoreOptions {
  std::string conf_file;  // ceph.conf of the cluster (monitors, keyring)
  std::string client_name = "client.admin";
  std::string pool = "ckptd";
  std::string object_namespace = "chunks";  // RADOS namespace within the pool
};

// Connects to the cluster and opens the pool. IoError naming the step if it cannot. Built when
// CKPT_WITH_RADOS is on (the default; off in the clang fuzzing build).
Result<std::unique_ptr<ChunkStore>> OpenRadosChunkStore(const RadosChunkStoreOptions& options);

}  // namespace ckpt
