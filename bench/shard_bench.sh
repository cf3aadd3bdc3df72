#!/usr/bin/env bash
# Sharded versions through the daemon with curl, beside the peers, on the same files in the
# same run (files from bench/shard_checkpoints.py: whole-VVV.safetensors and, per version,
# RANKS shard-VVV-R.safetensors holding each matrix's rows of rank R):
#   - ckptd, whole: every version pushed as one body (curl -T .../versions/V)
#   - ckptd, sharded: every version pushed as RANKS shards at once (RANKS curl -T in parallel,
#     .../versions/V/shards/R?of=RANKS), into a fresh data directory as the whole pushes; the
#     version commits when the last one is in
#   - ckptd, one file split by the client: every whole file pushed with `ckpt push --connections
#     RANKS` (the CLI cuts it into RANKS shards sent at once), into a fresh data directory
#   - restores of the latest sharded version after a restart without warm-up: the whole
#     version; one rank's part (?rank=0&of=RANKS); the resharded view for 2 ranks (both at
#     once); a download cut at half and resumed with Range/If-Range (SHA-256 checked)
#   - nginx (WebDAV) PUT of the whole files, and of the shard files RANKS at once; GET back
#   - cp + sync of the whole files; zstd -1 of the last one
# Wall-clock MB/s (raw bytes of the whole version) and the daemon's CPU per byte
# (utime + stime); the daemon's peak RSS (VmHWM). Medians of ROUNDS rounds.
#
# Usage: bench/shard_bench.sh SHARD_DIR [ROUNDS] [BUILD_DIR]
set -euo pipefail

dir=$(realpath "$1")
rounds=${2:-3}
build=$(realpath "${3:-build-release}")
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckpt-shard-bench.XXXXXX)
daemon_pid=""
nginx_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -9 "$daemon_pid" 2>/dev/null || true
  [[ -n "$nginx_pid" ]] && kill "$nginx_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mapfile -t wholes < <(ls "$dir"/whole-*.safetensors | sort)
versions=${#wholes[@]}
ranks=$(ls "$dir"/shard-001-*.safetensors | wc -l)
raw=0
for f in "${wholes[@]}"; do raw=$((raw + $(stat -c %s "$f"))); done
last_bytes=$(stat -c %s "${wholes[-1]}")

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { print b - a }'; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1e6 / s }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)
mb_per_cpu() { awk -v b="$1" -v t="$2" -v h="$ticks_per_s" 'BEGIN { printf "%.0f", (t > 0 ? b / 1e6 / (t / h) : 0) }'; }

printf '[storage]\nwarm_cache_on_start = false\n[retention]\ninterval_seconds = 0\nafter_push = false\n' \
  > "$work/ckptd.toml"

start_daemon() {
  rm -f "$work/ready"
  "$build/daemon/ckptd" --config "$work/ckptd.toml" --listen 127.0.0.1:0 --data-dir "$work/data" \
    --ready-file "$work/ready" --log-level warn > "$work/ckptd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 3000); do [[ -s "$work/ready" ]] && break; sleep 0.01; done
  base="http://127.0.0.1:$(cat "$work/ready")/v1/models"
}
# Waits until the daemon has used no CPU for 1.5 s (its background passes are done).
wait_idle() {
  local a b
  for _ in $(seq 200); do
    a=$(cpu_ticks "$daemon_pid"); sleep 1.5; b=$(cpu_ticks "$daemon_pid")
    [[ "$a" == "$b" ]] && return
  done
}
stop_daemon() { kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; daemon_pid=""; }
# SHA-256 of a safetensors file's data section (after its header).
data_sha() {
  /usr/bin/python3 -c 'import hashlib, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; f.seek(8 + n)
h = hashlib.sha256()
for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
print(h.hexdigest())' "$1"
}
peak_rss_mib() { awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }

# Pushes version $1's shards at once to model $2 of base URL $3 (nginx: a plain URL prefix).
push_shards() {
  local pids=() r
  for r in $(seq 0 $((ranks - 1))); do
    curl -sf -T "$dir/shard-$(printf %03d "$1")-$r.safetensors" "$(shard_url "$@" "$r")" \
      > /dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
shard_url() {  # VERSION MODEL BASE RANK
  if [[ "$2" == nginx ]]; then echo "$3/s$1-$4"; else echo "$3/$2/versions/$1/shards/$4?of=$ranks"; fi
}

# One round; appends "whole_s whole_ticks sharded_s sharded_ticks restore_s restore_ticks
# rank_s rank_ticks reshard_s reshard_ticks resume_s rss_mib cli_s cli_ticks" to $work/results.
ckptd_round() {
  rm -rf "$work/data"
  start_daemon
  local t0 c0 t1 c1 t1b c1b t2 c2 v
  t0=$(now); c0=$(cpu_ticks "$daemon_pid")
  for v in $(seq "$versions"); do
    curl -sf -T "${wholes[$((v - 1))]}" "$base/whole/versions/$v" > /dev/null
  done
  t1=$(now); c1=$(cpu_ticks "$daemon_pid")
  # The sharded pushes on a store of their own, as the whole ones had: another model's
  # references would share the reference cache with them.
  stop_daemon
  rm -rf "$work/data"
  start_daemon
  t1b=$(now); c1b=$(cpu_ticks "$daemon_pid")
  for v in $(seq "$versions"); do push_shards "$v" sharded "$base"; done
  t2=$(now); c2=$(cpu_ticks "$daemon_pid")
  wait_idle
  # The whole files split by the CLI, on a store of their own too.
  stop_daemon
  mv "$work/data" "$work/data.sharded"
  start_daemon
  local t2b c2b t2c c2c
  t2b=$(now); c2b=$(cpu_ticks "$daemon_pid")
  for v in $(seq "$versions"); do
    CKPT_SERVER="${base%/v1/models}" "$build/client-lib/ckpt" push cli "$v" \
      "${wholes[$((v - 1))]}" --connections "$ranks" > /dev/null
  done
  t2c=$(now); c2c=$(cpu_ticks "$daemon_pid")
  stop_daemon
  rm -rf "$work/data"
  mv "$work/data.sharded" "$work/data"
  start_daemon
  local t3 c3 t4 c4 t5 c5 t6 c6 t7 p0 p1
  t3=$(now); c3=$(cpu_ticks "$daemon_pid")
  curl -sf "$base/sharded/versions/$versions" -o "$work/whole"
  t4=$(now); c4=$(cpu_ticks "$daemon_pid")
  # The assembled header adds the layout: the tensors' bytes must be the whole file's.
  [[ "$(data_sha "$work/whole")" == "$(data_sha "${wholes[-1]}")" ]] ||
    { echo "the sharded version differs" >&2; exit 1; }
  curl -sf "$base/sharded/versions/$versions?rank=0&of=$ranks" -o "$work/rank0"
  t5=$(now); c5=$(cpu_ticks "$daemon_pid")
  curl -sf "$base/sharded/versions/$versions?rank=0&of=2" -o "$work/half0" &
  p0=$!
  curl -sf "$base/sharded/versions/$versions?rank=1&of=2" -o "$work/half1" &
  p1=$!
  wait "$p0"; wait "$p1"
  t6=$(now); c6=$(cpu_ticks "$daemon_pid")
  # A download cut at half, resumed.
  local half etag
  half=$((last_bytes / 2))
  etag=$(curl -sfI "$base/sharded/versions/$versions" | tr -d '\r' |
         awk -F': ' 'tolower($1) == "etag" { print $2 }')
  curl -sf -r "0-$((half - 1))" "$base/sharded/versions/$versions" -o "$work/resumed"
  curl -sf -H "If-Range: $etag" -r "$half-" "$base/sharded/versions/$versions" >> "$work/resumed"
  t7=$(now)
  [[ "\"$(sha256sum "$work/resumed" | cut -d' ' -f1)\"" == "$etag" ]] ||
    { echo "resumed download differs" >&2; exit 1; }
  local rss
  rss=$(peak_rss_mib "$daemon_pid")
  stop_daemon
  echo "$(elapsed "$t0" "$t1") $((c1 - c0)) $(elapsed "$t1b" "$t2") $((c2 - c1b))" \
       "$(elapsed "$t3" "$t4") $((c4 - c3)) $(elapsed "$t4" "$t5") $((c5 - c4))" \
       "$(elapsed "$t5" "$t6") $((c6 - c5)) $(elapsed "$t6" "$t7") $rss" \
       "$(elapsed "$t2b" "$t2c") $((c2c - c2b))" >> "$work/results"
}

# nginx with WebDAV PUT (start_nginx).
source "$(dirname "$0")/nginx_peer.sh"

# One round of the peers; appends "nginx_put_s nginx_put_shards_s nginx_get_s cp_sync_s zstd_s".
peers_round() {
  rm -rf "$work/www"/* "$work/copy"
  local t0 t1 t2 t3 t4 t5 v
  t0=$(now)
  for v in $(seq "$versions"); do curl -sf -T "${wholes[$((v - 1))]}" "$nginx_url/w$v"; done
  t1=$(now)
  for v in $(seq "$versions"); do push_shards "$v" nginx "$nginx_url"; done
  t2=$(now)
  curl -sf "$nginx_url/w$versions" -o "$work/nginx-last"
  t3=$(now)
  mkdir -p "$work/copy"; cp "${wholes[@]}" "$work/copy/"; sync
  t4=$(now)
  zstd -1 -q -c "${wholes[-1]}" > /dev/null
  t5=$(now)
  echo "$(elapsed "$t0" "$t1") $(elapsed "$t1" "$t2") $(elapsed "$t2" "$t3") $(elapsed "$t3" "$t4")" \
       "$(elapsed "$t4" "$t5")" >> "$work/peers"
}

start_nginx
for _ in $(seq "$rounds"); do
  ckptd_round
  peers_round
done
col() { awk -v c="$2" '{ print $c }' "$1" | median; }
r="$work/results"; p="$work/peers"
part=$((last_bytes / ranks))
echo "files: $versions versions of $((last_bytes / 1000000)) MB, $ranks shards each; $rounds rounds (medians)"
echo "ckptd push, whole (1 curl -T):         $(mbps "$raw" "$(col "$r" 1)") MB/s, $(mb_per_cpu "$raw" "$(col "$r" 2)") MB per daemon CPU-s"
echo "ckptd push, $ranks shards at once:          $(mbps "$raw" "$(col "$r" 3)") MB/s, $(mb_per_cpu "$raw" "$(col "$r" 4)") MB per daemon CPU-s"
echo "ckptd push, ckpt push --connections $ranks:     $(mbps "$raw" "$(col "$r" 13)") MB/s, $(mb_per_cpu "$raw" "$(col "$r" 14)") MB per daemon CPU-s"
echo "ckptd restore, whole (cold):           $(mbps "$last_bytes" "$(col "$r" 5)") MB/s, $(mb_per_cpu "$last_bytes" "$(col "$r" 6)") MB per daemon CPU-s"
echo "ckptd restore, rank 0 of $ranks:            $(col "$r" 7) s, $(mbps "$part" "$(col "$r" 7)") MB/s of its part, $(mb_per_cpu "$part" "$(col "$r" 8)") MB per daemon CPU-s"
echo "ckptd restore, resharded 2 (both):     $(mbps "$last_bytes" "$(col "$r" 9)") MB/s, $(mb_per_cpu "$last_bytes" "$(col "$r" 10)") MB per daemon CPU-s"
echo "ckptd restore, cut at half + Range:    $(mbps "$last_bytes" "$(col "$r" 11)") MB/s (SHA-256 of the whole checked)"
echo "ckptd peak RSS:                        $(col "$r" 12) MiB"
echo "nginx PUT, whole:                      $(mbps "$raw" "$(col "$p" 1)") MB/s"
echo "nginx PUT, $ranks shards at once:           $(mbps "$raw" "$(col "$p" 2)") MB/s"
echo "nginx GET, the last file:              $(mbps "$last_bytes" "$(col "$p" 3)") MB/s"
echo "cp + sync of the whole files:          $(mbps "$raw" "$(col "$p" 4)") MB/s"
echo "zstd -1 of the last file:              $(mbps "$last_bytes" "$(col "$p" 5)") MB/s"
