// ChunkStore on S3 (s3_chunk_store.h).
#include "backends/s3/s3_chunk_store.h"

#include <future>

namespace ckpt {
namespace {

// Thread safety: safe for concurrent use (the client is).
class S3ChunkStore final : public ChunkStore {
 public:
  explicit S3ChunkStore(S3Client* client) : client_(client) {}

  Status Put(std::string_view name, std::string_view bytes) override {
    return client_->Put(name, bytes).status();
  }

  Result<std::string> Get(std::string_view name) override {
    CKPT_ASSIGN_OR_RETURN(S3Object object, client_->Get(name));
    return std::move(object.body);
  }

  std::unique_ptr<PendingPut> PutAsync(std::string_view name, std::string_view bytes) override {
    struct Pending : PendingPut {
      ~Pending() override {
        if (done.valid()) done.wait();
      }
      Status Wait() override {
        if (done.valid()) status = done.get();
        return status;
      }
      std::string name, bytes;
      std::future<Status> done;
      Status status;
    };
    auto pending = std::make_unique<Pending>();
    pending->name = std::string(name);
    pending->bytes = std::string(bytes);
    Pending* p = pending.get();
    pending->done = client_->Async([this, p] { return client_->Put(p->name, p->bytes).status(); });
    return pending;
  }

  Result<std::vector<std::string>> GetAll(const std::vector<std::string>& names) override {
    std::vector<std::string> out(names.size());
    std::vector<std::future<Status>> reads;
    for (size_t i = 0; i < names.size(); ++i) {
      reads.push_back(client_->Async([this, &names, &out, i]() -> Status {
        CKPT_ASSIGN_OR_RETURN(out[i], Get(names[i]));
        return Status::Ok();
      }));
    }
    CKPT_RETURN_IF_ERROR(WaitForAll(reads));
    return out;
  }

  Status Delete(std::string_view name) override { return client_->Delete(name); }

  Status DeleteAll(const std::vector<std::string>& names) override {
    return client_->DeleteMany(names);
  }

  Result<std::vector<std::string>> List(std::string_view prefix) override {
    CKPT_ASSIGN_OR_RETURN(auto objects, client_->ListAll(prefix));
    std::vector<std::string> names;
    for (auto& object : objects) names.push_back(std::move(object.key));
    return names;
  }

 private:
  S3Client* const client_;
};

}  // namespace

std::unique_ptr<ChunkStore> NewS3ChunkStore(S3Client* client) {
  return std::make_unique<S3ChunkStore>(client);
}

}  // namespace ckpt
