"""Every benchmark imports and has its `run()`: a module a move left behind fails here, not at the next
`invoke bench` (lint cannot see an import of a name its package no longer has)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("path", sorted(BENCH.glob("bench_*.py")), ids=lambda path: path.stem)
def test_a_benchmark_imports_and_has_run(path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))  # as bench/run.py runs them: beside benchkit.py
    spec = importlib.util.spec_from_file_location(f"hpcbox_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # a dataclass finds its module there
    spec.loader.exec_module(module)
    assert callable(module.run)
