#!/usr/bin/env python3
"""Fails when the docs stop being references.

Docs state the present: docs/benchmarks.md holds each benchmark's command and one current
table, what was measured and not kept is in docs/decisions.md, and git keeps the history. This
checks what can be checked mechanically:

- docs/benchmarks.md has at most MAX_BENCHMARK_LINES lines;
- docs/decisions.md exists;
- no doc under docs/ names a commit: no token of 7 to 40 lowercase hex digits holding at least
  one digit and one letter a-f (a SHA-256 of 64 hex digits is not such a token);
- every measured figure README.md quotes is in docs/benchmarks.md, as written. A figure is a
  number (or a range of two) followed by a unit of measurement: an `x` ratio (47.6x, 50x), MB/s,
  GB/s, MiB/s, GiB/s, ms, s after a number with a decimal point (0.34 s), or %. Fenced code
  blocks and inline code are commands and configuration, not figures, and are skipped.
  Thousands separators and the space between number and unit do not count. A README number that
  is not a measurement but reads like one is rephrased, not exempted.

A self-test on temporary trees runs first, every time.

Usage: docs_test.py [REPO_ROOT]  (default: two levels above this script; exit 0: the docs pass,
1: every problem is listed as file:line).
"""

import pathlib
import re
import sys
import tempfile

MAX_BENCHMARK_LINES = 300

# A commit hash: 7 to 40 lowercase hex digits, not part of a longer word or number.
HASH = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")

# A number as written: optional thousands separators, optional decimals.
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_DECIMAL = r"\d{1,3}(?:,\d{3})+\.\d+|\d+\.\d+"
_RANGE_SEP = r"\s*(?:–|—|-|\.\.|to)\s*"
_UNITS = r"x|\s*(?:[MG]B/s|[MG]iB/s|ms|%)"
# A figure: a number or a range, then a unit; "s" (seconds) only after a decimal number, so that
# "every 10 s" style settings do not count while "0.34 s" does.
FIGURE = re.compile(
    r"(?<![\w.,/])(?<![eE][-+])"
    r"(?:"
    rf"(?:(?:{_NUM}){_RANGE_SEP})?(?:{_NUM})(?:{_UNITS})"
    r"|"
    rf"(?:(?:{_DECIMAL}){_RANGE_SEP})?(?:{_DECIMAL})\s*s"
    r")"
    r"(?![A-Za-z0-9])")

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def normalise(text):
    """Drops thousands separators and the spaces inside a figure (number, range, unit)."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = re.sub(rf"(?<=\d){_RANGE_SEP}(?=\d)",
                  lambda m: m.group(0).strip(), text)
    text = re.sub(r"(?<=\d)\s+(?=(?:[MG]B/s|[MG]iB/s|ms|s|%)(?![A-Za-z0-9]))", "", text)
    return text


def readme_figures(text):
    """(line number, figure as written) for every figure outside code in the README."""
    figures = []
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        prose = INLINE_CODE.sub(" ", line)
        for match in FIGURE.finditer(prose):
            figures.append((number, match.group(0)))
    return figures


def figure_in(figure, text):
    """Whether the normalised figure appears in the normalised text as a whole figure."""
    wanted = normalise(figure)
    pattern = r"(?<![\d.,])" + re.escape(wanted) + r"(?![A-Za-z0-9])"
    return re.search(pattern, text) is not None


def check(root):
    """Every problem of the tree at root, as 'file:line: message'."""
    root = pathlib.Path(root)
    problems = []
    docs = root / "docs"
    benchmarks = docs / "benchmarks.md"
    if not benchmarks.is_file():
        problems.append(f"{benchmarks}: missing")
        benchmarks_text = ""
    else:
        benchmarks_text = benchmarks.read_text(encoding="utf-8")
        lines = len(benchmarks_text.splitlines())
        if lines > MAX_BENCHMARK_LINES:
            problems.append(f"{benchmarks}:{lines}: {lines} lines, more than "
                            f"{MAX_BENCHMARK_LINES}: keep one current table per benchmark; what "
                            "was tried goes to docs/decisions.md")
    if not (docs / "decisions.md").is_file():
        problems.append(f"{docs / 'decisions.md'}: missing: what was measured and not kept goes "
                        "there")

    for path in sorted(docs.rglob("*.md")) if docs.is_dir() else []:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in HASH.finditer(line):
                token = match.group(0)
                if re.search(r"[a-f]", token) and re.search(r"\d", token):
                    problems.append(f"{path}:{number}: '{token}' looks like a commit hash: docs "
                                    "state the present, git keeps the history")

    readme = root / "README.md"
    if readme.is_file():
        known = normalise(benchmarks_text)
        for number, figure in readme_figures(readme.read_text(encoding="utf-8")):
            if not figure_in(figure, known):
                problems.append(f"{readme}:{number}: figure '{figure}' is not in "
                                "docs/benchmarks.md: quote it as the table has it, or link to "
                                "the table")
    return problems


def self_test():
    """Checks the checks on temporary trees; returns what went wrong."""
    with tempfile.TemporaryDirectory(prefix="docs-test-") as scratch:
        return _self_test(pathlib.Path(scratch))


def _self_test(scratch):
    failures = []
    trees = iter(range(1000))

    def tree(files):
        directory = scratch / str(next(trees))
        for name, text in files.items():
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return directory

    def expect(label, problems, fragments):
        for fragment in fragments:
            if not any(fragment in problem for problem in problems):
                failures.append(f"self-test, {label}: nothing reported about {fragment!r}; "
                                f"got {problems}")

    benchmarks = ("# Benchmarks\n\n| run | MB/s | ratio |\n|---|---|---|\n"
                  "| a | 431 MB/s | 31.3x |\n| b | 1120 MiB/s | 47.6x |\n\n"
                  "Ready after 0.34 s, p50 11.6 ms, +0.221%, 643–738 MB/s.\n")
    digest = "9f" * 32  # a SHA-256: 64 hex digits, not a commit
    clean = {
        "docs/benchmarks.md": benchmarks,
        "docs/decisions.md": "# Decisions\n",
        "docs/format.md": f"Example digest: {digest}\n",
        "README.md": ("# x\n\nStores 31.3x ([benchmarks](docs/benchmarks.md)); 431 MB/s, "
                      "1,120 MiB/s, ready in 0.34 s, 11.6 ms, +0.221%, 643 – 738 MB/s.\n"
                      "Retries for about 15 s; chunks of 4 MiB; keyframe every 10; `ckpt x 99x`.\n"
                      "```sh\necho 77x 12.5 MB/s\n```\n"),
    }
    problems = check(tree(clean))
    if problems:
        failures.append(f"self-test, clean tree: reported {problems}")

    broken = dict(clean)
    broken["docs/benchmarks.md"] = benchmarks + "filler\n" * 300
    broken["docs/design.md"] = "Measured at commit 3fa9c1e, before the change.\n"
    broken["README.md"] = clean["README.md"] + ("Restores 1.3x faster at 250 MB/s, 2.5 s, 7%, "
                                                "+0.22%, 738 ms, 1,121 MiB/s.\n")
    expect("broken tree", check(tree(broken)),
           ["more than 300", "'3fa9c1e'", "'1.3x'", "'250 MB/s'", "'2.5 s'", "'7%'", "'0.22%'",
            "'738 ms'", "'1,121 MiB/s'"])

    missing = dict(clean)
    del missing["docs/decisions.md"]
    expect("no decisions.md", check(tree(missing)), ["decisions.md: missing"])

    figures = [figure for _, figure in readme_figures(clean["README.md"])]
    for skipped in ("99x", "77x", "12.5 MB/s", "15 s", "4 MiB"):
        if any(skipped in figure for figure in figures):
            failures.append(f"self-test: {skipped!r} counted as a README figure: {figures}")
    return failures


def main():
    failures = self_test()
    if failures:
        print("\n".join(failures))
        return 1
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else \
        pathlib.Path(__file__).resolve().parent.parent.parent
    problems = check(root)
    if problems:
        print("\n".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
