#!/usr/bin/env bash
# Installs the Python client (client-lib/python) into a virtual environment that also sees
# Debian's own packages (PyTorch, numpy: python3-torch), offline: Debian 12's pip refuses to
# install into the system Python (PEP 668), and a plain venv lacks the wheel package that
# building the client needs. The client is built from a copy, so nothing is written into the
# checkout.
#
#   scripts/install-python-client.sh VENV     (make python-client: VENV = build/venv)
set -euo pipefail

venv=${1:?usage: install-python-client.sh VENV}
source_dir=$(cd "$(dirname "$0")/../client-lib/python" && pwd)
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$source_dir" "$work/ckptd-client"
rm -rf "$work/ckptd-client/ckptd/__pycache__"
TMPDIR="$work" "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-index \
  --no-deps --force-reinstall "$work/ckptd-client"
echo "ckptd's Python client is installed in $venv: run $venv/bin/python, or" \
     ". $venv/bin/activate"
