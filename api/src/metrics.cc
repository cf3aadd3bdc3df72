#include "ckpt/api/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace ckpt::api {

struct ServerMetrics::Families {
  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Histogram>& latency;
  prometheus::Counter& bytes_in;
  prometheus::Counter& bytes_out;
};

namespace {

// Request latencies from 1 ms (health checks, listings) to 5 min (multi-GB pushes).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  return kBuckets;
}

}  // namespace

ServerMetrics::ServerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& requests = prometheus::BuildCounter()
                       .Name("ckptd_http_requests_total")
                       .Help("HTTP requests answered, by route, method and status")
                       .Register(*registry_);
  auto& latency = prometheus::BuildHistogram()
                      .Name("ckptd_http_request_duration_seconds")
                      .Help("Time from a request's headers to its last response byte, by route")
                      .Register(*registry_);
  auto& bytes = prometheus::BuildCounter()
                    .Name("ckptd_http_bytes_total")
                    .Help("Request and response body bytes, by direction")
                    .Register(*registry_);
  families_.reset(new Families{requests, latency, bytes.Add({{"direction", "in"}}),
                               bytes.Add({{"direction", "out"}})});
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::ObserveRequest(std::string_view route, std::string_view method, int status,
                                   uint64_t bytes_in, uint64_t bytes_out, double seconds) {
  families_->requests
      .Add({{"route", std::string(route)},
            {"method", std::string(method)},
            {"status", std::to_string(status)}})
      .Increment();
  families_->latency.Add({{"route", std::string(route)}}, LatencyBuckets()).Observe(seconds);
  families_->bytes_in.Increment(static_cast<double>(bytes_in));
  families_->bytes_out.Increment(static_cast<double>(bytes_out));
}

std::string ServerMetrics::Render(CheckpointStore& store) const {
  // The store's figures go into a registry of their own, built for this scrape: models that
  // were deleted simply do not appear.
  prometheus::Registry now;
  auto gauge = [&now](const std::string& name, const std::string& help) -> auto& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(now);
  };
  // A gauge without labels, set to `value`.
  auto set_gauge = [&gauge](const std::string& name, const std::string& help, double value) {
    gauge(name, help).Add({}).Set(value);
  };
  auto counter = [&now](const std::string& name, const std::string& help) -> auto& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(now);
  };
  auto& raw = gauge("ckptd_model_raw_bytes", "Sum of the raw (pushed) bytes of a model's versions");
  auto& stored = gauge("ckptd_model_stored_bytes",
                       "Payload bytes stored for a model (including data deleted versions leave "
                       "for later deltas)");
  auto& ratio = gauge("ckptd_model_compression_ratio", "raw_bytes / stored_bytes of a model");
  auto& versions = gauge("ckptd_model_versions", "Live versions of a model");
  auto models = store.ListModels();
  if (models.ok()) {
    for (const ModelInfo& m : *models) {
      const prometheus::Labels labels = {{"model", m.name}};
      raw.Add(labels).Set(static_cast<double>(m.raw_bytes));
      stored.Add(labels).Set(static_cast<double>(m.stored_bytes));
      versions.Add(labels).Set(static_cast<double>(m.version_count));
      if (m.stored_bytes > 0) {
        ratio.Add(labels).Set(static_cast<double>(m.raw_bytes) /
                              static_cast<double>(m.stored_bytes));
      }
    }
  }
  const StoreStats s = store.Stats();
  auto add_counter = [&](const std::string& name, const std::string& help, double value) {
    counter(name, help).Add({}).Increment(value);
  };
  set_gauge("ckptd_requests_waiting_for_model",
            "Requests waiting for their model's turn (a push or change to it in progress)",
            static_cast<double>(requests_waiting_.load(std::memory_order_relaxed)));
  add_counter("ckptd_pushes_total", "Committed pushes since start", static_cast<double>(s.pushes));
  add_counter("ckptd_push_raw_bytes_total", "Body bytes of committed pushes since start",
              static_cast<double>(s.push_raw_bytes));
  add_counter("ckptd_push_stored_bytes_total", "Bytes committed pushes added to the store",
              static_cast<double>(s.push_stored_bytes));
  add_counter("ckptd_codec_encode_seconds_total", "Codec time of pushes (encoding chunks)",
              s.encode_seconds);
  add_counter("ckptd_versions_deleted_total", "Versions deleted by DELETE since start",
              static_cast<double>(s.versions_deleted));
  add_counter("ckptd_retention_versions_deleted_total",
              "Versions deleted by retention passes since start",
              static_cast<double>(s.retention_versions_deleted));
  add_counter("ckptd_retention_tensors_dropped_total",
              "Tensors dropped from kept versions by retention's tensor rules since start",
              static_cast<double>(s.retention_tensors_dropped));
  add_counter("ckptd_gc_bytes_freed_total", "Stored bytes garbage collection removed",
              static_cast<double>(s.gc_bytes_freed));
  add_counter("ckptd_gc_versions_rebased_total", "Kept versions re-encoded by garbage collection",
              static_cast<double>(s.gc_versions_rebased));
  add_counter("ckptd_rearrangements_total",
              "Latest versions stored as keyframes, the version before as reverse deltas",
              static_cast<double>(s.rearrangements));
  add_counter("ckptd_restores_total", "Restore streams opened since start",
              static_cast<double>(s.restores));
  add_counter("ckptd_restore_links_decoded_total",
              "Stored chunk payloads restores decoded (delta chains replayed)",
              static_cast<double>(s.restore_links_decoded));
  add_counter("ckptd_pull_chunks_coded_total",
              "Chunk records coded for encoded pulls (not found coded already)",
              static_cast<double>(s.pull_chunks_coded));
  set_gauge("ckptd_rocksdb_sst_bytes", "Size of RocksDB's table files",
            static_cast<double>(s.sst_bytes));
  set_gauge("ckptd_rocksdb_blob_bytes", "Size of RocksDB's blob files",
            static_cast<double>(s.blob_bytes));
  set_gauge("ckptd_rocksdb_pending_compaction_bytes",
            "Bytes RocksDB estimates compactions must rewrite",
            static_cast<double>(s.pending_compaction_bytes));
  set_gauge("ckptd_rocksdb_running_compactions", "Compactions running now",
            static_cast<double>(s.running_compactions));
  if (s.space_known) {
    set_gauge("ckptd_data_directory_bytes",
              "Bytes of the data directory's files: stored + garbage + metadata",
              static_cast<double>(s.data_directory_bytes));
    set_gauge("ckptd_stored_bytes", "Chunk records the models store (their stored_bytes summed)",
              static_cast<double>(s.stored_bytes));
    set_gauge("ckptd_garbage_bytes",
              "Removed records whose space compactions and blob garbage collection give back",
              static_cast<double>(s.garbage_bytes));
    set_gauge("ckptd_metadata_bytes",
              "The rest of the data directory: table keys and indexes, the write-ahead log, the "
              "engine's files, sharded uploads",
              static_cast<double>(s.metadata_bytes));
  }
  const StoreHealthReport health = store.Health();
  set_gauge("ckptd_storage_free_bytes", "Free bytes on the data directory's volume",
            static_cast<double>(health.free_bytes));
  set_gauge(
      "ckptd_storage_reserved_bytes",
      "Free bytes pushes leave alone (storage.min_free_bytes): deletes and GC work inside them",
      static_cast<double>(health.reserved_bytes));
  auto& writes = gauge("ckptd_storage_writes",
                       "1 for the store's write state now: writable, reserve_reached (pushes "
                       "refused), suspended (every write, until the engine resumes), read_only");
  for (auto state : {StoreHealthReport::State::kWritable, StoreHealthReport::State::kReserveReached,
                     StoreHealthReport::State::kSuspended, StoreHealthReport::State::kReadOnly}) {
    writes.Add({{"state", std::string(StoreHealthStateName(state))}})
        .Set(health.state == state ? 1 : 0);
  }
  add_counter("ckptd_storage_engine_errors_total",
              "Storage engine errors (failed writes, syncs, flushes) since start",
              static_cast<double>(health.engine_errors));
  add_counter("ckptd_storage_recoveries_total",
              "Times writes resumed after a storage engine error, without a restart",
              static_cast<double>(health.recoveries));
  if (auto uploads = store.ListUploads(); uploads.ok()) {
    uint64_t received = 0;
    for (const ShardUploadInfo& u : *uploads) received += u.received_bytes;
    set_gauge("ckptd_uploads_in_progress", "Sharded uploads whose version is not committed yet",
              static_cast<double>(uploads->size()));
    set_gauge("ckptd_upload_received_bytes", "Bytes of the stored shards of those uploads",
              static_cast<double>(received));
  }
  if (s.cluster) {
    set_gauge("ckptd_cluster_models_owned", "Models whose write lease this daemon holds",
              static_cast<double>(s.models_owned));
    add_counter("ckptd_cluster_lease_takeovers_total",
                "Write leases taken since start (a model's first write through this daemon)",
                static_cast<double>(s.lease_takeovers));
    add_counter("ckptd_cluster_leases_lost_total",
                "Lease renewals that found the lease taken by another daemon",
                static_cast<double>(s.leases_lost));
    add_counter("ckptd_cluster_commits_fenced_total",
                "Commits refused because another daemon had taken the model over",
                static_cast<double>(s.commits_fenced));
  }
  if (s.s3) {
    add_counter("ckptd_s3_requests_total",
                "Requests sent to the S3 bucket since start, retries included",
                static_cast<double>(s.s3_requests));
    add_counter("ckptd_s3_sent_bytes_total", "Body bytes sent to the S3 bucket since start",
                static_cast<double>(s.s3_bytes_sent));
    add_counter("ckptd_s3_received_bytes_total",
                "Body bytes received from the S3 bucket since start",
                static_cast<double>(s.s3_bytes_received));
  }

  std::vector<prometheus::MetricFamily> all = registry_->Collect();
  std::vector<prometheus::MetricFamily> store_families = now.Collect();
  all.insert(all.end(), store_families.begin(), store_families.end());
  return prometheus::TextSerializer().Serialize(all);
}

}  // namespace ckpt::api
