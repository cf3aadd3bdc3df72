#!/usr/bin/env bash
# Installs the Python client (client-lib/python) into a virtual environment that also sees
# Debian's own packages (PyTorch, numpy: python3-torch), offline: Debian 12's pip refuses to
# install into the system Python (PEP 668), and a plain venv lacks the wheel package that
# building the client needs. The client is built from a copy, so nothing is written into the
# checkout. NATIVE_MODULE, the codec module the build made (<build>/python/ckptd/_native*.so),
# goes into the package: without it the client works, and its encoded pushes and pulls are
# coded by the daemon.
#
#   scripts/install-python-client.sh VENV [NATIVE_MODULE]
#   (make python-client: VENV = build/venv, the module of the Release build)
set -euo pipefail

venv=${1:?usage: install-python-client.sh VENV [NATIVE_MODULE]}
native=${2:-}
source_dir=$(cd "$(dirname "$0")/../client-lib/python" && pwd)
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$source_dir" "$work/ckptd-client"
rm -rf "$work/ckptd-client/ckptd/__pycache__"
if [[ -n "$native" ]]; then
  cp "$native" "$work/ckptd-client/ckptd/"
fi
TMPDIR="$work" "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-index \
  --no-deps --force-reinstall "$work/ckptd-client"
if [[ -n "$native" ]]; then
  "$venv/bin/python" -c "import ckptd; assert ckptd.edge.available()" \
    || { echo "install-python-client: the native module does not import" >&2; exit 1; }
fi
echo "ckptd's Python client is installed in $venv: run $venv/bin/python, or" \
     ". $venv/bin/activate"
