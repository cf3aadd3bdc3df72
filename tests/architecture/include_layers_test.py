#!/usr/bin/env python3
"""Fails when a source file includes a layer above its own.

Parts depend one way (base <- codec <- storage <- api <- daemon; client-lib uses base and codec): a part includes the public headers (`ckpt/<part>/...`) of the parts below it and of
itself. Inside a part's `src/`, the folders are layers, listed lowest first in LAYERS; a file
includes headers of its own folder and of folders below it, never above, and never a sibling
folder at the same level (backends/local and backends/rados). Where the files directly in
`src/` sit is part of each order (storage's front on top, api's handler below its server). A
folder missing from LAYERS is an error: a new folder gets a named place in the order.

Usage: include_layers_test.py [REPO_ROOT]  (exit 0: every include points down or sideways
within its folder; 1: the offending lines are listed).
"""

import pathlib
import re
import sys

# Which parts' public headers each part may include.
ALLOWED_PARTS = {
    "base": {"base"},
    "codec": {"base", "codec"},
    "storage": {"base", "codec", "storage"},
    "api": {"base", "codec", "storage", "api"},
    "daemon": {"base", "codec", "storage", "api", "daemon"},
    "client-lib": {"base", "codec", "client"},
}
# The public include directory of each part (ckpt/<name>/...).
PUBLIC_NAME = {"client-lib": "client"}

# Folder layers inside each part's private sources, lowest first; "" stands for the files
# directly in src/. Parts not listed here are flat.
LAYERS = {
    "codec/src": ["entropy", "lossy", ""],
    "storage/src": ["engine", "records", "backends", "uploads", "context", "read", "chains",
                    "maintenance", "write", ""],
    # The request handler and what it uses; the HTTP server around it.
    "api/src": ["", "server"],
}
# Headers every part may include: generated at build time, below every part.
SHARED = {"ckpt/version.h"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def part_of(rel):
    return rel.parts[0]


def layer_of(src_root, rel):
    """The folder path (under src_root) a file sits in, as a tuple; () for src/ itself."""
    return tuple(rel.relative_to(src_root).parts[:-1])


def check_file(root, path, problems):
    rel = path.relative_to(root)
    part = part_of(rel)
    allowed = ALLOWED_PARTS[part]
    src_root = next((pathlib.Path(k) for k in LAYERS if rel.is_relative_to(k)), None)
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        match = INCLUDE.match(line)
        if not match:
            continue
        target = match.group(1)
        where = f"{rel}:{number}: {line.strip()}"
        if target in SHARED:
            continue
        if target.startswith("ckpt/"):
            other = target.split("/")[1]
            if other not in allowed:
                problems.append(f"{where}\n    {part} may not include ckpt/{other}/ "
                                f"(allowed: {', '.join(sorted(allowed))})")
            continue
        if src_root is None:
            continue  # a flat part's private header
        order = LAYERS[str(src_root)]
        own = layer_of(src_root, rel)
        target_folder = tuple(pathlib.PurePosixPath(target).parts[:-1])
        own_top = own[0] if own else ""
        target_top = target_folder[0] if target_folder else ""
        if own_top not in order or target_top not in order:
            missing = own_top if own_top not in order else target_top
            problems.append(f"{where}\n    folder {src_root}/{missing}/ has no place in "
                            f"LAYERS of {__file__}")
            continue
        if order.index(target_top) > order.index(own_top):
            problems.append(f"{where}\n    {own_top or 'src/'} includes upward "
                            f"({target_top or 'src/'}); order: {' -> '.join(o or 'src/' for o in order)}")
        elif (own_top == target_top and own[1:2] and target_folder[1:2]
              and own[1:2] != target_folder[1:2]):
            problems.append(f"{where}\n    {'/'.join(own)} includes its sibling "
                            f"{'/'.join(target_folder)}")


def check_tree(root):
    """Every problem in the tree at root, and how many files were checked."""
    problems = []
    checked = 0
    for part in ALLOWED_PARTS:
        base = root / part
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix in (".h", ".cc") and path.is_file():
                check_file(root, path, problems)
                checked += 1
    return problems, checked


def self_test():
    """The guard catches what it must: an upward include, a sibling backend, a part above."""
    import tempfile
    cases = {
        "storage/src/engine/a.h": '#include "write/push_session.h"',
        "storage/src/backends/local/b.cc": '#include "backends/rados/rados_layout.h"',
        "storage/src/read/c.cc": '#include "store_open.h"',
        "codec/src/d.cc": '#include "ckpt/storage/checkpoint_store.h"',
        "client-lib/src/e.cc": '#include "ckpt/storage/checkpoint_store.h"',
        "storage/src/attic/f.cc": '#include "records/records.h"',
    }
    fine = {
        "storage/src/write/g.cc": '#include "read/chain_reader.h"\n#include "ckpt/base/status.h"',
        "storage/src/backends/rados/h.cc": '#include "backends/store_backend.h"',
        "storage/src/i.cc": '#include "write/push_session.h"',
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in {**cases, **fine}.items():
            path = pathlib.Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        problems, _ = check_tree(pathlib.Path(tmp))
    flagged = {p.split(":")[0] for p in problems}
    missed = set(cases) - flagged
    wrong = set(fine) & flagged
    for name in sorted(missed):
        print(f"self-test: not caught: {name}: {cases[name]}")
    for name in sorted(wrong):
        print(f"self-test: flagged although allowed: {name}")
    return not missed and not wrong


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[2])
    if not self_test():
        return 1
    problems, checked = check_tree(root)
    if checked == 0:
        print(f"no sources under {root}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem)
    print(f"{checked} files checked, {len(problems)} upward includes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
