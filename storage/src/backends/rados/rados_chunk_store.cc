// ChunkStore on Ceph RADOS through librados: one object per chunk, in one namespace of a pool.
#include "backends/rados/rados_chunk_store.h"

#include <algorithm>
#include <cerrno>
#include <deque>
#include <limits>
#include <rados/librados.hpp>

#include "backends/rados/rados_status.h"

namespace ckpt {
namespace {

class RadosChunkStore : public ChunkStore {
 public:
  RadosChunkStore() = default;
  // Shares the connection of `io` (whose owner outlives this store).
  explicit RadosChunkStore(librados::IoCtx& io) : connected_(false) { io_.dup(io); }

  ~RadosChunkStore() override {
    io_.close();
    if (connected_) cluster_.shutdown();
  }

  Status Open(const RadosChunkStoreOptions& options) {
    return ConnectToPool(options, &cluster_, &io_);
  }

  Status Put(std::string_view name, std::string_view bytes) override {
    if (bytes.size() > std::numeric_limits<unsigned>::max()) {  // bufferlist lengths are 32-bit
      return Status::InvalidArgument("rados: " + Describe("writing", name) + ": larger than 4 GiB");
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

  std::unique_ptr<PendingPut> PutAsync(std::string_view name, std::string_view bytes) override {
    struct Pending : PendingPut {
      ~Pending() override {
        if (completion) (void)Wait();
      }
      Status Wait() override {
        if (!completion) return status;
        completion->wait_for_complete();
        const int r = completion->get_return_value();
        completion->release();
        completion = nullptr;
        status = FromRados(r, Describe("writing", name));
        return status;
      }
      std::string name;
      librados::bufferlist data;
      librados::AioCompletion* completion = nullptr;
      Status status;
    };
    auto pending = std::make_unique<Pending>();
    pending->name = std::string(name);
    if (bytes.size() > std::numeric_limits<unsigned>::max()) {
      pending->status =
          Status::InvalidArgument("rados: " + Describe("writing", name) + ": larger than 4 GiB");
      return pending;
    }
    pending->data.append(bytes.data(), static_cast<unsigned>(bytes.size()));
    pending->completion = librados::Rados::aio_create_completion();
    const int r = io_.aio_write_full(pending->name, pending->completion, pending->data);
    if (r < 0) {
      pending->completion->release();
      pending->completion = nullptr;
      pending->status = FromRados(r, Describe("writing", name));
    }
    return pending;
  }

  // Up to 16 reads in flight.
  Result<std::vector<std::string>> GetAll(const std::vector<std::string>& names) override {
    constexpr size_t kInFlight = 16;
    std::vector<std::string> out(names.size());
    for (size_t begin = 0; begin < names.size(); begin += kInFlight) {
      const size_t end = std::min(names.size(), begin + kInFlight);
      std::vector<librados::bufferlist> data(end - begin);
      std::vector<librados::AioCompletion*> completions;
      int failed = 0;
      size_t failed_at = begin;
      for (size_t i = begin; i < end; ++i) {
        librados::AioCompletion* c = librados::Rados::aio_create_completion();
        const int r = io_.aio_read(names[i], c, &data[i - begin], 0, 0);
        if (r < 0) {
          c->release();
          if (failed == 0) failed = r, failed_at = i;
          break;
        }
        completions.push_back(c);
      }
      for (size_t k = 0; k < completions.size(); ++k) {
        completions[k]->wait_for_complete();
        const int r = completions[k]->get_return_value();
        completions[k]->release();
        if (r < 0 && failed == 0) failed = r, failed_at = begin + k;
      }
      if (failed < 0) return FromRados(failed, Describe("reading", names[failed_at]));
      for (size_t i = begin; i < end; ++i) out[i] = data[i - begin].to_str();
    }
    return out;
  }

  Status Delete(std::string_view name) override {
    const int r = io_.remove(std::string(name));
    return r == -ENOENT ? Status::Ok() : FromRados(r, Describe("removing", name));
  }

  // Up to 64 removals in flight.
  Status DeleteAll(const std::vector<std::string>& names) override {
    constexpr size_t kInFlight = 64;
    struct Pending {
      librados::AioCompletion* completion;
      const std::string* name;
    };
    std::deque<Pending> pending;
    Status first;
    auto finish = [&](Pending p) {
      p.completion->wait_for_complete();
      const int r = p.completion->get_return_value();
      p.completion->release();
      if (r < 0 && r != -ENOENT && first.ok()) first = FromRados(r, Describe("removing", *p.name));
    };
    for (const std::string& name : names) {
      librados::AioCompletion* c = librados::Rados::aio_create_completion();
      const int r = io_.aio_remove(name, c);
      if (r < 0) {
        c->release();
        if (first.ok()) first = FromRados(r, Describe("removing", name));
        continue;
      }
      pending.push_back({c, &name});
      if (pending.size() >= kInFlight) {
        finish(pending.front());
        pending.pop_front();
      }
    }
    for (const Pending& p : pending) finish(p);
    return first;
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
    return std::string(action) + " object '" + std::string(name) + "'";
  }

  bool connected_ = true;  // owns cluster_ (OpenRadosChunkStore) rather than sharing a connection
  librados::Rados cluster_;
  librados::IoCtx io_;
};

}  // namespace

Status ConnectToPool(const RadosChunkStoreOptions& where, librados::Rados* cluster,
                     librados::IoCtx* io) {
  CKPT_RETURN_IF_ERROR(FromRados(cluster->init2(where.client_name.c_str(), "ceph", 0),
                                 "initialising client " + where.client_name));
  CKPT_RETURN_IF_ERROR(
      FromRados(cluster->conf_read_file(where.conf_file.c_str()), "reading " + where.conf_file));
  // No admin socket: several daemons (and tools) with one client name share a host.
  cluster->conf_set("admin_socket", "");
  // Errors instead of hangs when the cluster is unreachable or unhealthy: librados waits 300 s
  // for the monitors and forever for operations by default. A failed operation fails its
  // request (a push stores nothing); the lease then expires on its own.
  cluster->conf_set("client_mount_timeout", "30");
  cluster->conf_set("rados_mon_op_timeout", "30");
  cluster->conf_set("rados_osd_op_timeout", "120");
  CKPT_RETURN_IF_ERROR(FromRados(cluster->connect(), "connecting to the cluster"));
  CKPT_RETURN_IF_ERROR(FromRados(cluster->ioctx_create(where.pool.c_str(), *io),
                                 "opening pool '" + where.pool + "'"));
  io->set_namespace(where.object_namespace);
  return Status::Ok();
}

std::unique_ptr<ChunkStore> NewRadosChunkStore(librados::IoCtx& io) {
  return std::make_unique<RadosChunkStore>(io);
}

Result<std::unique_ptr<ChunkStore>> OpenRadosChunkStore(const RadosChunkStoreOptions& options) {
  auto store = std::make_unique<RadosChunkStore>();
  CKPT_RETURN_IF_ERROR(store->Open(options));
  return std::unique_ptr<ChunkStore>(std::move(store));
}

}  // namespace ckpt
