#!/usr/bin/env bash
# A data directory on a small file system filled by the pushes of a real training run, through
# the real daemon and curl: pushes refused with 507 before the volume is full, every
# acknowledged version restores identical, DELETE and GC free space, pushes resume without a
# restart, and the same after one (docs/design.md, "Faults of the disk").
#
# Usage (as root: it mounts a tmpfs in a private mount namespace of its own):
#   scripts/disk_full_walkthrough.sh CKPTD_BINARY CHECKPOINT_DIR [VOLUME_MIB] [RESERVE_MIB]
# CHECKPOINT_DIR holds step-NNNNNN.safetensors files; they are pushed in order, again and again
# (as later steps), until the volume refuses one.
set -euo pipefail
if [[ "${CKPT_IN_NAMESPACE:-}" != 1 ]]; then
  exec env CKPT_IN_NAMESPACE=1 unshare -m --propagation private "$0" "$@"
fi
ckptd=$1 ckpts=$2 volume_mib=${3:-256} reserve_mib=${4:-128}
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true; umount "$work/data" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/data"
mount -t tmpfs -o "size=${volume_mib}m" tmpfs "$work/data"
printf '[storage]\nmin_free_bytes = %d\n' $((reserve_mib << 20)) > "$work/ckptd.toml"
port=7399
start() {
  rm -f "$work/ready"
  "$ckptd" --config "$work/ckptd.toml" --listen 127.0.0.1:$port --data-dir "$work/data" \
    --ready-file "$work/ready" --log-level info >> "$work/ckptd.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ -f $work/ready ]] && return; sleep 0.1; done
  echo "ckptd did not start"; exit 1
}
free_mib() { echo $(( $(stat -f -c '%a * %S' "$work/data") >> 20 )); }
url=http://127.0.0.1:$port/v1/models/run
declare -A sha
files=("$ckpts"/step-*.safetensors)
push() {  # push VERSION FILE; prints the HTTP status
  curl -s -o "$work/answer" -w '%{http_code}' -T "$2" "$url/versions/$1"
}
start
version=0 status=201
while [[ $status == 201 ]]; do
  file=${files[$((version % ${#files[@]}))]}
  version=$((version + 1))
  status=$(push $version "$file")
  if [[ $status == 201 ]]; then sha[$version]=$(sha256sum < "$file" | cut -d' ' -f1); fi
done
echo "pushed $((version - 1)) versions; version $version: HTTP $status $(cat "$work/answer")"
echo "free when refused: $(free_mib) MiB of ${volume_mib} (reserve ${reserve_mib})"
[[ $status == 507 ]] || { echo "FAIL: expected 507"; exit 1; }
curl -s "http://127.0.0.1:$port/v1/status"; echo
check() {
  local bad=0
  for v in "${!sha[@]}"; do
    got=$(curl -s "$url/versions/$v" | sha256sum | cut -d' ' -f1)
    [[ $got == "${sha[$v]}" ]] || { echo "FAIL: version $v differs"; bad=1; }
  done
  [[ $bad == 0 ]] && echo "all ${#sha[@]} acknowledged versions restore identical"
  return $bad
}
check
half=$(( ${#sha[@]} / 2 ))
for v in $(printf '%s\n' "${!sha[@]}" | sort -n | head -$half); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/versions/$v")
  [[ $code == 204 ]] || { echo "FAIL: DELETE $v: $code"; exit 1; }
  unset "sha[$v]"
done
echo "deleted $half versions: $(free_mib) MiB free"
curl -s -o /dev/null -w 'POST /v1/admin/gc: HTTP %{http_code}\n' -X POST "http://127.0.0.1:$port/v1/admin/gc"
echo "after GC: $(free_mib) MiB free"
file=${files[$((version % ${#files[@]}))]}
status=$(push $version "$file")
echo "push of version $version again, without a restart: HTTP $status"
[[ $status == 201 ]] || { echo "FAIL"; exit 1; }
sha[$version]=$(sha256sum < "$file" | cut -d' ' -f1)
check
kill $pid; wait $pid || true
start
echo "restarted"
check
version=$((version + 1)) status=201
while [[ $status == 201 ]]; do
  file=${files[$((version % ${#files[@]}))]}
  status=$(push $version "$file")
  if [[ $status == 201 ]]; then sha[$version]=$(sha256sum < "$file" | cut -d' ' -f1); fi
  version=$((version + 1))
done
echo "after the restart: refused again with HTTP $status at $(free_mib) MiB free"
check
grep -c "error_detail\|storage:" "$work/ckptd.log" | xargs echo "log lines on storage state or error detail:"
grep "storage:" "$work/ckptd.log" | head -5
