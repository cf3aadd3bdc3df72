#!/usr/bin/env bash
# Installs the Debian packages ckptd needs to build and test.
# Non-interactive and idempotent: when every package is present it only runs dpkg-query.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  librocksdb-dev libboost-dev libzstd-dev zstd libspdlog-dev libfmt-dev libssl-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libxxhash-dev
  libbenchmark-dev curl prometheus-cpp-dev
  # the S3 backend: HTTP and SigV4 (libcurl), the S3 API's XML (expat)
  libcurl4-openssl-dev libexpat1-dev
  # TLS tests make their certificates at test time
  openssl
  # the failure-recovery walkthrough (a real PyTorch training loop; docs/failure-recovery.md)
  python3-torch python3-sklearn libopenblas0-pthread
  # the Python client and its tests (make python-client: a venv that sees Debian's torch,
  # installed offline with Debian's pip, setuptools and wheel)
  python3-pip python3-setuptools python3-wheel python3-venv
  # the Python client's native codec module (ckptd._native)
  pybind11-dev python3-dev
  # script(1), which gives the CLI's progress-bar test a terminal
  bsdutils
  # a one-node Ceph cluster for the RADOS tests (scripts/ceph-one-node.sh)
  ceph-mon ceph-osd librados-dev libradospp-dev
  # its S3 gateway, for the S3 backend's tests
  radosgw
)

# Optional groups, named on the command line:
#   --fuzz     clang and its libFuzzer runtime (make fuzz)
#   --browser  Chromium, headless (the status page's browser test)
#   --bench    the peers the benchmarks measure beside ckptd (nginx-light; awscli and s3cmd for
#              the S3 benchmarks), hyperfine (make bench)
for group in "$@"; do
  case "$group" in
    --fuzz) PACKAGES+=(clang libclang-rt-14-dev) ;;
    --browser) PACKAGES+=(chromium) ;;
    --bench) PACKAGES+=(nginx-light hyperfine awscli s3cmd) ;;
    *) echo "install-deps: unknown option $group" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
