#!/usr/bin/env bash
# Acceptance check with plain curl against a running ckptd (for example `make run`):
#   push   pushes every DIR/*.safetensors as MODEL, version = 1, 2, 3, ... (curl -T)
#   verify GETs every version and compares its SHA-256 with the file's
# Run `push` once, then `verify` as often as wanted (for example after restarting the daemon).
#
# Usage: bench/curl_roundtrip.sh push|verify DIR [MODEL] [URL]
#   MODEL defaults to roundtrip, URL to http://127.0.0.1:8420.
set -euo pipefail
mode=$1
dir=$2
model=${3:-roundtrip}
url=${4:-http://127.0.0.1:8420}
mapfile -t files < <(ls "$dir"/*.safetensors | sort)
v=0
bad=0
for f in "${files[@]}"; do
  v=$((v + 1))
  case "$mode" in
    push)
      curl -sSf -T "$f" "$url/v1/models/$model/versions/$v" -o /dev/null ;;
    verify)
      got=$(curl -sSf "$url/v1/models/$model/versions/$v" | sha256sum | cut -c1-64)
      want=$(sha256sum < "$f" | cut -c1-64)
      if [[ "$got" != "$want" ]]; then
        echo "MISMATCH version $v ($f)"
        bad=$((bad + 1))
      fi ;;
    *) echo "usage: $0 push|verify DIR [MODEL] [URL]" >&2; exit 2 ;;
  esac
done
echo "$mode: ${#files[@]} versions of $model, mismatches: $bad"
[[ $bad -eq 0 ]]
