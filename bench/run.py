"""Benchmark runner: `python bench/run.py [NAME ...]` runs bench/bench_NAME.py, writes
bench/results/NAME.json and prints a table.

A benchmark module exposes `run() -> list[dict]`; each row has metric, value, unit, and optionally a
target (text such as "< 3 s") and a note. Results carry the machine they were measured on, since
numbers only compare within one run on one machine.

A document quotes a benchmark's table between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`: writing
the results rewrites that block from them (`docs_blocks`), so a figure there is never typed by hand,
and a test holds every block to its results file.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]
# The documents whose bench blocks are kept in step with bench/results/.
DOCUMENTS = (HERE.parent / "README.md", *sorted((HERE.parent / "docs").glob("*.md")))
_BLOCK = re.compile(r"(<!-- bench:(\w+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.DOTALL)


def available() -> list[str]:
    return sorted(path.stem.removeprefix("bench_") for path in HERE.glob("bench_*.py"))


def run_one(name: str) -> dict:
    module = importlib.import_module(f"bench_{name}")
    started = datetime.datetime.now(datetime.UTC)
    rows = module.run()
    result = {
        "benchmark": name,
        "started": started.isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    for document in DOCUMENTS:
        text = document.read_text()
        if docs_blocks(text) != text:
            document.write_text(docs_blocks(text))
    return result


def docs_blocks(text: str) -> str:
    """``text`` with each bench block rewritten from its benchmark's results file."""

    def block(found: re.Match) -> str:
        result = json.loads((HERE / "results" / f"{found[2]}.json").read_text())
        return found[1] + table(result) + "\n" + found[4]

    return _BLOCK.sub(block, text)


def table(result: dict) -> str:
    lines = [
        f"## {result['benchmark']} ({result['started']}, {result['machine']['cpus']} cpus)",
        "",
        "| metric | value | unit | target | note |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        value = row["value"]
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        lines.append(
            f"| {row['metric']} | {shown} | {row['unit']} | {row.get('target') or ''} | "
            f"{row.get('note') or ''} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
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
