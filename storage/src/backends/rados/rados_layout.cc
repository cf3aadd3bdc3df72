// The layout of ckptd's data in a RADOS pool (rados_layout.h).
#include "backends/rados/rados_layout.h"

#include <cstdio>
#include <memory>

#include "engine/rocks_status.h"
#include "records/keys.h"

namespace ckpt::rados_layout {

namespace keys = storage_keys;

librados::bufferlist U64(uint64_t v) {
  std::string s;
  keys::AppendBigEndian(s, v, 8);
  librados::bufferlist bl;
  bl.append(s);
  return bl;
}

Result<uint64_t> ReadU64(const OmapValues& values, const std::string& key) {
  auto it = values.find(key);
  if (it == values.end()) return uint64_t{0};
  const std::string s = it->second.to_str();
  if (s.size() != 8) return Status::DataLoss("rados: malformed control key in model object");
  return keys::ReadBigEndian(s, 0, 8);
}

std::string ModelObject(std::string_view model) { return "model." + std::string(model); }

std::string ChunkPrefix(std::string_view model) { return "chunk/" + std::string(model) + "/"; }

std::string ChunkObject(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "%016llx/%u/%u", static_cast<unsigned long long>(seq), tensor,
                chunk);
  return ChunkPrefix(model) + tail;
}

// FailedPrecondition when the model object has a layout newer than this daemon's.
Status CheckLayout(const std::string& model, const OmapValues& control) {
  CKPT_ASSIGN_OR_RETURN(const uint64_t layout, ReadU64(control, kLayoutKey));
  if (layout <= kLayoutVersion) return Status::Ok();
  return Status::FailedPrecondition(
      "model '" + model + "' was written by a newer ckptd (RADOS layout " + std::to_string(layout) +
      "; this one knows up to " + std::to_string(kLayoutVersion) + "): upgrade this daemon");
}

std::vector<std::string> ChunkNames(const std::string& model, const ChunkSet& set) {
  std::vector<std::string> names;
  for (uint32_t t = 0; t < set.chunk_counts.size(); ++t) {
    for (uint32_t c = 0; c < set.chunk_counts[t]; ++c) {
      names.push_back(ChunkObject(model, set.seq, t, c));
    }
  }
  return names;
}

std::vector<ListedChunk> ParseChunkObjects(const std::string& model,
                                           std::vector<std::string> names) {
  const std::string prefix = ChunkPrefix(model);
  std::vector<ListedChunk> out;
  for (std::string& oid : names) {
    unsigned long long seq = 0;
    unsigned tensor = 0, chunk = 0;
    if (oid.starts_with(prefix) &&
        std::sscanf(oid.c_str() + prefix.size(), "%16llx/%u/%u", &seq, &tensor, &chunk) == 3) {
      out.push_back({std::move(oid), seq, tensor, chunk});
    }
  }
  return out;
}

MetadataLayout::MetadataLayout(rocksdb::DB* db, const MetadataFamilies& families)
    : db_(db), families_(families) {
  letters_ = {{families.models->GetID(), 'm'},
              {families.versions->GetID(), 'v'},
              {families.manifests->GetID(), 'f'},
              {families.codec_state->GetID(), 's'},
              {families.tags->GetID(), 't'}};
}

Status MetadataLayout::Translate(const std::string& model, const rocksdb::WriteBatch& batch,
                                 OmapValues* sets, std::set<std::string>* removals) const {
  struct Handler : rocksdb::WriteBatch::Handler {
    const MetadataLayout* self;
    const std::string* model;
    std::map<std::string, librados::bufferlist>* sets;
    std::set<std::string>* removals;
    Status error;

    rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                          const rocksdb::Slice& value) override {
      auto omap_key = self->OmapKey(*model, cf, key.ToStringView());
      if (!omap_key.ok()) return Fail(omap_key.status());
      librados::bufferlist bl;
      bl.append(value.data(), static_cast<unsigned>(value.size()));
      removals->erase(*omap_key);
      (*sets)[*omap_key] = std::move(bl);
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
      auto omap_key = self->OmapKey(*model, cf, key.ToStringView());
      if (!omap_key.ok()) return Fail(omap_key.status());
      sets->erase(*omap_key);
      removals->insert(*omap_key);
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice& begin,
                                  const rocksdb::Slice& end) override {
      // The range's keys as this daemon's cache holds them (it is current: we own the model).
      auto family = self->FamilyOf(cf);
      if (!family) return Fail(Status::Internal("rados: delete range in an unknown family"));
      std::unique_ptr<rocksdb::Iterator> it(self->db_->NewIterator(rocksdb::ReadOptions(), family));
      for (it->Seek(begin); it->Valid() && it->key().compare(end) < 0; it->Next()) {
        rocksdb::Status s = DeleteCF(cf, it->key());
        if (!s.ok()) return s;
      }
      return it->status();
    }
    rocksdb::Status Fail(Status s) {
      error = std::move(s);
      return rocksdb::Status::Aborted(error.message());
    }
  } handler;
  handler.self = this;
  handler.model = &model;
  handler.sets = sets;
  handler.removals = removals;
  rocksdb::Status s = batch.Iterate(&handler);
  if (!handler.error.ok()) return handler.error;
  return FromRocks(s, "translating a metadata change");
}

rocksdb::ColumnFamilyHandle* MetadataLayout::FamilyOf(uint32_t cf) const {
  for (auto* h : {families_.models, families_.versions, families_.manifests, families_.codec_state,
                  families_.tags}) {
    if (h->GetID() == cf) return h;
  }
  return nullptr;
}

Result<std::string> MetadataLayout::OmapKey(const std::string& model, uint32_t cf,
                                            std::string_view key) const {
  auto letter = letters_.find(cf);
  if (letter == letters_.end()) return Status::Internal("rados: write to an unknown family");
  std::string out(1, letter->second);
  if (key == model) return out;
  const std::string prefix = keys::ModelPrefix(model);
  if (!key.starts_with(prefix)) {
    return Status::Internal("rados: a change of model '" + model + "' touches another model");
  }
  out.append(key.substr(prefix.size()));
  return out;
}

Status MetadataLayout::CacheBatch(const std::string& model, const OmapValues& all,
                                  rocksdb::WriteBatch* batch) const {
  batch->Delete(families_.models, model);
  batch->Delete(families_.codec_state, model);
  const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
  for (auto* cf : {families_.versions, families_.manifests, families_.tags}) {
    batch->DeleteRange(cf, begin, end);
  }
  for (const auto& [key, value] : all) {
    if (key.empty() || key[0] == '\x01') continue;
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    switch (key[0]) {
      case 'm':
        cf = families_.models;
        break;
      case 'v':
        cf = families_.versions;
        break;
      case 'f':
        cf = families_.manifests;
        break;
      case 's':
        cf = families_.codec_state;
        break;
      case 't':
        cf = families_.tags;
        break;
      default:
        return Status::DataLoss("rados: model '" + model + "' holds an unknown record family");
    }
    const std::string local =
        (cf == families_.models || cf == families_.codec_state) ? model : begin + key.substr(1);
    const std::string bytes = value.to_str();
    batch->Put(cf, local, bytes);
  }
  return Status::Ok();
}

}  // namespace ckpt::rados_layout
