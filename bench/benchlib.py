"""Shared helpers of the benchmark scripts: the real daemon on a loopback port, disk usage, the
tensors of a safetensors file."""
import http.client
import json
import os
import subprocess
import signal
import socket
import time


def free_port():
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, binary, data_dir, log=None):
        self.binary, self.data_dir, self.log = binary, data_dir, log
        self.proc = None

    def start(self):
        ready = os.path.join(self.data_dir + ".ready")
        if os.path.exists(ready):
            os.remove(ready)
        self.proc = subprocess.Popen([self.binary, "--listen", "127.0.0.1:0", "--data-dir",
                                      self.data_dir, "--ready-file", ready, "--log-level", "warn"],
                                     stdout=self.log, stderr=self.log)
        for _ in range(3000):
            if os.path.exists(ready) and open(ready).read().strip():
                break
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited during start-up")
            time.sleep(0.01)
        self.port = int(open(ready).read())

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)

    def request(self, method, path, body=None):
        status, data = http_request(self.port, method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return data


def http_request(port, method, path, body=None):
    """One request to 127.0.0.1:port; (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def safetensors_arrays(path, dtypes):
    """name -> flat numpy array of every tensor of the safetensors file `path` whose dtype is a
    key of `dtypes` (safetensors name -> numpy dtype); the others are left out."""
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in dtypes:
            continue
        begin, end = info["data_offsets"]
        data = raw[8 + n + begin:8 + n + end]
        out[name] = np.frombuffer(data, dtype=dtypes[info["dtype"]])
    return out


def du_bytes(path):
    """Disk usage as du counts it (allocated blocks), in bytes."""
    return int(subprocess.check_output(["du", "-sk", path]).split()[0]) * 1024


def push_versions(daemon, model, files):
    """PUTs files as versions 1..N of model; (seconds taken, each version's ?detail=1 JSON)."""
    t0 = time.perf_counter()
    for v, body in enumerate(files, start=1):
        daemon.request("PUT", f"/v1/models/{model}/versions/{v}", body)
    seconds = time.perf_counter() - t0
    details = [json.loads(daemon.request("GET", f"/v1/models/{model}/versions/{v}?detail=1"))
               for v in range(1, len(files) + 1)]
    return seconds, details
