#!/usr/bin/python3
"""PyTorch Distributed Checkpoint through ckptd against DCP's own file storage, same run.

RANKS gloo processes hold a ShardedTensor state (rows split over the ranks): weights and both
Adam moments of MIB MiB in all, F32; each next version moves the weights and moments by a small
step. For each storage, VERSIONS versions are saved with save_state_dict (every rank at once,
timed from a barrier to the end of the save on every rank) and the last one loaded by the same
ranks with load_state_dict into zeroed tensors (timed the same way):
  - DCP's FileSystemWriter / FileSystemReader into a fresh directory (fsync of every file);
  - ckptd.dcp.Writer / Reader, lossless (the default policy);
  - the same, every rank coding its shard (Client(encoded=True); needs ckptd's native module);
  - ckptd.dcp, lossy with the full-state preset (weights within 5e-3).
Prints per storage: MB/s of state (bytes ÷ seconds) for the first save, the later ones
(median) and the load, and the ratio the store reports (raw ÷ stored) or the directory's
bytes, and the largest error of a loaded weight (the moments have pointwise bounds). The
daemon runs on the same cores as the ranks.

Usage: /usr/bin/python3 bench/dcp_bench.py BUILD_DIR [--ranks 4] [--mib 256] [--versions 3]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True


def tensor_names():
    return [f"model.layers.{i}.weight" for i in range(4)] + \
        [f"optim.state.model.layers.{i}.weight.exp_avg" for i in range(4)] + \
        [f"optim.state.model.layers.{i}.weight.exp_avg_sq" for i in range(4)]


def rank_state(torch, rank, ranks, mib, version):
    """This rank's rows of every tensor at `version`, as ShardedTensors."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards
    names = tensor_names()
    rows_total = 1024 * ranks
    cols = max(1, mib * (1 << 20) // 4 // len(names) // rows_total)
    rows = rows_total // ranks
    state = {}
    for i, name in enumerate(names):
        g = torch.Generator().manual_seed(1000 * i + rank)
        part = torch.randn(rows, cols, generator=g) * 0.02
        for _ in range(1, version):
            part += torch.randn(rows, cols, generator=g) * 1e-4
        if name.endswith("exp_avg_sq"):
            part = part.square()
        shard = Shard(tensor=part, metadata=ShardMetadata(
            shard_offsets=[rank * rows, 0], shard_sizes=[rows, cols],
            placement=f"rank:{rank}/cpu"))
        state[name] = init_from_local_shards([shard], rows_total, cols)
    state["train.step"] = version * 100
    return state


def timed(dist, run):
    """Seconds `run` takes on every rank, from a barrier to the next."""
    dist.barrier()
    start = time.monotonic()
    run()
    dist.barrier()
    return time.monotonic() - start


def rank_main(rank, ranks, port, work, url, mib, versions, storages):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.environ["CKPT_PYTHON_PACKAGE_DIR"])
    import ckptd
    import ckptd.dcp
    dcp = ckptd.dcp.checkpoint_module()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    timings = {}
    for storage in storages:
        client = ckptd.Client(url, progress=False, encoded=storage == "ckptd-encoded",
                              reference_dir=os.path.join(work, f"references-{rank}"))
        model = storage
        directory = os.path.join(work, "files")
        saves = []
        for version in range(1, versions + 1):
            state = rank_state(torch, rank, ranks, mib, version)
            writer = dcp.FileSystemWriter(os.path.join(directory, f"v{version}")) \
                if storage == "files" else ckptd.dcp.Writer(client, model, version)
            saves.append(timed(dist, lambda: dcp.save_state_dict(state, storage_writer=writer)))
        state = rank_state(torch, rank, ranks, mib, 1)
        for value in state.values():
            if hasattr(value, "local_shards"):
                value.local_shards()[0].tensor.zero_()
        reader = dcp.FileSystemReader(os.path.join(directory, f"v{versions}")) \
            if storage == "files" else ckptd.dcp.Reader(client, model, versions)
        load = timed(dist, lambda: dcp.load_state_dict(state, storage_reader=reader))
        want = rank_state(torch, rank, ranks, mib, versions)
        worst = max(float((state[n].local_shards()[0].tensor
                           - want[n].local_shards()[0].tensor).abs().max())
                    for n in tensor_names() if n.startswith("model."))
        timings[storage] = {"saves": saves, "load": load, "worst": worst}
    if rank == 0:
        with open(os.path.join(work, "timings.json"), "w") as f:
            json.dump(timings, f)
    dist.destroy_process_group()


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage:")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", help="the build directory (daemon, Python package)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256, help="MiB of state in all")
    parser.add_argument("--versions", type=int, default=3)
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    os.environ["CKPT_PYTHON_PACKAGE_DIR"] = os.path.join(build, "python")
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.environ["CKPT_PYTHON_PACKAGE_DIR"])
    import benchlib
    import ckptd
    import torch.multiprocessing as mp

    work = tempfile.mkdtemp(prefix="ckptd-dcp-bench-")
    daemon = benchlib.Daemon(os.path.join(build, "daemon", "ckptd"), os.path.join(work, "data"))
    daemon.start()
    try:
        url = f"http://127.0.0.1:{daemon.port}"
        client = ckptd.Client(url, progress=False)
        client.set_policy("ckptd-lossy", {"preset": "full-state",
                                          "lossless_tensors": ["*.step"]})
        storages = ["files", "ckptd", "ckptd-lossy"]
        if ckptd.edge.available():
            storages.insert(2, "ckptd-encoded")
        mp.spawn(rank_main, args=(args.ranks, benchlib.free_port(), work, url, args.mib, args.versions,
                                  storages), nprocs=args.ranks, join=True)
        with open(os.path.join(work, "timings.json")) as f:
            timings = json.load(f)
        state_bytes = args.mib << 20
        print(f"{args.ranks} ranks, {args.mib} MiB of state, {args.versions} versions; "
              f"build {build}\n")
        print("| storage | save v1 MB/s | later saves MB/s (median) | load MB/s | ratio | "
              "weights' worst error |")
        print("|---|---|---|---|---|---|")
        for storage, t in timings.items():
            if storage == "files":
                stored = directory_bytes(os.path.join(work, "files"))
                raw = state_bytes * args.versions
            else:
                versions = client.versions(storage)
                stored = sum(v["stored_bytes"] for v in versions)
                raw = sum(v["raw_bytes"] for v in versions)
            later = statistics.median(t["saves"][1:]) if len(t["saves"]) > 1 else float("nan")
            print(f"| {storage} | {state_bytes / 1e6 / t['saves'][0]:.0f} | "
                  f"{state_bytes / 1e6 / later:.0f} | {state_bytes / 1e6 / t['load']:.0f} | "
                  f"{raw / stored:.2f}x | {t['worst']:.2g} |")
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
