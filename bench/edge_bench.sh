#!/usr/bin/env bash
# Coding at the edge against coding in the daemon, on the same files in the same run, over
# loopback: each file pushed in order by `ckpt push` (the daemon codes), by `ckpt push --encoded`
# (the client codes; the daemon decodes each payload to verify it) and by `ckpt push --encoded`
# to a daemon that trusts its writers (server.decode_encoded_payloads = false); then the latest
# version pulled by `ckpt pull` and `ckpt pull --encoded` (a client holding nothing), and every
# version synced by a follower (`ckpt pull --encoded`, holding the version before). Peer: nginx
# (WebDAV) taking and serving the same files (curl -T, curl GET), its workers' CPU seconds in
# the daemon's column.
# Reported per way: the wall seconds of its client commands (ckpt, curl; summed over the
# files), MB/s of checkpoint (raw bytes ÷ seconds), bytes on the wire (the request or response
# bodies), the daemon's CPU seconds per GB of checkpoint (utime + stime from /proc/PID/stat)
# and the client's (from /usr/bin/time). One fresh data directory per way.
#
# With LINK_RATE (bits/s: 100M, 1G) in the environment, every client (ckpt, curl) reaches the
# daemon and nginx through bench/rate_limit_proxy.py, a loopback link of that rate shared by
# both directions' connections; "link-bound seconds" is then the wire bytes ÷ the rate.
#
# Usage: bench/edge_bench.sh CHECKPOINT_DIR POLICY_JSON BUILD_DIR
#   (POLICY_JSON "" keeps the default lossless policy; STORAGE_CONFIG in the environment adds
#   lines to the daemon's [storage] section, e.g. "reference_cache_bytes = 1073741824";
#   CONNECTIONS=N sends the encoded pushes as N shards coded here, `--connections N`)
set -euo pipefail

dir=$(realpath "$1")
policy=${2:-}
build=$(realpath "$3")
ckpt="$build/client-lib/ckpt"
ckptd="$build/daemon/ckptd"
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckpt-edge-bench.XXXXXX)
daemon_pid=""
nginx_pid=""
proxy_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -9 "$daemon_pid" 2>/dev/null || true
  [[ -n "$nginx_pid" ]] && kill "$nginx_pid" 2>/dev/null || true
  [[ -n "$proxy_pid" ]] && kill "$proxy_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/nginx_peer.sh"

mapfile -t files < <(ls "$dir"/*.safetensors | sort)
raw=0
for f in "${files[@]}"; do raw=$((raw + $(stat -c %s "$f"))); done
latest_bytes=$(stat -c %s "${files[-1]}")
ticks=$(getconf CLK_TCK)

now() { date +%s.%N; }

# Sets link_url to the URL clients use for the server at $1 (http://127.0.0.1:PORT): itself, or
# with LINK_RATE a rate-limited proxy in front of it (one at a time).
link_to() {
  link_url=$1
  [[ -z "${LINK_RATE:-}" ]] && return
  if [[ -n "$proxy_pid" ]]; then
    kill "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
  fi
  rm -f "$work/proxy-ready"
  /usr/bin/python3 "$(dirname "$0")/rate_limit_proxy.py" --rate "$LINK_RATE" \
    --to "${1#http://}" --ready-file "$work/proxy-ready" > /dev/null 2>&1 &
  proxy_pid=$!
  for _ in $(seq 300); do [[ -s "$work/proxy-ready" ]] && break; sleep 0.02; done
  link_url="http://127.0.0.1:$(cat "$work/proxy-ready")"
}
daemon_cpu() { awk -v t="$ticks" '{ print ($14 + $15) / t }' "/proc/$daemon_pid/stat"; }

start_daemon() {  # $1: extra config; stops the daemon of the previous way first
  [[ -n "$daemon_pid" ]] && stop_daemon
  rm -rf "$work/data" "$work/ready"
  printf '%s\n' "[storage]" "rearrange_delay_ms = 3600000" "${STORAGE_CONFIG:-}" "$1" \
    > "$work/ckptd.toml"
  "$ckptd" --config "$work/ckptd.toml" --listen 127.0.0.1:0 --data-dir "$work/data" \
    --ready-file "$work/ready" > "$work/ckptd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 300); do [[ -s "$work/ready" ]] && break; sleep 0.05; done
  link_to "http://127.0.0.1:$(cat "$work/ready")"
  export CKPT_SERVER=$link_url
  if [[ -n "$policy" ]]; then "$ckpt" policy m "$policy" > /dev/null; fi
}
stop_daemon() { kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true; daemon_pid=""; }

# Runs a ckpt command with --json, adding its wall seconds to ckpt_seconds (last_seconds: this
# one's), its CPU seconds to client_cpu and the JSON field $1 (bytes on the wire) to wire. Only
# the command is timed: reading its answer here (a Python start) is not the push's time.
client_cpu=0
wire=0
ckpt_seconds=0
run_ckpt() {
  local field=$1 a b
  shift
  a=$(now)
  /usr/bin/time -f "%U %S" -o "$work/time" "$ckpt" --json "$@" > "$work/out.json"
  b=$(now)
  last_seconds=$(awk -v a="$a" -v b="$b" 'BEGIN { print b - a }')
  ckpt_seconds=$(awk -v s="$ckpt_seconds" -v l="$last_seconds" 'BEGIN { print s + l }')
  client_cpu=$(awk -v c="$client_cpu" '{ print c + $1 + $2 }' "$work/time")
  wire=$((wire + $(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/out.json" "$field")))
}

link_bytes_per_second=$(/usr/bin/python3 -c "
import sys; t = sys.argv[1]; s = {'K': 1e3, 'M': 1e6, 'G': 1e9}
print((float(t[:-1]) * s[t[-1].upper()] if t[-1].upper() in s else float(t)) / 8 if t else 0)" "${LINK_RATE:-}")
row() {  # name seconds raw_bytes daemon_cpu_seconds
  awk -v n="$1" -v s="$2" -v b="$3" -v w="$wire" -v d="$4" -v c="$client_cpu" \
      -v l="$link_bytes_per_second" 'BEGIN {
    printf "| %s | %.2f | %s | %.0f | %.1f | %.2f | %.2f |\n", n, s,
      (l > 0 ? sprintf("%.2f", w / l) : "-"), b / 1e6 / s, w / 1e6, d / (b / 1e9), c / (b / 1e9) }'
}

echo "checkpoints: ${#files[@]} files, $((raw / 1000000)) MB; policy: ${policy:-lossless default};" \
     "link: ${LINK_RATE:-loopback}; build: $build"
echo
echo "| way | seconds | link-bound seconds | MB/s (time to durable) | wire MB | daemon CPU-s/GB | client CPU-s/GB |"
echo "|---|---|---|---|---|---|---|"

push_all() {  # name extra-config push-args...
  local name=$1 config=$2
  shift 2
  start_daemon "$config"
  client_cpu=0
  wire=0
  ckpt_seconds=0
  local cpu0 cpu1 v=0
  cpu0=$(daemon_cpu)
  for f in "${files[@]}"; do
    v=$((v + 1))
    run_ckpt sent_bytes push m "$v" "$f" "$@"
  done
  cpu1=$(daemon_cpu)
  row "$name" "$ckpt_seconds" "$raw" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')"
}

push_all "push: daemon codes" ""
shards=(${CONNECTIONS:+--connections "$CONNECTIONS"})
push_all "push --encoded${CONNECTIONS:+ --connections $CONNECTIONS} (daemon decodes to verify)" "" \
  --encoded --reference-dir "$work/refs1" "${shards[@]}"
push_all "push --encoded${CONNECTIONS:+ --connections $CONNECTIONS} (trusted writer)" \
  $'[server]\ndecode_encoded_payloads = false' --encoded --reference-dir "$work/refs2" "${shards[@]}"

# Pulls, from the store the trusted run left.
pull_way() {  # name field pull-args...
  local name=$1 field=$2
  shift 2
  client_cpu=0
  wire=0
  local cpu0 cpu1
  cpu0=$(daemon_cpu)
  run_ckpt "$field" pull m latest -o "$work/pulled.safetensors" "$@"
  cpu1=$(daemon_cpu)
  row "$name" "$last_seconds" "$latest_bytes" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')"
}
pull_way "pull latest: daemon decodes" received_bytes
pull_way "pull latest --encoded, holding nothing" received_bytes --encoded --reference-dir "$work/cold"

# The follower pulls version 1 holding nothing, then syncs each next version holding the one
# before: the syncs are timed apart, with the median of one sync beside nginx's GET of a file.
run_ckpt received_bytes pull m 1 -o "$work/follower.safetensors" --encoded \
  --reference-dir "$work/follower"
client_cpu=0
wire=0
ckpt_seconds=0
sync_seconds=()
cpu0=$(daemon_cpu)
for v in $(seq 2 "${#files[@]}"); do
  run_ckpt received_bytes pull m "$v" -o "$work/follower.safetensors" --encoded \
    --reference-dir "$work/follower"
  sync_seconds+=("$last_seconds")
done
cpu1=$(daemon_cpu)
row "follower: versions 2.. --encoded, each holding the one before" "$ckpt_seconds" \
  "$((raw - $(stat -c %s "${files[0]}")))" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')"
follower_median=$(printf '%s\n' "${sync_seconds[@]}" | sort -g |
  awk '{ s[NR] = $1 } END { print (NR % 2 ? s[(NR + 1) / 2] : (s[NR / 2] + s[NR / 2 + 1]) / 2) }')
cmp -s "$work/follower.safetensors" "$work/pulled.safetensors" || echo "follower differs from the pull!"
stop_daemon

start_nginx
link_to "$nginx_url"
nginx_url=$link_url
# nginx's CPU seconds (its workers'), in the daemon's column: what a server spends to take or
# serve the raw bytes.
nginx_cpu() {
  local total=0 w
  for w in $(pgrep -P "$nginx_pid"); do
    total=$(awk -v t="$ticks" -v s="$total" '{ print s + ($14 + $15) / t }' "/proc/$w/stat")
  done
  echo "$total"
}
client_cpu=0
wire=$raw
t0=$(now)
cpu0=$(nginx_cpu)
for f in "${files[@]}"; do curl -sf -T "$f" "$nginx_url/$(basename "$f")" > /dev/null; done
t1=$(now)
cpu1=$(nginx_cpu)
row "nginx: curl -T each file" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$raw" \
  "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')"
wire=$latest_bytes
t0=$(now)
cpu0=$(nginx_cpu)
curl -sf "$nginx_url/$(basename "${files[-1]}")" -o "$work/nginx.safetensors"
t1=$(now)
cpu1=$(nginx_cpu)
row "nginx: curl GET the latest" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
  "$latest_bytes" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')"
get_seconds=$(for _ in 1 2 3 4 5; do
  g0=$(now)
  curl -sf "$nginx_url/$(basename "${files[-1]}")" -o "$work/nginx.safetensors"
  awk -v a="$g0" -v b="$(now)" 'BEGIN { print b - a }'
done | sort -g | sed -n 3p)
echo
awk -v f="$follower_median" -v g="$get_seconds" 'BEGIN {
  printf "follower: median sync of one version %.3f s; nginx GET of one file %.3f s (median of 5) (%.1fx)\n", f, g, g / f }'
