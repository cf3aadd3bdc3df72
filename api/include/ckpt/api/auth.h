// Authorizer: bearer-token authorization of API requests.
//
// Tokens are configured by their SHA-256 only (the daemon never stores a token), each with a
// scope and an optional model-name prefix:
//   read   GET/HEAD of models, versions, policies, retention, tags; retention previews
//   write  also pushes, deletes, policy/retention changes, tags, retention runs
//   admin  also /v1/admin/* (garbage collection, scrub, backup)
// A prefix limits a token to the models whose names start with it; listings show only those
// models, and routes that span every model (/v1/admin/*) need a token without a prefix.
// Tokens are presented as "Authorization: Bearer <token>", or as the password of HTTP Basic
// authentication (any user name), which is what a browser sends for the status page (GET /).
// GET /healthz needs no token. With no tokens configured, authorization is disabled and every
// request is allowed (the daemon permits that on loopback listeners only).
//
// A presented token is hashed and compared with every configured digest in constant time (no
// early exit, CRYPTO_memcmp), so response timing does not reveal how close a guess was.
//
// Thread safety: immutable after Create(); safe for concurrent use.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/api/api_handler.h"
#include "ckpt/base/status.h"

namespace ckpt::api {

// Each scope includes the ones before it.
enum class Scope : uint8_t { kRead = 1, kWrite = 2, kAdmin = 3 };

std::string_view ScopeName(Scope scope);
std::optional<Scope> ScopeFromName(std::string_view name);

// One configured token.
struct TokenGrant {
  std::string name;        // shown in logs and errors (never the token)
  std::string sha256_hex;  // SHA-256 of the token: 64 hex digits
  Scope scope = Scope::kRead;
  std::string model_prefix;  // empty: every model
};

// Who a request was authorized for.
struct Principal {
  std::string name;          // the grant's name; "anonymous" when authorization is disabled
  std::string model_prefix;  // the models it may see (empty: all)
};

// What a request needs: a scope, and whether it concerns one model (checked against the
// prefix) or every model (needs a token without a prefix).
struct Requirement {
  Scope scope = Scope::kRead;
  bool all_models = false;
};

class Authorizer {
 public:
  // Validates the grants: names non-empty and unique, digests 64 hex digits and unique.
  // InvalidArgument naming the grant otherwise. No grants: authorization disabled.
  static Result<Authorizer> Create(std::vector<TokenGrant> grants);

  bool enabled() const { return !grants_.empty(); }

  // What `method` on `route` requires; nullopt when it needs no token (GET /healthz). Unknown
  // routes and methods need a valid token of any scope (so that probing without one learns
  // nothing) and write for methods that would change something.
  static std::optional<Requirement> RequirementFor(std::string_view method, const Route& route);

  // Authorizes a request given its Authorization header (empty when absent).
  // Unauthenticated: authorization is enabled and no valid token was presented.
  // PermissionDenied: the token's scope or prefix does not cover the request.
  Result<Principal> Authorize(std::string_view authorization, std::string_view method,
                              const Route& route) const;

  // The WWW-Authenticate challenge of a 401 on `route`: Basic for the status page (so that a
  // browser prompts for the token), Bearer elsewhere.
  static std::string Challenge(const Route& route);

  // The SHA-256 of a token as 64 lowercase hex digits (what the config stores).
  static std::string TokenDigestHex(std::string_view token);

 private:
  struct Grant {
    std::string name;
    std::array<uint8_t, 32> digest;
    Scope scope;
    std::string model_prefix;
  };
  explicit Authorizer(std::vector<Grant> grants) : grants_(std::move(grants)) {}

  std::vector<Grant> grants_;
};

}  // namespace ckpt::api
