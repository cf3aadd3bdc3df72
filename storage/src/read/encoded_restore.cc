// The encoded restore (encoded_restore.h).
#include "read/encoded_restore.h"

#include <rocksdb/slice.h>

#include <utility>
#include <vector>

#include "ckpt/codec/encoded_pull.h"
#include "read/chain_reader.h"

namespace ckpt {
namespace {

// One link frame of the body: which stored record, and what the client decodes it against.
struct Link {
  uint32_t body_tensor;  // index in the restored header
  uint32_t chunk;
  LinkBase base;
  StoreBackend::ChunkAddress address;
  uint64_t record_bytes = 0;
};

class EncodedRestoreStream final : public RestoreStream {
 public:
  EncodedRestoreStream(const StoreContext& ctx, ScopedSnapshot snapshot, std::string model,
                       VersionInfo info)
      : ctx_(ctx),
        snapshot_(std::move(snapshot)),
        model_(std::move(model)),
        info_(std::move(info)) {
    read_options_ = snapshot_.reads();
    read_options_.verify_checksums = false;  // each record carries its own checksums
  }

  // Lays out the body: every link of every chunk, in body order, with its record's size.
  Status Plan(const VersionRecord& record, uint64_t since_seq, uint64_t since_version) {
    ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, snapshot_.get(), model_, nullptr);
    CKPT_ASSIGN_OR_RETURN(const ManifestRecord* manifest, reader.Manifest(record.seq));
    uint32_t body_tensor = 0;
    for (uint32_t mi = 0; mi < manifest->tensors.size(); ++mi) {
      if (record.Dropped(mi)) continue;
      const ManifestTensor& target = manifest->tensors[mi];
      // The tensor's chain, newest first, down to its keyframe or to the client's version.
      std::vector<std::pair<uint64_t, uint32_t>> chain;
      bool from_since = false;
      uint64_t s = record.seq;
      uint32_t t = mi;
      for (;;) {
        CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, reader.Manifest(s));
        if (t >= m->tensors.size()) {
          return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                                  ": delta base tensor index out of range");
        }
        const ManifestTensor& e = m->tensors[t];
        chain.emplace_back(s, t);
        if (e.kind == FrameKind::kKeyframe) break;
        if (e.base_seq == since_seq && since_seq != 0) {
          from_since = true;
          break;
        }
        if (chain.size() > ChainReader::kMaxChainLinks) {
          return Status::DataLoss("model '" + model_ + "' tensor '" + e.name +
                                  "': delta chain too long (cyclic?)");
        }
        s = e.base_seq;
        t = e.base_tensor;
      }
      for (uint32_t c = 0; c < target.chunk_count; ++c) {
        for (size_t k = chain.size(); k-- > 0;) {
          const bool oldest = k + 1 == chain.size();
          const LinkBase base =
              !oldest ? LinkBase::kPrevious : (from_since ? LinkBase::kSince : LinkBase::kNone);
          links_.push_back({body_tensor, c, base, {chain[k].first, chain[k].second, c}, 0});
        }
      }
      ++body_tensor;
    }
    preamble_ = EncodePullPreamble(info_.version, since_seq != 0 ? since_version : 0,
                                   record.raw_header, record.restored_sha256_hex);
    size_ = preamble_.size() + EncodePullEnd().size();
    for (Link& link : links_) {
      rocksdb::PinnableSlice value;
      CKPT_RETURN_IF_ERROR(Read(link.address, &value));
      link.record_bytes = value.size();
      size_ += kLinkFrameOverhead + value.size();
    }
    return Status::Ok();
  }

  const VersionInfo& info() const override { return info_; }
  uint64_t size() const override { return size_; }

  Result<std::span<const uint8_t>> Next() override {
    piece_.clear();
    if (!preamble_sent_) {
      preamble_sent_ = true;
      piece_ = preamble_;
    } else if (next_link_ < links_.size()) {
      const Link& link = links_[next_link_++];
      rocksdb::PinnableSlice value;
      CKPT_RETURN_IF_ERROR(Read(link.address, &value));
      if (value.size() != link.record_bytes) {
        return Status::DataLoss("model '" + model_ + "' version " + std::to_string(info_.version) +
                                ": a chunk record changed size while it was sent");
      }
      piece_ = EncodeLinkFrameHead(link.body_tensor, link.chunk, link.base, value.size());
      piece_.append(value.data(), value.size());
    } else if (!end_sent_) {
      end_sent_ = true;
      piece_ = EncodePullEnd();
    }
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(piece_.data()), piece_.size());
  }

 private:
  Status Read(const StoreBackend::ChunkAddress& a, rocksdb::PinnableSlice* value) {
    return ctx_.backend->GetChunk(read_options_, model_, a.seq, a.tensor, a.chunk, value);
  }

  const StoreContext& ctx_;
  ScopedSnapshot snapshot_;
  const std::string model_;
  const VersionInfo info_;
  rocksdb::ReadOptions read_options_;
  std::vector<Link> links_;
  std::string preamble_;
  uint64_t size_ = 0;
  std::string piece_;
  size_t next_link_ = 0;
  bool preamble_sent_ = false;
  bool end_sent_ = false;
};

}  // namespace

Result<std::unique_ptr<RestoreStream>> OpenEncodedRestoreStream(
    const StoreContext& ctx, ScopedSnapshot snapshot, std::string model, VersionInfo info,
    VersionRecord record, uint64_t since_seq, uint64_t since_version) {
  auto stream = std::make_unique<EncodedRestoreStream>(ctx, std::move(snapshot), std::move(model),
                                                       std::move(info));
  CKPT_RETURN_IF_ERROR(stream->Plan(record, since_seq, since_version));
  return std::unique_ptr<RestoreStream>(std::move(stream));
}

}  // namespace ckpt
