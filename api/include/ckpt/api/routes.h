// The routes of the HTTP API: one table (RouteTable) says, for each path, what it is called,
// which methods it answers, who may call it, whether a cluster sends its writes to the model's
// writer, whether it runs as an administrative pass, and which bodies stream. Classification,
// the Allow header, authorization, redirects and the session's plan are all read from it;
// a test checks it against the headings of docs/api.md, which documents each route.
//
// Thread safety: the table is immutable; the functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ckpt::api {

enum class RouteKind {
  kStatusPage,    // the HTML status page (?model=<name> for one model)
  kHealth,        // liveness (?detail=1: with the write state)
  kStoreStatus,   // whether writes are taken, free and reserved bytes
  kListModels,    // every model
  kModel,         // one model
  kListVersions,  // a model's versions
  kVersion,       // one version: push, restore, delete, its detail or layout
  kPolicy,        // a model's codec policy
  kVersionTag,    // a tag on a version
  kPlan,          // the coding plan of a push encoded at the edge
  kShard,         // one shard of a sharded version
  kShardPlan,     // the coding plan of a shard encoded by its rank
  kUpload,        // the upload of a sharded version (its state, abort)
  kUploadCommit,  // the commit of a sharded version's upload
  kHfFile,        // a file of a version's Hugging Face view
  kRetention,     // a model's retention policy
  kRetentionRun,  // a retention pass over a model: preview or apply
  kAdminGc,       // retention and space reclamation for every model
  kAdminScrub,    // verification of everything stored
  kAdminBackup,   // an online backup
  kMetrics,       // Prometheus metrics
  kUnknown,       // no such path: 404
};

// Who may call a route (Authorizer::RequirementFor).
enum class RouteAccess : uint8_t {
  kOpen,               // anyone, even with tokens configured (liveness)
  kByMethod,           // read scope for GET and HEAD, write for the others; one model
  kWriteUnlessDryRun,  // write scope, read for a dry run whatever the method; one model
  kReadEveryModel,     // read scope, concerning every model (no token limited to a prefix)
  kAdmin,              // admin scope, concerning every model
};

// Everything that is true of one route. A dry run (Route::dry_run) only reads: it is neither
// redirected nor run as an administrative pass.
struct RouteSpec {
  RouteKind kind;
  std::string_view name;     // stable lowercase name for metrics and logs
  std::string_view pattern;  // the path as docs/api.md writes it; "{x}" is one path segment
  std::string_view methods;  // every method it answers, as the Allow header lists them
  RouteAccess access;
  bool admin_pass;         // runs over stored data for minutes: on the admin thread, one at a time
  bool writes_redirected;  // with a cluster, methods other than GET and HEAD go to the writer
  bool put_streams_in;     // PUT streams its body into the store (RequestPlan::kPush)
  bool get_streams_out;    // GET and HEAD stream a stored body out, unless asked for JSON
};

// Every route, in the order of docs/api.md's sections. kRetentionRun has two rows (preview
// and apply); kUnknown has none.
std::span<const RouteSpec> RouteTable();
// The row of `kind` (the first, for kRetentionRun); for kUnknown, a row without methods (every
// method is answered 404).
const RouteSpec& SpecOf(RouteKind kind);

struct Route {
  RouteKind kind = RouteKind::kUnknown;
  std::string model;     // kStatusPage: the ?model= filter (empty: every model)
  std::string version;   // as written in the path: decimal, "latest" or "tag:<name>"
  std::string tag;       // kVersionTag: the tag
  std::string shard;     // kShard: the shard index as written in the path
  std::string file;      // kHfFile: the file name
  std::string query;     // the raw query string (after '?'), empty if none
  bool detail = false;   // ?detail=1 on a version: its storage detail (JSON) instead of the body
  bool layout = false;   // ?layout=1 on a version: how it was pushed (JSON) instead of the body
  bool dry_run = false;  // kRetentionRun: retention:preview, or retention:apply?dry_run=1
  // Set by the server from the headers: the body is an encoded push body (its Content-Type is
  // kEncodedBodyMediaType), not a safetensors checkpoint.
  bool encoded_body = false;
  // Set by the server from the headers: the body is an encoded shard (kEncodedShardMediaType).
  bool encoded_shard = false;
  // Set by the server from the headers: the client accepts an encoded pull body (its Accept
  // header names kEncodedPullMediaType) instead of the restored safetensors body.
  bool encoded_pull = false;
  // Set by the server after authorization: listings show only models whose names start with
  // it (empty: all).
  std::string model_prefix;
};

// A request target (path and query) as a Route, by the first row of the table whose pattern
// matches its path.
Route ClassifyTarget(std::string_view target);

// A stable lowercase name of a route kind ("version", "list_models", …), for metrics and logs.
std::string_view RouteName(RouteKind kind);

// Whether the route answers `method` (its RouteSpec::methods).
bool RouteAllows(const Route& route, std::string_view method);

// What a session should do with a request once its headers are known.
enum class RequestPlan {
  kSimple,   // read the (small) body, call ApiHandler::Handle()
  kPush,     // PUT of a version or a shard: BeginPush(), stream the body into it, FinishPush()
  kRestore,  // GET/HEAD of a version or an HF file: BeginRestore(), stream it out
};
RequestPlan PlanOf(std::string_view method, const Route& route);

// Whether the request runs as an administrative pass (RouteSpec::admin_pass, not a dry run).
bool IsAdminPass(const Route& route);

// Whether, with a cluster, the request goes to the daemon writing the route's model.
bool IsRedirectedWrite(std::string_view method, const Route& route);

}  // namespace ckpt::api
