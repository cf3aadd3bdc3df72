// ckptd._native: the codec of the edge for the Python client (ckptd/edge.py). The client keeps
// its own HTTP; this module codes a checkpoint by the daemon's plan (Encoder, read as the body
// of the PUT), decodes an encoded pull (PullDecoder, fed from the GET), and keeps the per-model
// references the C++ client keeps (the same files, so `ckpt` and Python share a directory).
// Coding and decoding run without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/base/model_name.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "ckpt/codec/encoded_pull.h"
#include "encoded_shard_push.h"
#include "encoding_stream.h"
#include "held_reference.h"

namespace py = pybind11;

namespace ckpt {
namespace {

// What a failed Status raises: ckptd._native.Error, with `code` the status code's name
// ("INVALID_ARGUMENT", "DATA_LOSS", ...). Made once, kept for the life of the process.
PyObject* error_type = nullptr;

[[noreturn]] void Raise(const Status& status) {
  py::object error = py::handle(error_type)(status.message());
  error.attr("code") = std::string(StatusCodeName(status.code()));
  PyErr_SetObject(error_type, error.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOr(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

// A contiguous buffer of a Python object (bytes, memoryview, numpy array, mmap), held for the
// lifetime of this object. Move-only; released with the GIL held (Python destroys it so).
class HeldBuffer {
 public:
  explicit HeldBuffer(const py::handle& object) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_SIMPLE) != 0) throw py::error_already_set();
    held_ = true;
  }
  HeldBuffer(HeldBuffer&& other) noexcept : view_(other.view_), held_(other.held_) {
    other.held_ = false;
  }
  HeldBuffer& operator=(HeldBuffer&&) = delete;
  ~HeldBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// A safetensors body on disk, mapped, as a CheckpointView.
struct MappedCheckpoint {
  MappedFile file;
  CheckpointView view;

  static std::unique_ptr<MappedCheckpoint> Open(const std::string& path) {
    MappedFile file = ValueOr(MappedFile::Open(path));
    auto view = CheckpointView::Parse(file.bytes());
    if (!view.ok()) Raise(view.status().WithContext("'" + path + "'"));
    return std::unique_ptr<MappedCheckpoint>(
        new MappedCheckpoint{std::move(file), std::move(view).value()});
  }
};

// Codes a checkpoint by a plan on threads of its own; read() hands out the encoded body.
// Members are destroyed in reverse order: the stream (its thread joined) before what it reads.
class Encoder {
 public:
  Encoder(const std::string& plan_json, const py::list& parts,
          const std::optional<std::string>& reference_path, bool check_reference, int threads,
          const std::optional<std::string>& restored_path)
      : plan_(ValueOr(CodingPlan::FromJson(plan_json))) {
    if (parts.empty()) throw py::value_error("parts: the checkpoint's header, then its tensors");
    for (const py::handle part : parts) buffers_.emplace_back(part);
    if (buffers_.size() == 1) {
      checkpoint_.emplace(ValueOr(CheckpointView::Parse(buffers_[0].bytes())));
    } else {
      std::vector<std::span<const uint8_t>> tensors;
      for (size_t i = 1; i < buffers_.size(); ++i) tensors.push_back(buffers_[i].bytes());
      checkpoint_.emplace(
          ValueOr(CheckpointView::FromParts(buffers_[0].bytes(), std::move(tensors))));
    }
    if (reference_path) reference_ = MappedCheckpoint::Open(*reference_path);
    if (!check_reference && plan_.base) plan_.base->restored_sha256.clear();
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    stream_ = std::make_unique<EncodingStream>(plan_, *checkpoint_,
                                               reference_ ? &reference_->view : nullptr, threads,
                                               restored_path.value_or(""));
    Check(stream_->Start());
  }

  // Up to `size` bytes of the encoded body; b"" at its end.
  py::bytes Read(size_t size) {
    CheckOpen();
    std::string buffer(size, '\0');
    Result<size_t> n = size_t{0};
    {
      py::gil_scoped_release unlocked;
      n = stream_->Read(buffer.data(), buffer.size());
    }
    buffer.resize(ValueOr(std::move(n)));
    return py::bytes(buffer);
  }

  // Waits for the encoder (stopping it if the body was not read to its end): what it coded.
  py::dict Finish() {
    CheckOpen();
    Result<EdgeEncoding> coded = Status::Internal("not coded");
    {
      py::gil_scoped_release unlocked;
      coded = stream_->Finish();
    }
    const EdgeEncoding e = ValueOr(std::move(coded));
    finished_ = true;
    py::dict out;
    out["raw_bytes"] = e.raw_bytes;
    out["encoded_bytes"] = e.encoded_bytes;
    out["pushed_sha256"] = e.pushed_sha256;
    out["restored_sha256"] = e.restored_sha256;
    return out;
  }

  void KeepRestoredAs(const std::string& path) {
    CheckOpen();
    if (!finished_) throw py::value_error("keep_restored_as needs a successful finish() first");
    reference_.reset();  // the reference may be the file replaced
    Check(stream_->KeepRestoredAs(path));
  }

  // Stops the encoder, removes the restored body unless kept, and lets go of the checkpoint's
  // buffers (a file's mapping can be closed then). Idempotent.
  void Close() {
    {
      py::gil_scoped_release unlocked;
      stream_.reset();
    }
    reference_.reset();
    checkpoint_.reset();
    buffers_.clear();
  }

 private:
  void CheckOpen() const {
    if (!stream_) throw py::value_error("the encoder is closed");
  }

  CodingPlan plan_;
  std::vector<HeldBuffer> buffers_;
  std::optional<CheckpointView> checkpoint_;
  std::unique_ptr<MappedCheckpoint> reference_;
  std::unique_ptr<EncodingStream> stream_;
  bool finished_ = false;  // Finish succeeded: the encoder thread is done with the reference
};

// Decodes an encoded pull body, fed as it arrives, into a file (docs/format.md).
class PullDecoder {
 public:
  PullDecoder(const std::optional<std::string>& since_path, const std::string& out_path,
              int threads)
      : out_path_(out_path), out_(out_path, std::ios::binary | std::ios::trunc) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (!out_) Raise(Status::IoError("cannot write '" + out_path + "'"));
    if (since_path) since_ = MappedCheckpoint::Open(*since_path);
    decoder_ = std::make_unique<EncodedPullDecoder>(
        since_ ? &since_->view : nullptr,
        [this](std::string_view bytes) {
          out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
          return out_ ? Status::Ok() : Status::IoError("writing '" + out_path_ + "' failed");
        },
        threads);
  }

  void Feed(const py::buffer& bytes) {
    const HeldBuffer held(bytes);
    Status status;
    {
      py::gil_scoped_release unlocked;
      status = decoder_->Feed(held.bytes());
    }
    Check(status);
  }

  // The body ended: checks it was whole and its digest. {version, sha256, restored_bytes,
  // verified, since_version}: verified is false for a part of a version, which announces no digest
  // (its chunks were checked by their records' checksums).
  py::dict Finish() {
    Check(decoder_->Finish());
    out_.close();
    if (!out_) Raise(Status::IoError("writing '" + out_path_ + "' failed"));
    py::dict out;
    out["version"] = decoder_->version();
    out["sha256"] = decoder_->sha256();
    out["restored_bytes"] = decoder_->restored_bytes();
    out["verified"] = decoder_->whole_version();
    out["since_version"] = decoder_->since_version();
    return out;
  }

 private:
  std::string out_path_;
  std::ofstream out_;
  std::unique_ptr<MappedCheckpoint> since_;
  std::unique_ptr<EncodedPullDecoder> decoder_;
};

py::dict HeldReferenceDict(const std::string& dir, const std::string& model) {
  const HeldReference held = HeldReferenceOf(dir, model);
  py::dict out;
  out["path"] = held.path;
  out["version"] = held.version;
  out["sha256"] = held.restored_sha256;
  out["lock"] = held.lock;
  return out;
}

}  // namespace
}  // namespace ckpt

PYBIND11_MODULE(_native, m) {
  using namespace ckpt;
  m.doc() = "ckptd's codec for the Python client: encoded pushes and pulls (ckptd/edge.py)";
  error_type = PyErr_NewException("ckptd._native.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(error_type);
  m.attr("ENCODED_PUSH_MEDIA_TYPE") = std::string(kEncodedBodyMediaType);
  m.attr("ENCODED_PULL_MEDIA_TYPE") = std::string(kEncodedPullMediaType);
  m.attr("ENCODED_SHARD_MEDIA_TYPE") = std::string(kEncodedShardMediaType);

  py::class_<Encoder>(m, "Encoder")
      .def(py::init<const std::string&, const py::list&, const std::optional<std::string>&, bool,
                    int, const std::optional<std::string>&>(),
           py::arg("plan_json"), py::arg("parts"), py::arg("reference_path"),
           py::arg("check_reference"), py::arg("threads"), py::arg("restored_path"))
      .def("read", &Encoder::Read, py::arg("size") = 1 << 20)
      .def("finish", &Encoder::Finish)
      .def("keep_restored_as", &Encoder::KeepRestoredAs, py::arg("path"))
      .def("close", &Encoder::Close);

  py::class_<PullDecoder>(m, "PullDecoder")
      .def(py::init<const std::optional<std::string>&, const std::string&, int>(),
           py::arg("since_path"), py::arg("out_path"), py::arg("threads") = 0)
      .def("feed", &PullDecoder::Feed, py::arg("bytes"))
      .def("finish", &PullDecoder::Finish);

  m.def("held_reference", &HeldReferenceDict, py::arg("dir"), py::arg("model"),
        "{path, version, sha256, lock} of the reference kept for `model` in `dir` (version 0: "
        "none); `lock` is the file pushes and pulls hold (flock) while they use or replace it");
  m.def(
      "write_sidecar",
      [](const std::string& dir, const std::string& model, uint64_t version,
         const std::string& sha256) {
        Check(WriteSidecar(HeldReferenceOf(dir, model), version, sha256));
      },
      py::arg("dir"), py::arg("model"), py::arg("version"), py::arg("sha256"));
  m.def(
      "forget_sidecar",
      [](const std::string& dir, const std::string& model) {
        Check(ForgetSidecar(HeldReferenceOf(dir, model)));
      },
      py::arg("dir"), py::arg("model"),
      "removes the sidecar of `model`'s reference before the reference is replaced");
  m.def(
      "forget_other_rank_counts",
      [](const std::string& dir, const std::string& model, uint32_t world_size) {
        return ForgetOtherRankCounts(dir, model, world_size);
      },
      py::arg("dir"), py::arg("model"), py::arg("world_size"),
      "removes `model`'s rank references kept for another rank count than `world_size` (not "
      "those another process holds); returns how many");
  m.def("temporary_name_for", &TemporaryNameFor, py::arg("path"));
  m.def(
      "check_model_name", [](const std::string& model) { Check(ValidateModelName(model)); },
      py::arg("model"), "raises Error (INVALID_ARGUMENT) for a name the daemon refuses");
}
