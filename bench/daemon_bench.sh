#!/usr/bin/env bash
# Push and restore through the daemon with curl, beside the peers a user would run instead, all
# on the same files in the same run:
#   - ckptd: every file pushed in order (curl -T, PUT .../versions/N); the daemon's background
#     work after the last push (the rearrangement of the latest version) awaited and its CPU
#     time reported; the daemon restarted without the start-up cache warm-up, then `latest`
#     restored cold (from storage alone) and again warm, then every version in turn, oldest
#     first (the first version's own figure too: the far end of a reverse chain); then
#     restarted once more with the warm-up (the default): seconds until it reports ready (the
#     ready file is written once the warm-up has finished) and `latest` right after that;
#     wall-clock MB/s and the daemon's CPU per byte (utime + stime from /proc/PID/stat around
#     each phase); the data directory's size after a clean shutdown (du ratio) and the stored
#     bytes the daemon reports for the model (ratio); the daemon's peak resident memory over the
#     pushes and their background passes (VmHWM, "peak MiB")
#   - cp + sync of the files, zstd -1 (one thread) of the files
#   - nginx (nginx-light, WebDAV) on loopback: the same files PUT with curl -T and GET back
# Each figure is the median of ROUNDS rounds (fresh data directory per round). Several build
# directories are measured round by round, alternating, so that they share the machine's phases.
#
# Usage: bench/daemon_bench.sh CHECKPOINT_DIR [POLICY_JSON] [ROUNDS] BUILD_DIR...
#   POLICY_JSON "" keeps the default (lossless) policy; ROUNDS defaults to 3. RETENTION_JSON in
#   the environment, if set, is the model's retention policy (rules make lossy chains plain
#   lattices, which the store rearranges; docs/design.md). PACED=1 waits after each push until
#   the daemon is idle (its rearrangement done), as pushes minutes apart would; push MB/s then
#   counts the pushes alone. SINK=/dev/null sends every GET (ckptd's and nginx's) there instead of
#   to a file, so the client's disk writes leave the figures (ckptd's bodies are then not
#   compared with the files; a body whose SHA-256 fails the daemon's own check is cut short,
#   which curl reports).
set -euo pipefail

dir=$(realpath "$1")
policy=${2:-}
rounds=${3:-3}
shift 3
builds=()
for b in "$@"; do builds+=("$(realpath "$b")"); done
(( ${#builds[@]} > 0 )) || builds=("$(realpath build-release)")

work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckpt-daemon-bench.XXXXXX)
daemon_pid=""
nginx_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -9 "$daemon_pid" 2>/dev/null || true
  [[ -n "$nginx_pid" ]] && kill "$nginx_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mapfile -t files < <(ls "$dir"/*.safetensors | sort)
raw=0
for f in "${files[@]}"; do raw=$((raw + $(stat -c %s "$f"))); done
latest_bytes=$(stat -c %s "${files[-1]}")
first_bytes=$(stat -c %s "${files[0]}")

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { print b - a }'; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1e6 / s }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
# A failed request ends the run with what the daemon said (curl -f alone exits silently).
fail() {
  echo "daemon_bench: $*" >&2
  [[ -f "$work/ckptd.log" ]] && tail -n 5 "$work/ckptd.log" >&2
  exit 1
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)
# MB per daemon CPU-second.
mb_per_cpu() { awk -v b="$1" -v t="$2" -v h="$ticks_per_s" 'BEGIN { printf "%.0f", (t > 0 ? b / 1e6 / (t / h) : 0) }'; }

for warm in false true; do
  cat > "$work/ckptd-warm-$warm.toml" <<EOF
[storage]
warm_cache_on_start = $warm
[retention]
interval_seconds = 0
after_push = false
EOF
done

start_daemon() {  # BUILD [WARM_UP]: sets ready_s, the seconds from the start to the ready file
  rm -f "$work/ready"
  local t0
  t0=$(now)
  "$1/daemon/ckptd" --config "$work/ckptd-warm-${2:-false}.toml" --listen 127.0.0.1:0 \
    --data-dir "$work/data" --ready-file "$work/ready" --log-level warn > "$work/ckptd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 6000); do [[ -s "$work/ready" ]] && break; sleep 0.005; done
  ready_s=$(elapsed "$t0" "$(now)")
  url="http://127.0.0.1:$(cat "$work/ready")/v1/models/bench"
}
# Waits until the daemon has used no CPU for 1.5 s: its background passes, which start
# storage.rearrange_delay_ms (1 s by default) after the last push, are done.
wait_idle() {
  local a b
  for _ in $(seq 200); do
    a=$(cpu_ticks "$daemon_pid"); sleep 1.5; b=$(cpu_ticks "$daemon_pid")
    [[ "$a" == "$b" ]] && return
  done
}
stop_daemon() {
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || true
  daemon_pid=""
}

# One round of ckptd with build $1; appends "push_s push_ticks latest_cold_s latest_warm_s
# every_s every_ticks stored after_push_ticks logical_stored first_s peak_kib" to
# $work/results.$2.
ckptd_round() {
  rm -rf "$work/data"
  start_daemon "$1"
  if [[ -n "$policy" ]]; then
    curl -sS --fail-with-body -X PUT --data-binary "$policy" "$url/policy" > /dev/null ||
      fail "policy refused"
  fi
  if [[ -n "${RETENTION_JSON:-}" ]]; then
    curl -sS --fail-with-body -X PUT --data-binary "$RETENTION_JSON" "$url/retention" \
      > /dev/null || fail "retention policy refused"
  fi
  local c0 t0 t1 c1 v=0 paced_s=0 paced_ticks=0 p0 q0
  c0=$(cpu_ticks "$daemon_pid"); t0=$(now)
  for f in "${files[@]}"; do
    v=$((v + 1))
    curl -sS --fail-with-body -T "$f" "$url/versions/$v" > /dev/null || fail "push of $f failed"
    if [[ -n "${PACED:-}" && $v -lt ${#files[@]} ]]; then
      p0=$(now); q0=$(cpu_ticks "$daemon_pid")
      wait_idle
      paced_s=$(awk -v a="$paced_s" -v b="$(elapsed "$p0" "$(now)")" 'BEGIN { print a + b }')
      paced_ticks=$((paced_ticks + $(cpu_ticks "$daemon_pid") - q0))
    fi
  done
  t1=$(now); c1=$(cpu_ticks "$daemon_pid")
  # Paced: the waits (and the background work in them) are not the pushes' time.
  t1=$(awk -v t="$t1" -v p="$paced_s" 'BEGIN { printf "%.6f", t - p }')
  c1=$((c1 - paced_ticks))
  local c_wait
  c_wait=$(cpu_ticks "$daemon_pid")
  wait_idle
  local c_idle logical
  c_idle=$(( $(cpu_ticks "$daemon_pid") - c_wait + paced_ticks ))
  logical=$(curl -sf "$url" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["stored_bytes"])')
  local peak_kib  # the daemon's peak resident memory over the pushes and their passes
  peak_kib=$(awk '/^VmHWM:/ { print $2 }' "/proc/$daemon_pid/status")
  stop_daemon
  local stored
  stored=$(( $(du -sk "$work/data" | cut -f1) * 1024 ))
  start_daemon "$1"
  local t2 t3 t4 c4 t5 c5
  t2=$(now)
  curl -sS --fail-with-body "$url/versions/latest" -o "${SINK:-$work/latest}" || fail "latest (cold)"
  t3=$(now)
  curl -sS --fail-with-body "$url/versions/latest" -o "${SINK:-$work/latest}" || fail "latest (warm)"
  t4=$(now); c4=$(cpu_ticks "$daemon_pid")
  local t_first=
  [[ -n "${SINK:-}" ]] || cmp -s "$work/latest" "${files[-1]}" || [[ -n "$policy" ]] ||
    { echo "latest differs" >&2; exit 1; }
  v=0
  for f in "${files[@]}"; do
    v=$((v + 1))
    curl -sS --fail-with-body "$url/versions/$v" -o "${SINK:-$work/restored}" || fail "version $v"
    [[ -n "$t_first" ]] || t_first=$(elapsed "$t4" "$(now)")
    [[ -n "$policy" || -n "${SINK:-}" ]] || cmp -s "$work/restored" "$f" || { echo "version $v differs" >&2; exit 1; }
  done
  t5=$(now); c5=$(cpu_ticks "$daemon_pid")
  stop_daemon
  start_daemon "$1" true
  local t6
  t6=$(now)
  curl -sS --fail-with-body "$url/versions/latest" -o "${SINK:-$work/latest}" ||
    fail "latest (after the warm-up)"
  local warmed_latest_s
  warmed_latest_s=$(elapsed "$t6" "$(now)")
  stop_daemon
  echo "$(elapsed "$t0" "$t1") $((c1 - c0)) $(elapsed "$t2" "$t3") $(elapsed "$t3" "$t4") $(elapsed "$t4" "$t5") $((c5 - c4)) $stored $c_idle $logical $t_first $peak_kib $ready_s $warmed_latest_s" >> "$work/results.$2"
}

# nginx with WebDAV PUT (start_nginx).
source "$(dirname "$0")/nginx_peer.sh"

peer_round() {
  rm -rf "$work/cp" "$work/www"/*
  mkdir -p "$work/cp"
  local t0 t1 t2 t3 t4 t5 t6
  t0=$(now)
  for f in "${files[@]}"; do cp "$f" "$work/cp/"; done
  sync -f "$work/cp"
  t1=$(now)
  for f in "${files[@]}"; do zstd -1 -T1 -q -c "$f" > /dev/null; done
  t2=$(now)
  local v=0
  for f in "${files[@]}"; do v=$((v + 1)); curl -sf -T "$f" "$nginx_url/$v.safetensors"; done
  t3=$(now)
  v=0
  for f in "${files[@]}"; do v=$((v + 1)); curl -sf "$nginx_url/$v.safetensors" -o "${SINK:-$work/restored}"; done
  t4=$(now)
  curl -sf "$nginx_url/$v.safetensors" -o "${SINK:-$work/restored}"
  t5=$(now)
  curl -sf "$nginx_url/1.safetensors" -o "${SINK:-$work/restored}"
  t6=$(now)
  echo "$(elapsed "$t0" "$t1") $(elapsed "$t1" "$t2") $(elapsed "$t2" "$t3") $(elapsed "$t3" "$t4") $(elapsed "$t4" "$t5") $(elapsed "$t5" "$t6")" >> "$work/results.peers"
}

start_nginx
for round in $(seq "$rounds"); do
  for i in "${!builds[@]}"; do ckptd_round "${builds[$i]}" "$i"; done
  peer_round
done

col() { awk -v c="$2" '{ print $c }' "$1" | median; }
echo "files: ${#files[@]} in $dir, $raw bytes; policy: ${policy:-default (lossless)}${RETENTION_JSON:+; retention: $RETENTION_JSON}${PACED:+; paced}; rounds: $rounds"
printf '%-34s %10s %10s %10s %12s %12s %10s %10s %12s %8s %8s %9s %9s %12s\n' "" "push MB/s" "MB/cpu-s" "after cpu-s" "latest cold" "latest warm" "first MB/s" "every MB/s" "every MB/cpu-s" "du ratio" "ratio" "peak MiB" "ready s" "latest ready"
for i in "${!builds[@]}"; do
  r="$work/results.$i"
  printf '%-34s %10s %10s %10s %12s %12s %10s %10s %12s %8s %8s %9s %9s %12s\n' "ckptd ($(basename "$(dirname "${builds[$i]}")")/$(basename "${builds[$i]}"))" \
    "$(mbps "$raw" "$(col "$r" 1)")" "$(mb_per_cpu "$raw" "$(col "$r" 2)")" \
    "$(awk -v t="$(col "$r" 8)" -v h="$ticks_per_s" 'BEGIN { printf "%.2f", t / h }')" \
    "$(mbps "$latest_bytes" "$(col "$r" 3)")" "$(mbps "$latest_bytes" "$(col "$r" 4)")" \
    "$(mbps "$first_bytes" "$(col "$r" 10)")" "$(mbps "$raw" "$(col "$r" 5)")" "$(mb_per_cpu "$raw" "$(col "$r" 6)")" \
    "$(awk -v r="$raw" -v s="$(col "$r" 7)" 'BEGIN { printf "%.2fx", r / s }')" \
    "$(awk -v r="$raw" -v s="$(col "$r" 9)" 'BEGIN { printf "%.2fx", r / s }')" \
    "$(awk -v k="$(col "$r" 11)" 'BEGIN { printf "%.0f", k / 1024 }')" \
    "$(awk -v s="$(col "$r" 12)" 'BEGIN { printf "%.2f", s }')" "$(mbps "$latest_bytes" "$(col "$r" 13)")"
done
p="$work/results.peers"
echo "cp + sync:                 $(mbps "$raw" "$(col "$p" 1)") MB/s"
echo "zstd -1 (one thread):      $(mbps "$raw" "$(col "$p" 2)") MB/s"
echo "nginx PUT (curl -T):       $(mbps "$raw" "$(col "$p" 3)") MB/s"
echo "nginx GET, every file:     $(mbps "$raw" "$(col "$p" 4)") MB/s"
echo "nginx GET, the last file:  $(mbps "$latest_bytes" "$(col "$p" 5)") MB/s"
echo "nginx GET, the first file: $(mbps "$first_bytes" "$(col "$p" 6)") MB/s"
