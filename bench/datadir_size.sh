#!/usr/bin/env bash
# Pushes every *.safetensors file of a directory (in name order, as versions 1, 2, ...) into a
# fresh ckptd with a policy, waits IDLE seconds (default 5: the background pass after the last
# push starts a second after it), and prints what the data directory holds as `du` counts it
# against the stored bytes the model reports: while the daemon runs, then after a clean stop;
# then each file.
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
  curl -sf -T "$file" "$url/v1/models/m/versions/$version" >/dev/null
  raw=$((raw + $(stat -c %s "$file")))
  sleep "${PACE:-0}"
done
sleep "${IDLE:-5}"
stored=$(curl -sf "$url/v1/models/m" |
  /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['stored_bytes'])")
running_kib=$(du -sk "$work/data" | cut -f1)
space=$(curl -sf "$url/v1/status" |
  /usr/bin/python3 -c "import json, sys; print(' '.join(f'{k} {v}' for k, v in json.load(sys.stdin).get('space', {}).items()))" ||
  true)
kill -TERM "$pid"
wait "$pid" || true
kib=$(du -sk "$work/data" | cut -f1)
[[ "$stored" -gt 0 ]] || { echo "the model reports no stored bytes" >&2; exit 1; }
awk -v v="$version" -v r="$raw" -v s="$stored" -v k="$kib" -v l="$running_kib" 'BEGIN {
  printf "versions %d, raw %.0f bytes, stored %.0f (%.2fx)\n", v, r, s, r / s
  printf "data directory (du): running %d KiB (%+.2f%% of stored), stopped %d KiB (%+.2f%%, %.2fx)\n",
    l, (l * 1024 / s - 1) * 100, k, (k * 1024 / s - 1) * 100, r / (k * 1024) }'
echo "GET /v1/status space while running: ${space:-(none)}"
(cd "$work/data" && for f in *; do printf "%s\t%s\t%s\n" "$(du -k -- "$f" | cut -f1)" "$(du -sb -- "$f" | cut -f1)" "$f"; done)
