// A model's metadata records as one flat map (model_records.h).
#include "backends/model_records.h"

#include <memory>

#include "engine/rocks_status.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

ModelRecords::ModelRecords(rocksdb::DB* db, const MetadataFamilies& families)
    : db_(db), families_(families) {
  letters_ = {{families.models->GetID(), 'm'},
              {families.versions->GetID(), 'v'},
              {families.manifests->GetID(), 'f'},
              {families.codec_state->GetID(), 's'},
              {families.tags->GetID(), 't'}};
}

Status ModelRecords::Translate(const std::string& model, const rocksdb::WriteBatch& batch,
                               RecordMap* sets, std::set<std::string>* removals) const {
  struct Handler : rocksdb::WriteBatch::Handler {
    const ModelRecords* self;
    const std::string* model;
    RecordMap* sets;
    std::set<std::string>* removals;
    Status error;

    rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                          const rocksdb::Slice& value) override {
      auto record_key = self->RecordKey(*model, cf, key.ToStringView());
      if (!record_key.ok()) return Fail(record_key.status());
      removals->erase(*record_key);
      (*sets)[*record_key] = value.ToString();
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
      auto record_key = self->RecordKey(*model, cf, key.ToStringView());
      if (!record_key.ok()) return Fail(record_key.status());
      sets->erase(*record_key);
      removals->insert(*record_key);
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice& begin,
                                  const rocksdb::Slice& end) override {
      // The range's keys as this daemon's cache holds them (it is current: we own the model).
      auto family = self->FamilyOf(cf);
      if (!family) return Fail(Status::Internal("metadata: delete range in an unknown family"));
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

rocksdb::ColumnFamilyHandle* ModelRecords::FamilyOf(uint32_t cf) const {
  for (auto* h : {families_.models, families_.versions, families_.manifests, families_.codec_state,
                  families_.tags}) {
    if (h->GetID() == cf) return h;
  }
  return nullptr;
}

Result<std::string> ModelRecords::RecordKey(const std::string& model, uint32_t cf,
                                            std::string_view key) const {
  auto letter = letters_.find(cf);
  if (letter == letters_.end()) return Status::Internal("metadata: write to an unknown family");
  std::string out(1, letter->second);
  if (key == model) return out;
  const std::string prefix = keys::ModelPrefix(model);
  if (!key.starts_with(prefix)) {
    return Status::Internal("metadata: a change of model '" + model + "' touches another model");
  }
  out.append(key.substr(prefix.size()));
  return out;
}

Result<std::pair<rocksdb::ColumnFamilyHandle*, std::string>> ModelRecords::LocalKey(
    const std::string& model, std::string_view record_key) const {
  rocksdb::ColumnFamilyHandle* cf = nullptr;
  switch (record_key.empty() ? '\0' : record_key[0]) {
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
      return Status::DataLoss("metadata: model '" + model + "' holds an unknown record family");
  }
  std::string local = (cf == families_.models || cf == families_.codec_state)
                          ? model
                          : keys::ModelPrefix(model) + std::string(record_key.substr(1));
  return std::make_pair(cf, std::move(local));
}

Status ModelRecords::CacheBatch(const std::string& model, const RecordMap& all,
                                rocksdb::WriteBatch* batch) const {
  batch->Delete(families_.models, model);
  batch->Delete(families_.codec_state, model);
  const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
  for (auto* cf : {families_.versions, families_.manifests, families_.tags}) {
    batch->DeleteRange(cf, begin, end);
  }
  for (const auto& [key, value] : all) {
    if (key.empty() || key[0] == kControlKeyPrefix) continue;
    CKPT_ASSIGN_OR_RETURN(auto local, LocalKey(model, key));
    batch->Put(local.first, local.second, value);
  }
  return Status::Ok();
}

Status ModelRecords::ChangeBatch(const std::string& model, const RecordMap& sets,
                                 const std::set<std::string>& removals,
                                 rocksdb::WriteBatch* batch) const {
  for (const std::string& key : removals) {
    if (key.empty() || key[0] == kControlKeyPrefix) continue;
    CKPT_ASSIGN_OR_RETURN(auto local, LocalKey(model, key));
    batch->Delete(local.first, local.second);
  }
  for (const auto& [key, value] : sets) {
    if (key.empty() || key[0] == kControlKeyPrefix) continue;
    CKPT_ASSIGN_OR_RETURN(auto local, LocalKey(model, key));
    batch->Put(local.first, local.second, value);
  }
  return Status::Ok();
}

Result<RecordMap> ModelRecords::CachedRecords(const std::string& model) const {
  RecordMap records;
  for (auto [cf, letter] : {std::pair{families_.models, 'm'}, {families_.codec_state, 's'}}) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, model, &value);
    if (s.IsNotFound()) continue;
    CKPT_RETURN_IF_ERROR(FromRocks(s, "reading the records of model '" + model + "'"));
    records[std::string(1, letter)] = std::move(value);
  }
  const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
  for (auto [cf, letter] :
       {std::pair{families_.versions, 'v'}, {families_.manifests, 'f'}, {families_.tags, 't'}}) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf));
    for (it->Seek(begin); it->Valid() && it->key().compare(end) < 0; it->Next()) {
      records[letter + it->key().ToString().substr(begin.size())] = it->value().ToString();
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading the records of model '" + model + "'"));
  }
  return records;
}

}  // namespace ckpt
