// The byte layout of lossy payloads (format.h).
#include "lossy/format.h"

#include <bit>
#include <cmath>
#include <limits>
#include <string>

namespace ckpt::lossy {
namespace {

void PutF64(ByteWriter* out, double v) { out->PutU64(std::bit_cast<uint64_t>(v)); }

Status GetF64(ByteReader* in, double* v) {
  uint64_t bits = 0;
  CKPT_RETURN_IF_ERROR(in->GetU64(&bits));
  *v = std::bit_cast<double>(bits);
  return Status::Ok();
}

}  // namespace

uint8_t PayloadHeader::Version() const {
  return log_offset ? kPayloadVersionLogOffset
         : low_rank ? kPayloadVersionLowRank
         : !lattice ? kPayloadVersion
         : history  ? kPayloadVersionLatticeHistory
                    : kPayloadVersionLattice;
}

uint8_t PayloadHeader::Flags() const {
  return (delta ? kFlagDelta : 0) | (history ? kFlagHistory : 0) |
         (four_states ? kFlagFourStates : 0) | (lattice ? kFlagLattice : 0) |
         (explicit_history ? kFlagExplicitHistory : 0) | (low_rank ? kFlagLowRank : 0);
}

void PayloadHeader::EncodeTo(ByteWriter* out) const {
  out->PutU8(Version());
  out->PutU8(static_cast<uint8_t>(quantizer));
  out->PutU8(static_cast<uint8_t>(dtype));
  out->PutU8(context_model);
  out->PutU8(Flags());
  PutF64(out, bound);
  out->PutU64(elements);
  out->PutU32(exact);
  out->PutU32(extra_bytes);
}

Status PayloadPrologue::DecodeFrom(ByteReader* in) {
  CKPT_RETURN_IF_ERROR(header.DecodeFrom(in));
  quantizers.kind = header.quantizer;
  return quantizers.DecodeParamsFrom(in, header);
}

Status PayloadHeader::DecodeFrom(ByteReader* in) {
  uint8_t version = 0, quantizer_tag = 0, dtype_tag = 0, flags = 0;
  CKPT_RETURN_IF_ERROR(in->GetU8(&version));
  if (version != kPayloadVersion && version != kPayloadVersionLattice &&
      version != kPayloadVersionLatticeHistory && version != kPayloadVersionLowRank &&
      version != kPayloadVersionLogOffset) {
    return Status::DataLoss("lossy payload version " + std::to_string(version) +
                            " is not supported (written by a newer ckptd?)");
  }
  CKPT_RETURN_IF_ERROR(in->GetU8(&quantizer_tag));
  CKPT_RETURN_IF_ERROR(in->GetU8(&dtype_tag));
  CKPT_RETURN_IF_ERROR(in->GetU8(&context_model));
  CKPT_RETURN_IF_ERROR(in->GetU8(&flags));
  CKPT_RETURN_IF_ERROR(GetF64(in, &bound));
  CKPT_RETURN_IF_ERROR(in->GetU64(&elements));
  CKPT_RETURN_IF_ERROR(in->GetU32(&exact));
  CKPT_RETURN_IF_ERROR(in->GetU32(&extra_bytes));
  if (quantizer_tag < static_cast<uint8_t>(Quantizer::kUniform) ||
      quantizer_tag > static_cast<uint8_t>(Quantizer::kLog)) {
    return Status::DataLoss("lossy payload: unknown quantizer " + std::to_string(quantizer_tag));
  }
  if (context_model != kContextModelPrevious2 && context_model != kContextModelNone &&
      context_model != kContextModelHistory) {
    return Status::DataLoss("lossy payload: unknown context model " +
                            std::to_string(context_model));
  }
  auto d = DTypeFromTag(dtype_tag);
  if (!d) return Status::DataLoss("lossy payload: unknown dtype tag");
  quantizer = static_cast<Quantizer>(quantizer_tag);
  dtype = *d;
  delta = flags & kFlagDelta;
  history = flags & kFlagHistory;
  four_states = flags & kFlagFourStates;
  lattice = flags & kFlagLattice;
  explicit_history = flags & kFlagExplicitHistory;
  low_rank = flags & kFlagLowRank;
  if (flags & ~kKnownFlags) {
    return Status::DataLoss("lossy payload: unknown flags " + std::to_string(flags));
  }
  log_offset = version == kPayloadVersionLogOffset;
  if (log_offset) {
    if (quantizer != Quantizer::kLog || !delta || lattice || history || explicit_history ||
        low_rank) {
      return Status::DataLoss("lossy payload: flags do not match payload version");
    }
  } else if (version == kPayloadVersionLowRank) {
    if (!low_rank || !lattice || !delta || explicit_history) {
      return Status::DataLoss("lossy payload: flags do not match payload version");
    }
  } else if (low_rank || lattice != (version != kPayloadVersion) ||
             (lattice && history) != (version == kPayloadVersionLatticeHistory) ||
             (explicit_history && version != kPayloadVersionLatticeHistory)) {
    return Status::DataLoss("lossy payload: flags do not match payload version");
  }
  if (lattice && quantizer != Quantizer::kUniform) {
    return Status::DataLoss("lossy payload: lattice flag on a non-lattice quantizer");
  }
  if (history && *d != DType::kF32 && *d != DType::kF64) {
    return Status::DataLoss("lossy payload: element history on a dtype that cannot carry it");
  }
  if (context_model == kContextModelHistory && !(history && delta)) {
    return Status::DataLoss("lossy payload: history contexts without a history delta");
  }
  return Status::Ok();
}

void QuantizerSet::EncodeParamsTo(ByteWriter* out) const {
  switch (kind) {
    case Quantizer::kLog:
      PutF64(out, log.step);
      if (log.mode == LogQuantizer::Mode::kRatio && log.offset != 0) {
        out->PutU8(kLogModeRatioOffset);
        out->PutU32(static_cast<uint32_t>(log.k0));
        PutF64(out, log.offset);
      } else {
        out->PutU8(static_cast<uint8_t>(log.mode));
        out->PutU32(static_cast<uint32_t>(log.k0));
      }
      break;
    case Quantizer::kUniform:
      PutF64(out, uniform.step);
      break;
    case Quantizer::kExponent: {
      out->PutU32(static_cast<uint32_t>(exponent.e0));
      out->PutU16(static_cast<uint16_t>(exponent.values.size()));
      for (size_t z = 1; z < exponent.values.size(); ++z) PutF64(out, exponent.values[z]);
      break;
    }
    case Quantizer::kFloat:
      PutF64(out, floating.scale);
      out->PutU8(static_cast<uint8_t>(floating.exponent_bits));
      out->PutU8(static_cast<uint8_t>(floating.mantissa_bits));
      break;
    case Quantizer::kCosine:
      PutF64(out, cosine.norm);
      out->PutU8(static_cast<uint8_t>(cosine.level_bits));
      break;
    case Quantizer::kAuto:
      break;
  }
}

Status QuantizerSet::DecodeParamsFrom(ByteReader* in, const PayloadHeader& header) {
  switch (kind) {
    case Quantizer::kLog: {
      double step = 0, offset = 0;
      uint8_t mode = 0;
      uint32_t k0 = 0;
      CKPT_RETURN_IF_ERROR(GetF64(in, &step));
      CKPT_RETURN_IF_ERROR(in->GetU8(&mode));
      CKPT_RETURN_IF_ERROR(in->GetU32(&k0));
      // Version 5 payloads, and only they, are ratio mode with an offset.
      const bool with_offset = mode == kLogModeRatioOffset;
      if (with_offset != header.log_offset) {
        return Status::DataLoss("lossy payload: log quantizer mode does not match its version");
      }
      if (with_offset) CKPT_RETURN_IF_ERROR(GetF64(in, &offset));
      if (!(step > 0) || !(step < 64) || !(std::abs(offset) <= 0.5) ||
          (mode != static_cast<uint8_t>(LogQuantizer::Mode::kRatio) &&
           mode != static_cast<uint8_t>(LogQuantizer::Mode::kAbsolute) && !with_offset)) {
        return Status::DataLoss("lossy payload: bad log quantizer parameters");
      }
      log.SetStep(step);
      log.mode = with_offset ? LogQuantizer::Mode::kRatio : static_cast<LogQuantizer::Mode>(mode);
      log.k0 = static_cast<int32_t>(k0);
      log.offset = offset;
      log.ResetCache();
      return Status::Ok();
    }
    case Quantizer::kUniform: {
      double step = 0;
      CKPT_RETURN_IF_ERROR(GetF64(in, &step));
      uniform = UniformQuantizer(step);
      return Status::Ok();
    }
    case Quantizer::kExponent: {
      uint32_t e0 = 0;
      uint16_t count = 0;
      CKPT_RETURN_IF_ERROR(in->GetU32(&e0));
      CKPT_RETURN_IF_ERROR(in->GetU16(&count));
      if (count == 0 || count > 2 * ExponentQuantizer::kMaxBuckets + 1) {
        return Status::DataLoss("lossy payload: bad exponent table size");
      }
      exponent.e0 = static_cast<int32_t>(e0);
      exponent.values.assign(count, 0.0);
      for (size_t z = 1; z < count; ++z) CKPT_RETURN_IF_ERROR(GetF64(in, &exponent.values[z]));
      return Status::Ok();
    }
    case Quantizer::kFloat: {
      uint8_t e = 0, m = 0;
      CKPT_RETURN_IF_ERROR(GetF64(in, &floating.scale));
      CKPT_RETURN_IF_ERROR(in->GetU8(&e));
      CKPT_RETURN_IF_ERROR(in->GetU8(&m));
      if (e < 1 || e > 8 || e + m > FloatQuantizer::kMaxBits) {
        return Status::DataLoss("lossy payload: bad float format");
      }
      floating.exponent_bits = e;
      floating.mantissa_bits = m;
      floating.BuildTable();
      return Status::Ok();
    }
    case Quantizer::kCosine: {
      uint8_t bits = 0;
      CKPT_RETURN_IF_ERROR(GetF64(in, &cosine.norm));
      CKPT_RETURN_IF_ERROR(in->GetU8(&bits));
      if (bits < 1 || bits > CosineQuantizer::kMaxLevelBits) {
        return Status::DataLoss("lossy payload: bad cosine level count");
      }
      cosine.level_bits = bits;
      cosine.BuildTable();
      return Status::Ok();
    }
    case Quantizer::kAuto:
      break;
  }
  return Status::DataLoss("lossy payload: unknown quantizer");
}

size_t QuantizerSet::ParamBytes() const {
  ByteWriter w;
  EncodeParamsTo(&w);
  return w.data().size();
}

size_t EncodeLowRankShiftTo(const LowRankShift& shift, ByteWriter* out) {
  std::string factors;
  shift.Write(&factors);
  out->PutU32(shift.rows);
  out->PutU32(shift.cols);
  out->PutLengthPrefixed(factors);
  return factors.size();
}

Status DecodeLowRankShiftFrom(ByteReader* in, uint64_t elements, uint64_t out_elements,
                              LowRankShift* shift) {
  uint32_t rows = 0, cols = 0;
  std::string factors;
  CKPT_RETURN_IF_ERROR(in->GetU32(&rows));
  CKPT_RETURN_IF_ERROR(in->GetU32(&cols));
  CKPT_RETURN_IF_ERROR(in->GetLengthPrefixed(&factors));
  if (elements != out_elements || uint64_t{rows} * cols != elements) {
    return Status::DataLoss("lossy payload: low-rank matrix shape differs from chunk length");
  }
  const auto* next = reinterpret_cast<const uint8_t*>(factors.data());
  const uint8_t* end = next + factors.size();
  CKPT_RETURN_IF_ERROR(LowRankShift::Read(next, end, rows, cols, shift));
  if (next != end) return Status::DataLoss("lossy payload: trailing bytes after low-rank shift");
  return Status::Ok();
}

Status EncodeSectionsTo(const PayloadHeader& header, std::string_view exact, std::string_view extra,
                        std::string_view explicit_history, ByteWriter* out) {
  out->PutBytes(exact);
  out->PutBytes(extra);
  if (header.explicit_history) {
    if (explicit_history.size() > std::numeric_limits<uint32_t>::max()) {
      return Status::InvalidArgument("lossy codec: chunk too large");
    }
    out->PutU32(static_cast<uint32_t>(explicit_history.size()));
    out->PutBytes(explicit_history);
  }
  return Status::Ok();
}

Status DecodeSectionsFrom(ByteReader* in, const PayloadHeader& header, size_t element_size,
                          PayloadSections* sections) {
  if (header.exact > header.elements) {
    return Status::DataLoss("lossy payload: exact count out of range");
  }
  CKPT_RETURN_IF_ERROR(in->GetSpan(uint64_t{header.exact} * element_size, &sections->exact));
  CKPT_RETURN_IF_ERROR(in->GetSpan(header.extra_bytes, &sections->extra));
  if (header.explicit_history) {
    uint32_t explicit_bytes = 0;
    CKPT_RETURN_IF_ERROR(in->GetU32(&explicit_bytes));
    CKPT_RETURN_IF_ERROR(in->GetSpan(explicit_bytes, &sections->explicit_history));
  }
  return in->GetSpan(in->remaining(), &sections->symbols);
}

}  // namespace ckpt::lossy
