"""Benchmark runner: `python bench/run.py [NAME ...]` runs bench/bench_NAME.py, writes
bench/results/NAME.json and prints a table; `python bench/run.py --docs-only` runs nothing and only
rewrites the documents' figure blocks from the files as they are.

A benchmark module exposes `run() -> list[dict]`; each row has metric, value, unit, and optionally a
target (text such as "< 3 s") and a note. Results carry the machine they were measured on, since
numbers only compare within one run on one machine, and the commit they were measured at (`-dirty`
where the checkout had uncommitted changes), which every figure block shows.

A document (README.md, any page under docs/) quotes a figure table between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->`: NAME is a benchmark (its bench/results/NAME.json), `suite_history` (every full
run of the test suite, from bench/results/suite.json's history: bench/suite_history.py) or `digests` (the
recorded digests in digests.toml, which `hpcbox lock --record` writes). Writing results rewrites every
such block (`docs_blocks`), so a figure in the docs is never typed by hand, and a test holds every block
to its file.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "src")]
# The documents whose figure blocks are kept in step with bench/results/ and digests.toml.
DOCUMENTS = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
DIGESTS = REPO / "digests.toml"
_BLOCK = re.compile(r"(<!-- bench:(\w+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.DOTALL)
# What each recorded digest is, in the order the docs show them; a key not listed here is shown last.
DIGEST_FIELDS = {
    "revision": "docker/ at commit",
    "flavour": "flavour",
    "compression": "SIF compression",
    "base_id": "base image id",
    "content_hash": "content hash (the tag: its first 12 hex)",
    "rootfs_sha256": "root filesystem sha256",
    "sif_sha256": "SIF sha256 (the whole file)",
    "sif_size": "SIF size (bytes)",
    "converter": "converter",
}


def available() -> list[str]:
    return sorted(path.stem.removeprefix("bench_") for path in HERE.glob("bench_*.py"))


def run_one(name: str) -> dict:
    module = importlib.import_module(f"bench_{name}")
    started = datetime.datetime.now(datetime.UTC)
    return record(name, started, module.run())


def record(
    name: str,
    started: datetime.datetime,
    rows: list[dict],
    details: dict | None = None,
    commit: str | None = None,
    history: list[dict] | None = None,
) -> dict:
    """Write bench/results/NAME.json (the rows, when and where they were measured, and ``details``: what
    no table shows) and the documents' figure blocks from it; the test suite records its durations
    through this too. ``commit``: that of a run recorded later (default: this checkout's); ``history``:
    every run's record, this one's included (the suite's: bench/suite_history.py)."""
    result = {
        "benchmark": name,
        "started": started.isoformat(timespec="seconds"),
        "commit": commit or measured_at(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            # PYTHONDONTWRITEBYTECODE (as on CI): a command finds only the bytecode ./bootstrap compiled
            "python_writes_bytecode": not sys.flags.dont_write_bytecode,
        },
        "rows": rows,
        **({"details": details} if details else {}),
        **({"history": history} if history else {}),
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_docs()
    return result


def measured_at() -> str:
    """The checkout's commit, `-dirty` where it has uncommitted changes to tracked files other than what
    benchmarks write (bench/results/ and the docs' figure blocks): a run of several benchmarks would
    otherwise call every one after the first dirty."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!docs"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{commit}-dirty" if changed else commit


def write_docs() -> list[Path]:
    """Rewrite every document's figure blocks from the files they quote; the documents that changed."""
    changed = []
    for document in DOCUMENTS:
        text = document.read_text()
        if docs_blocks(text) != text:
            document.write_text(docs_blocks(text))
            changed.append(document)
    return changed


def docs_blocks(text: str, digests: Path = DIGESTS) -> str:
    """``text`` with each figure block rewritten from its file: a benchmark's results, or the digests."""

    def block(found: re.Match) -> str:
        if found[2] == "digests":
            shown = digests_table(digests)
        elif found[2] == "suite_history":
            import suite_history  # beside this file

            shown = suite_history.table(json.loads(suite_history.SUITE.read_text()))
        else:
            shown = table(json.loads((HERE / "results" / f"{found[2]}.json").read_text()))
        # Blank lines around the table: Markdown reads a table only as a paragraph of its own.
        return found[1] + "\n" + shown + "\n\n" + found[4]

    return _BLOCK.sub(block, text)


def table(result: dict) -> str:
    commit = result.get("commit")
    at = (
        f"at commit {commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}"
        if commit
        else ("at a commit it does not record (measured before results named theirs)")
    )
    lines = [
        f"`bench/results/{result['benchmark']}.json`: measured {result['started']} {at} on "
        f"{result['machine']['cpus']} CPUs"
        f"{'' if result['machine'].get('python_writes_bytecode', True) else ', Python writing no bytecode'}.",
        "",
        "| metric | value | unit | target | note |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['metric']} | {_number(row['value'])} | {row['unit']} | {row.get('target') or ''} | "
            f"{row.get('note') or ''} |"
        )
    return "\n".join(lines)


def digests_table(path: Path = DIGESTS) -> str:
    """The recorded digests (what the committed cpu environment builds to) as a table."""
    recorded = tomllib.loads(path.read_text())
    when = recorded.pop("recorded", "")
    keys = [key for key in DIGEST_FIELDS if key in recorded] + sorted(set(recorded) - set(DIGEST_FIELDS))
    lines = [
        f"`{path.name}`: recorded {when} by `hpcbox lock --record`.",
        "",
        "| what | recorded |",
        "|---|---|",
    ]
    for key in keys:
        value = recorded[key]
        shown = _number(value) if isinstance(value, int | float) else f"`{value}`"
        lines.append(f"| {DIGEST_FIELDS.get(key, key)} | {shown} |")
    return "\n".join(lines)


def _number(value: object) -> str:
    """A figure as a table shows it: three significant digits; from 1,000 up, whole, thousands separated."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    shown = f"{value:.3g}"
    return f"{value:,.0f}" if isinstance(value, int) or ("e" in shown and abs(value) >= 1) else shown


def main(argv: list[str]) -> int:
    if argv == ["--docs-only"]:
        for document in write_docs():
            print(f"rewrote the figures in {document.relative_to(REPO)}")
        return 0
    names = argv or available()
    unknown = [name for name in names if name not in available()]
    if unknown:
        print(
            f"error: unknown benchmark {', '.join(unknown)} (choose from: {', '.join(available())})",
            file=sys.stderr,
        )
        return 2
    for name in names:
        print(table(run_one(name)), flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
