#!/usr/bin/python3
"""Ranks that code their own shards, against ranks that send them plain, on the same files in the
same run. RANKS processes (one per rank, as a job's ranks are) push every version of a sharded
run (bench/shard_checkpoints.py: shard-VVV-R.safetensors) to one daemon with the Python client:
  - plain: each rank sends its shard as it is; the daemon codes the assembled version at the
    commit;
  - encoded: each rank codes the chunks its slices hold by its shard's plan, against its part of
    the previous version (kept from its last push), and sends the rest raw; the daemon verifies
    each record by decoding it;
  - encoded, trusted: the same to a daemon that trusts its writers
    (server.decode_encoded_payloads = false).
Peer: nginx taking the same shard files, RANKS at once (curl -T).
Per way: seconds to durable per version (median over the versions after the first: all ranks
start together, the version is durable when the last answer is in), MB the ranks sent (all
versions), the daemon's and the ranks' CPU seconds per GB of checkpoint (utime + stime), and the
stored ratio. One fresh data directory per way.

Usage: /usr/bin/python3 bench/shard_edge_bench.py SHARD_DIR BUILD_DIR [--policy JSON]
"""
import argparse
import glob
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_daemon(build, work, trusted):
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, "ckptd.toml")
    with open(config, "w") as f:
        f.write(f"[server]\ndecode_encoded_payloads = {'false' if trusted else 'true'}\n"
                "[retention]\ninterval_seconds = 0\nafter_push = false\n"
                "[storage]\nrearrange_latest = false\n")
    ready = os.path.join(work, "ready")
    log = open(os.path.join(work, "log"), "w")
    proc = subprocess.Popen([os.path.join(build, "daemon", "ckptd"), "--config", config,
                             "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"),
                             "--ready-file", ready, "--log-level", "warn"],
                            stdout=log, stderr=log)
    for _ in range(3000):
        if os.path.exists(ready) and open(ready).read().strip():
            return proc, f"http://127.0.0.1:{int(open(ready).read())}"
        if proc.poll() is not None:
            raise RuntimeError("ckptd exited during start-up")
        time.sleep(0.01)
    raise RuntimeError("ckptd did not start")


def rank_main(rank, ranks, files, url, encoded, policy, references, barrier, out):
    from ckptd import Client
    from ckptd.safetensors import load_file
    client = Client(url, encoded=encoded, reference_dir=references)
    if rank == 0 and policy:
        client.set_policy("bench", json.loads(policy))
    sent, times = 0, []
    for version, path in enumerate(files, 1):
        tensors, metadata = load_file(path, as_torch=False)
        slices = json.loads(metadata.get("ckptd.slices", "{}"))
        barrier.wait()
        start = time.monotonic()
        answer = client.push_shard("bench", version, rank, ranks, tensors, slices=slices)
        barrier.wait()  # durable once every rank has its answer
        times.append(time.monotonic() - start)
        sent += answer.get("sent_bytes", os.path.getsize(path))
    out.put((rank, sent, times, cpu_seconds(os.getpid())))


def run_way(args, name, encoded, trusted, work):
    ranks = len(glob.glob(os.path.join(args.shard_dir, "shard-001-*.safetensors")))
    versions = len(glob.glob(os.path.join(args.shard_dir, "shard-*-0.safetensors")))
    files = [[os.path.join(args.shard_dir, f"shard-{v:03d}-{r}.safetensors")
              for v in range(1, versions + 1)] for r in range(ranks)]
    daemon, url = start_daemon(args.build, os.path.join(work, name), trusted)
    try:
        context = multiprocessing.get_context("spawn")
        barrier, out = context.Barrier(ranks), context.Queue()
        procs = [context.Process(target=rank_main,
                                 args=(r, ranks, files[r], url, encoded, args.policy,
                                       os.path.join(work, name, f"refs-{r}"), barrier, out))
                 for r in range(ranks)]
        daemon_before = cpu_seconds(daemon.pid)
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        daemon_cpu = cpu_seconds(daemon.pid) - daemon_before
        from ckptd import Client
        stored = Client(url).model("bench")["stored_bytes"]
    finally:
        daemon.terminate()
        daemon.wait()
    raw = sum(os.path.getsize(f) for rank_files in files for f in rank_files)
    times = [max(r[2][v] for r in results) for v in range(versions)]
    return {"way": name, "s_per_version": statistics.median(times[1:] or times),
            "wire_mb": sum(r[1] for r in results) / 1e6, "raw_mb": raw / 1e6,
            "daemon_cpu_s_per_gb": daemon_cpu / (raw / 1e9),
            "ranks_cpu_s_per_gb": sum(r[3] for r in results) / (raw / 1e9),
            "ratio": raw / stored}


def nginx_way(args, work):
    ranks = len(glob.glob(os.path.join(args.shard_dir, "shard-001-*.safetensors")))
    versions = len(glob.glob(os.path.join(args.shard_dir, "shard-*-0.safetensors")))
    script = f"""
set -euo pipefail
work={work}/nginx-peer
mkdir -p "$work"
source {os.path.join(os.path.dirname(os.path.abspath(__file__)), 'nginx_peer.sh')}
start_nginx
trap 'kill $nginx_pid' EXIT
for v in $(seq -f %03g 1 {versions}); do
  s=$(date +%s.%N)
  pids=()
  for r in $(seq 0 {ranks - 1}); do
    curl -s -S -f -T {args.shard_dir}/shard-$v-$r.safetensors "$nginx_url/s-$v-$r" &
    pids+=($!)
  done
  wait "${{pids[@]}}"
  e=$(date +%s.%N)
  echo "$s $e"
done
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("nginx peer: " + done.stderr)
    lines = done.stdout.split("\n")
    times = [float(e) - float(s) for s, e in (line.split() for line in lines if line.strip())]
    return {"way": "nginx PUT", "s_per_version": statistics.median(times[1:] or times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shard_dir")
    parser.add_argument("build")
    parser.add_argument("--policy", default="", help="the model's policy (JSON); default lossless")
    args = parser.parse_args()
    args.shard_dir, args.build = os.path.abspath(args.shard_dir), os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(args.build, "python"))
    work = tempfile.mkdtemp(prefix="ckpt-shard-edge-bench.")
    try:
        rows = [nginx_way(args, work),
                run_way(args, "plain", False, False, work),
                run_way(args, "encoded", True, False, work),
                run_way(args, "encoded, trusted", True, True, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'way':<18} {'s/version':>9} {'wire MB':>9} {'daemon CPU-s/GB':>16} "
          f"{'ranks CPU-s/GB':>15} {'ratio':>7}")
    for row in rows:
        print(f"{row['way']:<18} {row['s_per_version']:>9.2f} {row.get('wire_mb', 0):>9.1f} "
              f"{row.get('daemon_cpu_s_per_gb', 0):>16.2f} {row.get('ranks_cpu_s_per_gb', 0):>15.2f} "
              f"{row.get('ratio', 0):>7.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
