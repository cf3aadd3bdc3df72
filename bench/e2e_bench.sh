#!/usr/bin/env bash
# End-to-end lossless benchmark of ckptd on a checkpoint sequence, with baselines measured in
# the same run on the same files:
#   - stored size: ckptd data directory (du after a clean shutdown, WAL and logs included)
#     vs zstd -3 of every file vs zstd --long=27 -19 of the concatenation
#   - throughput: push and pull over loopback HTTP with the ckpt CLI (pull verifies SHA-256),
#     vs cp (+ fsync) of the same files and zstd -1 compression speed
#   - daemon peak RSS (VmHWM) over the run
# Each throughput is the median of ROUNDS rounds (fresh data directory per round).
#
# Usage: bench/e2e_bench.sh CHECKPOINT_DIR [BUILD_DIR] [ROUNDS]
#   BUILD_DIR defaults to build-release (make release), ROUNDS to 3.
#   SKIP_ZSTD19=1 skips the (slow: ~2 MiB/s) zstd -19 baseline, for throughput-only runs.
#   CKPTD_CONFIG=FILE starts ckptd with --config FILE.
set -euo pipefail

dir=$(realpath "$1")
build=$(realpath "${2:-build-release}")
rounds=${3:-3}
ckptd="$build/daemon/ckptd"
ckpt="$build/client-lib/ckpt"
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckpt-bench.XXXXXX)
daemon_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -9 "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mapfile -t files < <(ls "$dir"/*.safetensors | sort)
count=${#files[@]}
raw=0
for f in "${files[@]}"; do raw=$((raw + $(stat -c %s "$f"))); done

now() { date +%s.%N; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.1f", b / 1048576 / s }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

start_daemon() {
  rm -f "$work/ready"
  "$ckptd" ${CKPTD_CONFIG:+--config "$CKPTD_CONFIG"} --listen 127.0.0.1:0 \
    --data-dir "$work/data" --ready-file "$work/ready" \
    --log-level warn > "$work/ckptd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1000); do [[ -s "$work/ready" ]] && break; sleep 0.01; done
  export CKPT_SERVER="http://127.0.0.1:$(cat "$work/ready")"
}
stop_daemon() {
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || true
  daemon_pid=""
}

push_times=(); pull_times=(); rss_kib=0; push_rss_kib=0; stored=0
for round in $(seq "$rounds"); do
  rm -rf "$work/data"
  start_daemon
  t0=$(now)
  v=0
  for f in "${files[@]}"; do v=$((v + 1)); "$ckpt" push bench "$v" "$f" > /dev/null; done
  t1=$(now)
  push_hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$daemon_pid/status")
  (( push_hwm > push_rss_kib )) && push_rss_kib=$push_hwm
  v=0
  for f in "${files[@]}"; do
    v=$((v + 1))
    "$ckpt" pull bench "$v" -o "$work/restored" 2> /dev/null
    if ! cmp -s "$work/restored" "$f"; then echo "MISMATCH at version $v" >&2; exit 1; fi
  done
  t2=$(now)
  hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$daemon_pid/status")
  (( hwm > rss_kib )) && rss_kib=$hwm
  stop_daemon
  push_times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
  pull_times+=("$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')")
  stored=$(du -sb "$work/data" | cut -f1)
  stored_blocks=$(( $(du -sk "$work/data" | cut -f1) * 1024 ))
done
push_s=$(printf '%s\n' "${push_times[@]}" | median)
pull_s=$(printf '%s\n' "${pull_times[@]}" | median)

# Baselines on the same files.
zstd3=0
t0=$(now)
for f in "${files[@]}"; do zstd3=$((zstd3 + $(zstd -3 -q -c "$f" | wc -c))); done
t1=$(now)
for f in "${files[@]}"; do zstd -1 -q -c "$f" > /dev/null; done
t2=$(now)
zstd19=0
if [[ -z "${SKIP_ZSTD19:-}" ]]; then
  zstd19=$(cat "${files[@]}" | zstd --long=27 -19 -T0 -q -c | wc -c)
fi
mkdir -p "$work/cp"
t3=$(now)
for f in "${files[@]}"; do cp "$f" "$work/cp/"; done
sync -f "$work/cp"
t4=$(now)

echo "checkpoints:        $count files in $dir"
echo "raw bytes:          $raw"
printf 'ckptd data dir:     %d bytes (du --apparent), %d bytes (du blocks)  ratio %.3fx\n' \
  "$stored" "$stored_blocks" "$(awk -v r="$raw" -v s="$stored_blocks" 'BEGIN { print r / s }')"
printf 'zstd -3 per file:   %d bytes  ratio %.3fx\n' "$zstd3" "$(awk -v r="$raw" -v s="$zstd3" 'BEGIN { print r / s }')"
if (( zstd19 > 0 )); then
  printf 'zstd --long=27 -19: %d bytes  ratio %.3fx (concatenation)\n' "$zstd19" "$(awk -v r="$raw" -v s="$zstd19" 'BEGIN { print r / s }')"
fi
echo "push (ckpt CLI, loopback HTTP, synced):  $(mbps "$raw" "$push_s") MiB/s  (median of $rounds)"
echo "pull (ckpt CLI, SHA-256 verified):       $(mbps "$raw" "$pull_s") MiB/s  (median of $rounds)"
echo "cp + sync of the same files:             $(mbps "$raw" "$(awk -v a="$t3" -v b="$t4" 'BEGIN { print b - a }')") MiB/s"
echo "zstd -3 compression (1 thread):          $(mbps "$raw" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')") MiB/s"
echo "zstd -1 compression (1 thread):          $(mbps "$raw" "$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')") MiB/s"
echo "daemon peak RSS (VmHWM) after pushes:    $((push_rss_kib / 1024)) MiB"
echo "daemon peak RSS (VmHWM) after pulls:     $((rss_kib / 1024)) MiB"
