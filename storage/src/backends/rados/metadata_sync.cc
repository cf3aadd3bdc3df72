// Keeping the local metadata cache equal to the pool's (metadata_sync.h).
#include "backends/rados/metadata_sync.h"

#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>

#include "backends/rados/rados_status.h"
#include "engine/rocks_status.h"

namespace ckpt {

using namespace rados_layout;

Status MetadataSync::Refresh(const std::string& model) {
  ModelState& state = leases_->StateOf(model);
  std::lock_guard lock(state.mu);
  if (state.TrustsCache()) return Status::Ok();
  OmapValues control;
  int prval = 0;
  librados::ObjectReadOperation op;
  op.omap_get_vals_by_keys({kGenerationKey}, &control, &prval);
  const int r = io_->operate(ModelObject(model), &op, nullptr);
  if (r == -ENOENT) return Resync(model, state);
  CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + model + "'"));
  CKPT_ASSIGN_OR_RETURN(const uint64_t generation, ReadU64(control, kGenerationKey));
  if (state.generation && *state.generation == generation) return Status::Ok();
  return Resync(model, state);
}

Status MetadataSync::RefreshMany(const std::vector<std::string>& models) {
  constexpr size_t kInFlight = 64;
  struct Check {
    const std::string* model;
    OmapValues control;
    int prval = 0;
    librados::ObjectReadOperation op;
    librados::AioCompletion* completion = nullptr;
  };
  for (size_t begin = 0; begin < models.size(); begin += kInFlight) {
    const size_t end = std::min(models.size(), begin + kInFlight);
    std::vector<Check> checks(end - begin);
    for (size_t i = begin; i < end; ++i) {
      Check& c = checks[i - begin];
      c.model = &models[i];
      c.op.omap_get_vals_by_keys({kGenerationKey}, &c.control, &c.prval);
      c.completion = librados::Rados::aio_create_completion();
      if (io_->aio_operate(ModelObject(models[i]), c.completion, &c.op, nullptr) < 0) {
        c.completion->release();
        c.completion = nullptr;
      }
    }
    for (Check& c : checks) {
      int r = -EIO;
      if (c.completion) {
        c.completion->wait_for_complete();
        r = c.completion->get_return_value();
        c.completion->release();
      }
      ModelState& state = leases_->StateOf(*c.model);
      std::lock_guard lock(state.mu);
      if (state.TrustsCache()) continue;
      if (r < 0 && r != -ENOENT) {
        CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + *c.model + "'"));
      }
      if (r == 0) {
        CKPT_ASSIGN_OR_RETURN(const uint64_t generation, ReadU64(c.control, kGenerationKey));
        if (state.generation && *state.generation == generation) continue;
      }
      CKPT_RETURN_IF_ERROR(Resync(*c.model, state));
    }
  }
  return Status::Ok();
}

Status MetadataSync::Resync(const std::string& model, ModelState& state) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    OmapValues all;
    std::optional<uint64_t> generation;
    bool consistent = true, missing = false;
    std::string after;
    for (bool more = true; more;) {
      OmapValues page, control;
      int prval = 0, control_rval = 0;
      librados::ObjectReadOperation op;
      op.omap_get_vals_by_keys({kGenerationKey, kLayoutKey}, &control, &control_rval);
      op.omap_get_vals2(after, kOmapPage, &page, &more, &prval);
      const int r = io_->operate(ModelObject(model), &op, nullptr);
      if (r == -ENOENT) {
        missing = true;
        break;
      }
      CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + model + "'"));
      CKPT_RETURN_IF_ERROR(CheckLayout(model, control));
      CKPT_ASSIGN_OR_RETURN(const uint64_t g, ReadU64(control, kGenerationKey));
      if (generation && *generation != g) {
        consistent = false;
        break;
      }
      generation = g;
      if (page.empty()) break;
      after = page.rbegin()->first;
      all.merge(page);
    }
    if (!consistent) continue;
    rocksdb::WriteBatch batch;
    CKPT_RETURN_IF_ERROR(layout_->CacheBatch(model, FromOmap(all), &batch));
    CKPT_RETURN_IF_ERROR(
        FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "caching model '" + model + "'"));
    state.generation = missing ? 0 : generation.value_or(0);
    return Status::Ok();
  }
  return Status::Unavailable("model '" + model + "' changes too fast to read consistently");
}

}  // namespace ckpt
