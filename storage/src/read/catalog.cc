// The store's read queries (catalog.h).
#include "read/catalog.h"

#include <memory>

#include "ckpt/codec/lossy_codec.h"
#include "read/chain_reader.h"
#include "records/keys.h"

namespace ckpt {
namespace {

namespace keys = storage_keys;

std::string KindName(uint8_t kind) {
  switch (kind) {
    case VersionRecord::kKindKeyframe:
      return "keyframe";
    case VersionRecord::kKindDelta:
      return "delta";
    default:
      return "mixed";
  }
}

}  // namespace

VersionInfo MakeVersionInfo(std::string_view model, uint64_t version, const VersionRecord& r) {
  VersionInfo info;
  info.model = std::string(model);
  info.version = version;
  info.kind = KindName(r.kind);
  info.raw_bytes = r.raw_bytes;
  info.stored_bytes = r.stored_bytes;
  info.created_at_ms = r.created_at_ms;
  info.sha256 = r.restored_sha256_hex;
  info.pushed_sha256 = r.sha256_hex;
  info.lossy = r.lossy;
  info.tensor_count = r.tensor_count;
  info.dropped_tensors = static_cast<uint32_t>(r.dropped_tensors.size());
  info.metrics = r.metrics;
  info.labels = r.labels;
  return info;
}

ModelInfo MakeModelInfo(std::string_view model, const ModelRecord& r) {
  ModelInfo info;
  info.name = std::string(model);
  if (r.has_versions) info.latest_version = r.latest_version;
  info.version_count = r.version_count;
  info.raw_bytes = r.raw_bytes;
  info.stored_bytes = r.stored_bytes;
  info.created_at_ms = r.created_at_ms;
  return info;
}

Result<ModelRecord> RequireModel(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                 std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(
      auto record, ctx.GetRecord<ModelRecord>(ro, ctx.models, std::string(model), "model record"));
  if (!record) return Status::NotFound("model '" + std::string(model) + "' not found");
  return std::move(*record);
}

Result<std::pair<uint64_t, VersionRecord>> FindVersion(const StoreContext& ctx,
                                                       const rocksdb::ReadOptions& ro,
                                                       std::string_view model,
                                                       std::optional<uint64_t> version) {
  CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(ctx, ro, model));
  if (!version) {
    if (!record.has_versions) {
      return Status::NotFound("model '" + std::string(model) + "' has no versions");
    }
    version = record.latest_version;
  }
  CKPT_ASSIGN_OR_RETURN(
      auto vr, ctx.GetRecord<VersionRecord>(ro, ctx.versions, keys::VersionKey(model, *version),
                                            "version record"));
  if (!vr) {
    return Status::NotFound("model '" + std::string(model) + "' has no version " +
                            std::to_string(*version));
  }
  return std::make_pair(*version, std::move(*vr));
}

Result<std::optional<std::pair<uint64_t, VersionRecord>>> FindVersionBefore(
    const StoreContext& ctx, const rocksdb::ReadOptions& ro, std::string_view model,
    uint64_t version) {
  using Found = std::optional<std::pair<uint64_t, VersionRecord>>;
  if (version == 0) return Found();
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(ro, ctx.versions));
  const std::string prefix = keys::ModelPrefix(model);
  it->SeekForPrev(keys::VersionKey(model, version - 1));
  if (!it->Valid() || !it->key().starts_with(prefix)) {
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "model '" + std::string(model) + "' versions"));
    return Found();
  }
  const uint64_t older = keys::NumberAfterPrefix(it->key().ToStringView(), model.size());
  auto record = VersionRecord::DecodeFrom(it->value().ToStringView());
  if (!record.ok()) {
    return record.status().WithContext("model '" + std::string(model) + "' version " +
                                       std::to_string(older));
  }
  return Found(std::make_pair(older, std::move(record).value()));
}

Result<std::map<uint64_t, std::vector<std::string>>> TagsByVersion(const StoreContext& ctx,
                                                                   const rocksdb::ReadOptions& ro,
                                                                   std::string_view model) {
  std::map<uint64_t, std::vector<std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(ro, ctx.tags));
  const std::string prefix = keys::ModelPrefix(model);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    auto tag = TagRecord::DecodeFrom(it->value().ToStringView());
    if (!tag.ok()) return tag.status().WithContext("model '" + std::string(model) + "'");
    out[tag->version].push_back(it->key().ToString().substr(prefix.size()));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing tags"));
  return out;
}

Result<std::vector<VersionInfo>> ListVersionsAt(const StoreContext& ctx,
                                                const rocksdb::ReadOptions& ro,
                                                std::string_view model) {
  CKPT_RETURN_IF_ERROR(RequireModel(ctx, ro, model).status());
  CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx, ro, model));
  std::vector<VersionInfo> out;
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(ro, ctx.versions));
  const std::string prefix = keys::ModelPrefix(model);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    auto vr = VersionRecord::DecodeFrom(it->value().ToStringView());
    if (!vr.ok()) return vr.status().WithContext("model '" + std::string(model) + "'");
    const uint64_t number = keys::NumberAfterPrefix(it->key().ToStringView(), model.size());
    out.push_back(MakeVersionInfo(model, number, *vr));
    if (auto t = tags.find(number); t != tags.end()) out.back().tags = std::move(t->second);
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing versions"));
  return out;
}

Result<std::vector<ModelInfo>> ListAllModels(const StoreContext& ctx) {
  std::vector<ModelInfo> out;
  CKPT_ASSIGN_OR_RETURN(auto names, ctx.backend->ListModelNames());
  if (names) {  // the cluster's index
    CKPT_RETURN_IF_ERROR(ctx.backend->RefreshMany(*names));
    for (const std::string& name : *names) {
      auto record =
          ctx.GetRecord<ModelRecord>(rocksdb::ReadOptions(), ctx.models, name, "model record");
      if (!record.ok()) return record.status().WithContext("model '" + name + "'");
      if (*record) out.push_back(MakeModelInfo(name, **record));
    }
    return out;
  }
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(rocksdb::ReadOptions(), ctx.models));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto record = ModelRecord::DecodeFrom(it->value().ToStringView());
    if (!record.ok()) return record.status().WithContext("model '" + it->key().ToString() + "'");
    out.push_back(MakeModelInfo(it->key().ToStringView(), *record));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing models"));
  return out;
}

Result<VersionDetail> VersionDetailAt(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                      std::string_view model, std::optional<uint64_t> version) {
  CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ctx, ro, model, version));
  ChainReader reader(ctx.db, ctx.manifests, ctx.backend, ro.snapshot, std::string(model), nullptr);
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* manifest, reader.Manifest(found.second.seq));
  VersionDetail detail;
  detail.info = MakeVersionInfo(model, found.first, found.second);
  CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx, ro, model));
  detail.info.tags = std::move(tags[found.first]);
  for (uint32_t i = 0; i < manifest->tensors.size(); ++i) {
    const ManifestTensor& t = manifest->tensors[i];
    TensorDetail d;
    d.name = t.name;
    d.dropped = found.second.Dropped(i);
    d.dtype = std::string(DTypeName(t.dtype));
    d.shape = t.shape;
    d.kind = t.kind == FrameKind::kKeyframe ? "keyframe" : "delta";
    const bool lossy = t.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized);
    d.codec = lossy ? "lossy" : "lossless";
    if (lossy) d.quantizer = std::string(QuantizerName(static_cast<Quantizer>(t.quantizer)));
    d.bound = t.bound;
    d.chain_length = t.chain_length;
    d.chunk_bytes = t.chunk_bytes;
    d.tiles = t.tile_counts;
    d.raw_bytes = t.byte_size;
    d.stored_bytes = t.stored_bytes;
    d.exact_elements = t.exact_elements;
    const uint64_t elements = t.byte_size / DTypeSize(t.dtype);
    if (elements > 0) {
      d.bits_per_element = 8.0 * static_cast<double>(t.stored_bytes) / elements;
      d.entropy_bits_per_element = t.entropy_bits / static_cast<double>(elements);
    }
    detail.tensors.push_back(std::move(d));
  }
  return detail;
}
}  // namespace ckpt
