"""Every benchmark imports and has its `run()`: a module a move left behind fails here, not at the next
`invoke bench` (lint cannot see an import of a name its package no longer has)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _benchmark(path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))  # as bench/run.py runs them: beside benchkit.py
    spec = importlib.util.spec_from_file_location(f"hpcbox_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # a dataclass finds its module there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(BENCH.glob("bench_*.py")), ids=lambda path: path.stem)
def test_a_benchmark_imports_and_has_run(path: Path, monkeypatch: pytest.MonkeyPatch):
    assert callable(_benchmark(path, monkeypatch).run)


def test_reliability_read_from_a_suite_run_holds_a_check_only_where_every_case_passed(
    monkeypatch: pytest.MonkeyPatch,
):
    reliability = _benchmark(BENCH / "bench_reliability.py", monkeypatch)
    declared = [test for tests in reliability.SCENARIOS.values() for test in tests]
    passed = {test: {"outcome": "passed", "seconds": 1.0} for test in declared}
    failing, parametrized = declared[0], reliability.SCENARIOS[next(reversed(reliability.SCENARIOS))][0]
    suite = {"details": {"integration tests": {**passed, failing: {"outcome": "failed", "seconds": 1.0}}}}
    suite["details"]["integration tests"][f"{parametrized}[one case]"] = {"outcome": "skipped", "seconds": 0}
    rows = reliability.from_suite(suite)
    held = {check: ok for row in rows for check, ok in row["checks"].items()}
    assert held.pop(failing.split("::")[-1]) is False and held.pop(parametrized.split("::")[-1]) is False
    assert all(held.values()) and len(rows) == len(reliability.SCENARIOS)
