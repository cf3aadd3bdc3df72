// A model's packs as this daemon knows them (s3_model_packs.h).
#include "backends/s3/s3_model_packs.h"

#include <algorithm>
#include <random>
#include <utility>

namespace ckpt {
namespace {

using s3_layout::PackedSeq;
using s3_layout::PackMember;

// Pack names must not repeat within a seq: 64 bits of the system's entropy per pack.
uint64_t RandomId() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | device();
}

uint64_t Address(uint32_t tensor, uint32_t chunk) {
  return (static_cast<uint64_t>(tensor) << 32) | chunk;
}

// Keeps, of the records `packed` holds more than once, the one in the latest pack (a writer that
// writes an address again means the last content); packs are in writing order.
void DropSuperseded(PackedSeq& packed) {
  std::set<uint64_t> seen;
  for (auto pack = packed.packs.rbegin(); pack != packed.packs.rend(); ++pack) {
    std::vector<PackMember> kept;
    for (auto m = pack->members.rbegin(); m != pack->members.rend(); ++m) {
      if (seen.insert(Address(m->tensor, m->chunk)).second) kept.push_back(*m);
    }
    std::reverse(kept.begin(), kept.end());
    pack->members = std::move(kept);
  }
}

// Removes the members of `tensors` (every member when null) from `packed`.
void DropTensors(PackedSeq& packed, const std::vector<uint32_t>* chunk_counts) {
  for (PackedSeq::Pack& pack : packed.packs) {
    std::erase_if(pack.members, [&](const PackMember& m) {
      return chunk_counts == nullptr ||
             (m.tensor < chunk_counts->size() && (*chunk_counts)[m.tensor] > 0);
    });
  }
}

std::set<uint64_t> Addresses(const PackedSeq& packed) {
  std::set<uint64_t> out;
  for (const PackedSeq::Pack& pack : packed.packs) {
    for (const PackMember& m : pack.members) out.insert(Address(m.tensor, m.chunk));
  }
  return out;
}

}  // namespace

ModelPacks::ModelPacks(std::string model, uint64_t pack_bytes, Clock::duration grace)
    : model_(std::move(model)), pack_bytes_(pack_bytes), grace_(grace) {}

std::vector<ModelPacks::FullPack> ModelPacks::Add(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                                  std::string_view record) {
  std::lock_guard lock(mu_);
  std::vector<FullPack> full;
  if (open_ && (open_->seq != seq ||
                (!open_->members.empty() && open_->bytes.size() + record.size() > pack_bytes_))) {
    full.push_back(CloseLocked());
  }
  if (!open_) open_ = OpenPack{seq, RandomId(), {}, {}, {}};
  const PackMember member{tensor, chunk, open_->bytes.size(), static_cast<uint32_t>(record.size())};
  auto [where, added] = open_->where.try_emplace(Address(tensor, chunk), open_->members.size());
  if (added) {
    open_->members.push_back(member);
  } else {
    open_->members[where->second] = member;  // written again: the earlier bytes are dead
  }
  open_->bytes.append(record);
  if (open_->bytes.size() >= pack_bytes_) full.push_back(CloseLocked());
  return full;
}

std::optional<ModelPacks::FullPack> ModelPacks::Close() {
  std::lock_guard lock(mu_);
  if (!open_) return std::nullopt;
  return CloseLocked();
}

ModelPacks::FullPack ModelPacks::CloseLocked() {
  OpenPack pack = std::move(*open_);
  open_.reset();
  std::sort(pack.members.begin(), pack.members.end(),
            [](const PackMember& a, const PackMember& b) { return a.offset < b.offset; });
  FullPack full{s3_layout::PackKey(model_, pack.seq, pack.id), std::move(pack.bytes)};
  full.bytes.append(s3_layout::EncodePackFooter(pack.members));
  written_[pack.seq].packs.push_back({pack.id, std::move(pack.members)});
  return full;
}

std::vector<std::string> ModelPacks::Discard(const ChunkSet& set) {
  std::lock_guard lock(mu_);
  const std::vector<uint32_t>* tensors = set.some_tensors ? &set.chunk_counts : nullptr;
  if (open_ && open_->seq == set.seq) {
    PackedSeq open{{{open_->id, open_->members}}};
    DropTensors(open, tensors);
    open_->members = std::move(open.packs[0].members);
    open_->where.clear();
    for (size_t i = 0; i < open_->members.size(); ++i) {
      open_->where[Address(open_->members[i].tensor, open_->members[i].chunk)] = i;
    }
    if (open_->members.empty()) open_.reset();
  }
  std::vector<std::string> dead;
  auto written = written_.find(set.seq);
  if (written == written_.end()) return dead;
  DropTensors(written->second, tensors);
  std::erase_if(written->second.packs, [&](const PackedSeq::Pack& pack) {
    if (!pack.members.empty()) return false;
    dead.push_back(s3_layout::PackKey(model_, set.seq, pack.id));
    return true;
  });
  if (written->second.packs.empty()) written_.erase(written);
  return dead;
}

std::optional<ModelPacks::Location> ModelPacks::Find(uint64_t seq, uint32_t tensor,
                                                     uint32_t chunk) const {
  std::lock_guard lock(mu_);
  PruneLocked();
  if (open_ && open_->seq == seq) {
    if (auto it = open_->where.find(Address(tensor, chunk)); it != open_->where.end()) {
      const PackMember& m = open_->members[it->second];
      Location at;
      at.open = true;
      at.bytes = open_->bytes.substr(m.offset, m.length);
      return at;
    }
  }
  if (auto written = written_.find(seq); written != written_.end()) {
    const auto& packs = written->second.packs;
    for (auto pack = packs.rbegin(); pack != packs.rend(); ++pack) {
      for (const PackMember& m : pack->members) {
        if (m.tensor != tensor || m.chunk != chunk) continue;
        Location at;
        at.key = s3_layout::PackKey(model_, seq, pack->id);
        at.offset = m.offset;
        at.length = m.length;
        at.block = {m.offset, m.length};
        at.uncommitted = true;
        return at;
      }
    }
  }
  if (auto committed = committed_.find(seq); committed != committed_.end()) {
    if (auto at = FindIn(seq, committed->second, tensor, chunk)) return at;
  }
  // A reader that started before a commit made the record unreachable.
  for (auto retired = retired_.rbegin(); retired != retired_.rend(); ++retired) {
    if (retired->seq != seq) continue;
    if (auto at = FindIn(seq, retired->index, tensor, chunk)) return at;
  }
  return std::nullopt;
}

std::optional<ModelPacks::Location> ModelPacks::FindIn(uint64_t seq, const SeqIndex& index,
                                                       uint32_t tensor, uint32_t chunk) const {
  const SeqIndex::Slot* slot = index.Find(tensor, chunk);
  if (slot == nullptr) return std::nullopt;
  const PackedSeq::Pack& pack = index.packed.packs[slot->pack];
  const PackMember& m = pack.members[slot->member];
  Location at;
  at.key = s3_layout::PackKey(model_, seq, pack.id);
  at.offset = m.offset;
  at.length = m.length;
  at.block = index.blocks[slot->pack][index.block_of_member[slot->pack][slot->member]];
  return at;
}

ModelPacks::Change ModelPacks::Plan(const std::vector<ChunkSet>& new_seqs,
                                    const std::vector<ChunkSet>& unreachable, bool whole_model,
                                    std::vector<StoreBackend::ChunkAddress>* unpacked) const {
  std::lock_guard lock(mu_);
  Change change;
  change.whole_model = whole_model;
  std::map<uint64_t, PackedSeq> work;  // the seqs the change touches, as they will be
  const auto touch = [&](uint64_t seq) -> PackedSeq& {
    auto [it, inserted] = work.try_emplace(seq);
    if (inserted) {
      if (auto c = committed_.find(seq); c != committed_.end()) it->second = c->second.packed;
    }
    return it->second;
  };
  for (const ChunkSet& listed : new_seqs) {
    auto written = written_.find(listed.seq);
    if (written == written_.end()) continue;
    change.attached.push_back(listed.seq);
    PackedSeq& packed = touch(listed.seq);
    for (PackedSeq::Pack pack : written->second.packs) {
      std::erase_if(pack.members, [&](const PackMember& m) {
        return m.tensor >= listed.chunk_counts.size() || m.chunk >= listed.chunk_counts[m.tensor];
      });
      packed.packs.push_back(std::move(pack));
    }
    DropSuperseded(packed);
  }
  for (const ChunkSet& set : unreachable) {
    const bool indexed = committed_.count(set.seq) || work.count(set.seq);
    PackedSeq* packed = indexed ? &touch(set.seq) : nullptr;
    const std::set<uint64_t> held = packed ? Addresses(*packed) : std::set<uint64_t>();
    for (uint32_t t = 0; t < set.chunk_counts.size(); ++t) {
      for (uint32_t c = 0; c < set.chunk_counts[t]; ++c) {
        if (!held.count(Address(t, c))) unpacked->push_back({set.seq, t, c});
      }
    }
    if (packed) DropTensors(*packed, set.some_tensors ? &set.chunk_counts : nullptr);
  }
  if (whole_model) {
    for (const auto& [seq, index] : committed_) DropTensors(touch(seq), nullptr);
    for (const auto& [seq, written] : written_) {
      if (work.count(seq)) continue;
      for (const PackedSeq::Pack& pack : written.packs) {
        change.dead.push_back(s3_layout::PackKey(model_, seq, pack.id));
      }
    }
  }
  for (auto& [seq, packed] : work) {
    std::erase_if(packed.packs, [&, seq = seq](const PackedSeq::Pack& pack) {
      if (!pack.members.empty()) return false;
      change.dead.push_back(s3_layout::PackKey(model_, seq, pack.id));
      return true;
    });
    if (packed.packs.empty()) {
      if (committed_.count(seq)) change.removals.insert(s3_layout::PackIndexKey(seq));
      change.seqs[seq] = std::nullopt;
    } else {
      change.sets[s3_layout::PackIndexKey(seq)] = s3_layout::EncodePackedSeq(packed);
      change.seqs[seq] = std::move(packed);
    }
  }
  return change;
}

void ModelPacks::Apply(const Change& change) {
  std::lock_guard lock(mu_);
  for (const uint64_t seq : change.attached) written_.erase(seq);
  if (change.whole_model) {
    written_.clear();
    open_.reset();  // a push that failed before it wrote it: nothing refers to it
  }
  for (const auto& [seq, packed] : change.seqs) SetCommitted(seq, packed);
}

void ModelPacks::Forget(const std::vector<uint64_t>& seqs) {
  std::lock_guard lock(mu_);
  for (const uint64_t seq : seqs) written_.erase(seq);
}

void ModelPacks::Prune() {
  std::lock_guard lock(mu_);
  PruneLocked();
}

void ModelPacks::PruneLocked() const {
  const Clock::time_point now = Clock::now();
  while (!retired_.empty() && retired_.front().until <= now) retired_.pop_front();
}

void ModelPacks::SetCommitted(uint64_t seq, std::optional<PackedSeq> packed) {
  PruneLocked();
  const Clock::time_point now = Clock::now();
  auto old = committed_.find(seq);
  if (old != committed_.end()) {
    if (packed && s3_layout::EncodePackedSeq(*packed) == old->second.encoded) return;
    retired_.push_back({seq, std::move(old->second), now + grace_});
    committed_.erase(old);
  }
  if (packed) committed_[seq] = SeqIndex::Of(std::move(*packed));
}

Status ModelPacks::Replace(const RecordMap& records) {
  std::map<uint64_t, PackedSeq> replacing;
  for (const auto& [key, value] : records) {
    const auto seq = s3_layout::PackIndexSeq(key);
    if (!seq) continue;
    CKPT_ASSIGN_OR_RETURN(replacing[*seq], s3_layout::DecodePackedSeq(value));
  }
  std::lock_guard lock(mu_);
  std::vector<uint64_t> gone;
  for (const auto& [seq, index] : committed_) {
    if (!replacing.count(seq)) gone.push_back(seq);
  }
  for (const uint64_t seq : gone) SetCommitted(seq, std::nullopt);
  for (auto& [seq, packed] : replacing) SetCommitted(seq, std::move(packed));
  return Status::Ok();
}

Status ModelPacks::ApplyRecords(const RecordMap& sets, const std::set<std::string>& removals) {
  std::lock_guard lock(mu_);
  for (const std::string& key : removals) {
    if (const auto seq = s3_layout::PackIndexSeq(key)) SetCommitted(*seq, std::nullopt);
  }
  for (const auto& [key, value] : sets) {
    const auto seq = s3_layout::PackIndexSeq(key);
    if (!seq) continue;
    CKPT_ASSIGN_OR_RETURN(PackedSeq packed, s3_layout::DecodePackedSeq(value));
    SetCommitted(*seq, std::move(packed));
  }
  return Status::Ok();
}

RecordMap ModelPacks::Records() const {
  std::lock_guard lock(mu_);
  RecordMap records;
  for (const auto& [seq, index] : committed_) {
    records[s3_layout::PackIndexKey(seq)] = index.encoded;
  }
  return records;
}

bool ModelPacks::Known(uint64_t seq, uint64_t id) const {
  std::lock_guard lock(mu_);
  PruneLocked();
  if (open_ && open_->seq == seq && open_->id == id) return true;
  const auto has = [id](const PackedSeq& packed) {
    return std::any_of(packed.packs.begin(), packed.packs.end(),
                       [id](const PackedSeq::Pack& pack) { return pack.id == id; });
  };
  if (auto w = written_.find(seq); w != written_.end() && has(w->second)) return true;
  auto c = committed_.find(seq);
  if (c != committed_.end() && has(c->second.packed)) return true;
  return std::any_of(retired_.begin(), retired_.end(),
                     [&](const Retired& r) { return r.seq == seq && has(r.index.packed); });
}

std::vector<ModelPacks::CommittedPack> ModelPacks::Committed(uint64_t seq_end) const {
  std::lock_guard lock(mu_);
  std::vector<CommittedPack> out;
  for (auto it = committed_.begin(); it != committed_.end() && it->first < seq_end; ++it) {
    for (const PackedSeq::Pack& pack : it->second.packed.packs) {
      out.push_back({it->first, s3_layout::PackKey(model_, it->first, pack.id), pack.members});
    }
  }
  return out;
}

ModelPacks::SeqIndex ModelPacks::SeqIndex::Of(PackedSeq packed) {
  SeqIndex index;
  index.encoded = s3_layout::EncodePackedSeq(packed);
  for (uint32_t p = 0; p < packed.packs.size(); ++p) {
    auto& members = packed.packs[p].members;
    std::sort(members.begin(), members.end(),
              [](const PackMember& a, const PackMember& b) { return a.offset < b.offset; });
    for (uint32_t m = 0; m < members.size(); ++m) {
      index.slots.push_back({members[m].tensor, members[m].chunk, p, m});
    }
    std::vector<uint32_t> block_of_member;
    index.blocks.push_back(s3_layout::PlanReadBlocks(members, &block_of_member));
    index.block_of_member.push_back(std::move(block_of_member));
  }
  std::sort(index.slots.begin(), index.slots.end(), [](const Slot& a, const Slot& b) {
    return Address(a.tensor, a.chunk) < Address(b.tensor, b.chunk);
  });
  index.packed = std::move(packed);
  return index;
}

const ModelPacks::SeqIndex::Slot* ModelPacks::SeqIndex::Find(uint32_t tensor,
                                                             uint32_t chunk) const {
  const uint64_t address = Address(tensor, chunk);
  auto it = std::lower_bound(slots.begin(), slots.end(), address, [](const Slot& s, uint64_t a) {
    return Address(s.tensor, s.chunk) < a;
  });
  if (it == slots.end() || Address(it->tensor, it->chunk) != address) return nullptr;
  return &*it;
}

}  // namespace ckpt
