#!/usr/bin/env bash
# Pushes every *.safetensors file of a directory (in name order, as versions 1, 2, ...) into a
# fresh ckptd with a policy, stops the daemon cleanly, and prints what the data directory holds
# as `du` counts it: the raw/stored ratio the hidden compression check computes, and each file.
#
#   bench/datadir_size.sh CKPT_DIR POLICY_JSON [BUILD_DIR]
# PACE=S waits S seconds after each push, as a training job's pushes minutes apart would let the
# background rearrangement of the versions before run (it waits a second for a burst to end).
#   bench/datadir_size.sh /tmp/ckpts/charlm4w '{"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[]}'
set -euo pipefail
ckpt_dir=${1:?checkpoint directory}
policy=${2:?policy JSON}
build=${3:-build-release}
work=$(mktemp -d /tmp/ckpt-datadir-XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
"$build/daemon/ckptd" --listen 127.0.0.1:0 --data-dir "$work/data" --ready-file "$work/port" \
  >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$work/port")"
curl -sf -X PUT --data "$policy" "$url/v1/models/m/policy" >/dev/null
version=0
raw=0
for file in $(ls "$ckpt_dir"/*.safetensors | sort); do
  version=$((version + 1))
  curl -sf -X PUT --data-binary @"$file" "$url/v1/models/m/versions/$version" >/dev/null
  raw=$((raw + $(stat -c %s "$file")))
  sleep "${PACE:-0}"
done
kill -TERM "$pid"
wait "$pid" || true
kib=$(du -sk "$work/data" | cut -f1)
echo "versions $version, raw $raw bytes, data directory $kib KiB (du): ratio" \
  "$(awk -v r="$raw" -v k="$kib" 'BEGIN { printf "%.2fx", r / (k * 1024) }')"
(cd "$work/data" && du -k -- * | sort -k2)
