#!/usr/bin/python3
"""Runs the README's quick start, line by line as a new user would, in a clean directory.

Usage: readme_quickstart_test.py --build DIR (the CMake build holding ckptd and ckpt).

Two steps are done from the build at hand instead of rebuilding: `make install` is the same
`cmake --install` into a temporary prefix (after checking that the Makefile's target runs it),
and `make python-client` runs the script that target runs, into a temporary venv. The daemon
the quick start starts listens on a free port the test picks (the CLI is told by $CKPT_SERVER),
and the next line waits for it to be ready (its output goes to a file: a background job
holding the pipe would keep the run from ending). Every other line runs verbatim, and each must
succeed. Exits 77 (skipped) without Debian's python3-venv."""
import argparse
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick_start_lines():
    """The shell lines of the README's first ```sh block under "## Quick start"."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Quick start"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def make_dry_run(target):
    return subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="CMake build directory")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    if subprocess.run(["/usr/bin/python3", "-c", "import ensurepip"]).returncode != 0:
        print("skipped: /usr/bin/python3 has no venv support (Debian: python3-venv)")
        return 77
    assert "cmake --install" in make_dry_run("install"), "make install no longer runs cmake --install"
    assert "install-python-client.sh" in make_dry_run("python-client")

    work = tempfile.mkdtemp(prefix="ckpt-quickstart-")
    prefix = os.path.join(work, "prefix")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = os.path.join(work, "ready")
    script = ["set -euo pipefail", f"export HOME={work}"]
    for line in quick_start_lines():
        command = line.split("#")[0].strip() if not line.lstrip().startswith("build/venv") \
            else line
        if command.startswith("make install"):
            script.append(f"cmake --install {build} --prefix {prefix} > /dev/null")
            script.append(f"export PATH={prefix}/bin:$PATH")
        elif command.startswith("make python-client"):
            # With the build's native codec module, as make passes the Release build's.
            native = " ".join(glob.glob(os.path.join(build, "python", "ckptd", "_native*.so")))
            script.append(f"{ROOT}/scripts/install-python-client.sh {work}/build/venv {native}")
        elif command.startswith("ckptd "):
            assert command.endswith("&"), line
            script.append(f"{command[:-1].strip()} --listen 127.0.0.1:{port} "
                          f"--ready-file {ready} --log-level warn > ckptd.log 2>&1 &")
            script.append("echo $! > ckptd.pid")
            script.append(f"for i in $(seq 300); do [ -s {ready} ] && break; sleep 0.1; done")
            script.append(f"[ -s {ready} ]")
            script.append(f"export CKPT_SERVER=http://127.0.0.1:{port}")
        else:
            script.append(line)
    try:
        result = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, text=True,
                                capture_output=True, timeout=300)
        print(result.stdout)
        print(result.stderr, file=sys.stderr)
        assert result.returncode == 0, f"the quick start failed (exit {result.returncode})"
        assert os.path.exists(os.path.join(prefix, "bin", "ckpt"))
        for name in ("step-100.safetensors", "restored.safetensors"):
            assert os.path.exists(os.path.join(work, name)), name
        with open(os.path.join(work, "step-100.safetensors"), "rb") as a, \
                open(os.path.join(work, "restored.safetensors"), "rb") as b:
            assert a.read() == b.read(), "restored file differs from the pushed one"
        assert "pushed run1@100" in result.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as page:
            assert page.status == 200 and b"run1" in page.read()
        assert not os.path.exists(os.path.join(ROOT, "client-lib", "python", "ckptd.egg-info"))
        print("the README's quick start works as written")
        return 0
    finally:
        pid_file = os.path.join(work, "ckptd.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                pid = int(f.read())
            try:
                os.kill(pid, 15)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
