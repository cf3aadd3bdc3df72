#include "ckpt/api/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <set>

#include "ckpt/base/hashing.h"

namespace ckpt::api {
namespace {

constexpr std::string_view kBearer = "Bearer ";
constexpr std::string_view kBasic = "Basic ";

// Whether `header` starts with `scheme` (compared case-insensitively, as HTTP schemes are).
bool HasScheme(std::string_view header, std::string_view scheme) {
  if (header.size() <= scheme.size()) return false;
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (lower(header[i]) != lower(scheme[i])) return false;
  }
  return true;
}

// The token of "Bearer <token>", or the password of "Basic base64(<user>:<password>)" (what a
// browser sends for the status page; the user name is ignored). nullopt if neither.
std::optional<std::string> PresentedToken(std::string_view header) {
  if (HasScheme(header, kBearer)) return std::string(header.substr(kBearer.size()));
  if (!HasScheme(header, kBasic)) return std::nullopt;
  const std::string_view encoded = header.substr(kBasic.size());
  if (encoded.size() % 4 != 0 || encoded.size() > 4096) return std::nullopt;
  std::string decoded(encoded.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(decoded.data()),
                                reinterpret_cast<const unsigned char*>(encoded.data()),
                                static_cast<int>(encoded.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the bytes the '=' padding stands for.
  const size_t padding = encoded.ends_with("==") ? 2 : encoded.ends_with("=") ? 1 : 0;
  decoded.resize(static_cast<size_t>(n) - padding);
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return std::nullopt;
  return decoded.substr(colon + 1);
}

bool HexToDigest(std::string_view hex, std::array<uint8_t, 32>* out) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

bool IsReadMethod(std::string_view method) { return method == "GET" || method == "HEAD"; }

}  // namespace

std::string_view ScopeName(Scope scope) {
  switch (scope) {
    case Scope::kRead:
      return "read";
    case Scope::kWrite:
      return "write";
    case Scope::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::optional<Scope> ScopeFromName(std::string_view name) {
  for (Scope s : {Scope::kRead, Scope::kWrite, Scope::kAdmin}) {
    if (ScopeName(s) == name) return s;
  }
  return std::nullopt;
}

Result<Authorizer> Authorizer::Create(std::vector<TokenGrant> grants) {
  std::vector<Grant> parsed;
  std::set<std::string> names;
  std::set<std::array<uint8_t, 32>> digests;
  for (size_t i = 0; i < grants.size(); ++i) {
    TokenGrant& g = grants[i];
    const std::string where =
        "token " + std::to_string(i + 1) + (g.name.empty() ? std::string() : " ('" + g.name + "')");
    if (g.name.empty()) return Status::InvalidArgument(where + ": needs a name");
    if (!names.insert(g.name).second) {
      return Status::InvalidArgument(where + ": the name is used twice");
    }
    Grant grant{std::move(g.name), {}, g.scope, std::move(g.model_prefix)};
    if (!HexToDigest(g.sha256_hex, &grant.digest)) {
      return Status::InvalidArgument(where +
                                     ": sha256 must be 64 hex digits (the SHA-256 of the token)");
    }
    if (!digests.insert(grant.digest).second) {
      return Status::InvalidArgument(where + ": the same token is configured twice");
    }
    parsed.push_back(std::move(grant));
  }
  return Authorizer(std::move(parsed));
}

std::optional<Requirement> Authorizer::RequirementFor(std::string_view method, const Route& route) {
  switch (SpecOf(route.kind).access) {
    case RouteAccess::kOpen:
      return std::nullopt;
    case RouteAccess::kByMethod:
      return Requirement{IsReadMethod(method) ? Scope::kRead : Scope::kWrite, false};
    case RouteAccess::kWriteUnlessDryRun:
      return Requirement{route.dry_run ? Scope::kRead : Scope::kWrite, false};
    case RouteAccess::kReadEveryModel:
      return Requirement{Scope::kRead, true};
    case RouteAccess::kAdmin:
      return Requirement{Scope::kAdmin, true};
  }
  return Requirement{Scope::kAdmin, true};
}

std::string Authorizer::Challenge(const Route& route) {
  // Browsers ask for Basic credentials themselves; the page is what people open in one.
  return route.kind == RouteKind::kStatusPage ? "Basic realm=\"ckptd\", charset=\"UTF-8\""
                                              : "Bearer realm=\"ckptd\"";
}

std::string Authorizer::TokenDigestHex(std::string_view token) {
  Sha256 sha;
  sha.Update(token);
  return sha.FinishHex();
}

Result<Principal> Authorizer::Authorize(std::string_view authorization, std::string_view method,
                                        const Route& route) const {
  const std::optional<Requirement> need = RequirementFor(method, route);
  if (!enabled()) return Principal{"anonymous", ""};
  if (!need) return Principal{"anonymous", ""};
  if (authorization.empty()) {
    return Status::Unauthenticated("this endpoint needs an 'Authorization: Bearer <token>' header");
  }
  const std::optional<std::string> token = PresentedToken(authorization);
  if (!token) {
    return Status::Unauthenticated(
        "the Authorization header must be 'Bearer <token>' (or Basic with the token as the "
        "password)");
  }
  std::array<uint8_t, 32> presented;
  HexToDigest(TokenDigestHex(*token), &presented);
  // Every grant is compared, in constant time, whatever matched before.
  const Grant* match = nullptr;
  for (const Grant& g : grants_) {
    const bool equal = CRYPTO_memcmp(g.digest.data(), presented.data(), presented.size()) == 0;
    match = equal ? &g : match;
  }
  if (!match) return Status::Unauthenticated("the token is not valid");
  if (match->scope < need->scope) {
    return Status::PermissionDenied("token '" + match->name + "' has scope " +
                                    std::string(ScopeName(match->scope)) + "; this needs " +
                                    std::string(ScopeName(need->scope)));
  }
  if (!match->model_prefix.empty()) {
    if (need->all_models) {
      return Status::PermissionDenied("token '" + match->name + "' is limited to models '" +
                                      match->model_prefix +
                                      "*'; this concerns every model and needs a token without "
                                      "a prefix");
    }
    if (!route.model.empty() && route.model.rfind(match->model_prefix, 0) != 0) {
      return Status::PermissionDenied("token '" + match->name + "' is limited to models '" +
                                      match->model_prefix + "*'");
    }
  }
  return Principal{match->name, match->model_prefix};
}

}  // namespace ckpt::api
