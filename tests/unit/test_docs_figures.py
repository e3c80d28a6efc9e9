"""A figure in the docs is read from a results file, never typed: every bench block is what its file gives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_bench_block_in_the_docs_is_its_results_file_as_bench_run_writes_it():
    runner = _runner()
    blocks = 0
    for document in runner.DOCUMENTS:
        text = document.read_text()
        blocks += text.count("<!-- bench:")
        assert runner.docs_blocks(text) == text, (
            f"{document.name}: a bench block differs from bench/results/: run `invoke bench --name NAME`"
        )
    assert blocks >= 1


def test_a_typed_figure_in_a_block_is_put_back_as_the_results_file_says(tmp_path: Path):
    runner = _runner()
    written = runner.docs_blocks(
        "before\n<!-- bench:offlock -->\n| typed | 1 |\n<!-- /bench:offlock -->\nafter\n"
    )
    assert "| typed | 1 |" not in written and written.startswith(
        "before\n<!-- bench:offlock -->\n## offlock ("
    )
    assert written.endswith("|\n<!-- /bench:offlock -->\nafter\n")
