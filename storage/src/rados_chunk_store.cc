// ChunkStore on Ceph RADOS through librados: one object per chunk, in one namespace of a pool.
#include <cerrno>
#include <limits>
#include <rados/librados.hpp>
#include <system_error>

#include "chunk_store.h"

namespace ckpt {
namespace {

// A librados return code (negative errno) as a Status.
Status FromRados(int r, std::string_view what) {
  if (r >= 0) return Status::Ok();
  std::string message =
      std::string(what) + ": " + std::error_code(-r, std::generic_category()).message();
  if (r == -ENOENT) return Status::NotFound(std::move(message));
  return Status::IoError(std::move(message));
}

class RadosChunkStore : public ChunkStore {
 public:
  ~RadosChunkStore() override {
    io_.close();
    cluster_.shutdown();
  }

  Status Open(const RadosChunkStoreOptions& options) {
    CKPT_RETURN_IF_ERROR(FromRados(cluster_.init2(options.client_name.c_str(), "ceph", 0),
                                   "rados: initialising client " + options.client_name));
    CKPT_RETURN_IF_ERROR(FromRados(cluster_.conf_read_file(options.conf_file.c_str()),
                                   "rados: reading " + options.conf_file));
    CKPT_RETURN_IF_ERROR(FromRados(cluster_.connect(), "rados: connecting to the cluster"));
    CKPT_RETURN_IF_ERROR(FromRados(cluster_.ioctx_create(options.pool.c_str(), io_),
                                   "rados: opening pool '" + options.pool + "'"));
    io_.set_namespace(options.object_namespace);
    return Status::Ok();
  }

  Status Put(std::string_view name, std::string_view bytes) override {
    if (bytes.size() > std::numeric_limits<unsigned>::max()) {  // bufferlist lengths are 32-bit
      return Status::InvalidArgument(Describe("writing", name) + ": larger than 4 GiB");
    }
    librados::bufferlist data;
    data.append(bytes.data(), static_cast<unsigned>(bytes.size()));
    return FromRados(io_.write_full(std::string(name), data), Describe("writing", name));
  }

  Result<std::string> Get(std::string_view name) override {
    librados::bufferlist data;
    // A length of 0 reads the whole object.
    const int r = io_.read(std::string(name), data, 0, 0);
    CKPT_RETURN_IF_ERROR(FromRados(r, Describe("reading", name)));
    return data.to_str();
  }

  Status Delete(std::string_view name) override {
    const int r = io_.remove(std::string(name));
    return r == -ENOENT ? Status::Ok() : FromRados(r, Describe("removing", name));
  }

  Result<std::vector<std::string>> List(std::string_view prefix) override {
    std::vector<std::string> names;
    try {
      for (auto it = io_.nobjects_begin(); it != io_.nobjects_end(); ++it) {
        if (it->get_oid().starts_with(prefix)) names.push_back(it->get_oid());
      }
    } catch (const std::exception& e) {  // the iterator reports errors by throwing
      return Status::IoError(std::string("rados: listing objects: ") + e.what());
    }
    return names;
  }

 private:
  static std::string Describe(std::string_view action, std::string_view name) {
    return "rados: " + std::string(action) + " object '" + std::string(name) + "'";
  }

  librados::Rados cluster_;
  librados::IoCtx io_;
};

}  // namespace

Result<std::unique_ptr<ChunkStore>> OpenRadosChunkStore(const RadosChunkStoreOptions& options) {
  auto store = std::make_unique<RadosChunkStore>();
  CKPT_RETURN_IF_ERROR(store->Open(options));
  return std::unique_ptr<ChunkStore>(std::move(store));
}

}  // namespace ckpt
