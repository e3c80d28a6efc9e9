"""Every benchmark imports and has its `run()`: a module a move left behind fails here, not at the next
`invoke bench` (lint cannot see an import of a name its package no longer has)."""

from __future__ import annotations

import importlib.util
import json
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


def test_the_cgroup2_lanes_results_time_the_cluster_apart_and_pass_only_with_every_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    lane = _benchmark(BENCH / "cgroup2_lane.py", monkeypatch)
    timings = {"boot_s": 61.0, "load_s": 80.5, "guest_s": 900.0, "guest": {"kernel": "6.1.0-40-amd64"}}
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    (tmp_path / "docker-info.json").write_text(
        json.dumps({"CgroupVersion": "2", "CgroupDriver": "systemd", "MemTotal": 6 * 2**30, "Name": "x"})
    )
    module = "tests/integration/test_minicluster.py"
    names = [
        "test_a_job_over_its_memory_ends_out_of_memory_by_its_cgroup_or_failed_by_the_accounting",
        "test_a_spike_freed_at_once_is_stopped_by_a_cgroup_where_sampling_may_miss_it",
        "test_each_job_runs_on_the_cpus_it_was_given_and_no_more",
        "test_a_gpu_job_sees_only_its_gpus_as_at_a_site_that_constrains_devices",
    ]
    versions = lane.versions()
    assert len(versions) == len(set(versions)) >= 3  # every Slurm version the mini cluster runs
    phases = []
    for slurm in versions:
        first = {"nodeid": f"{module}::{names[0]}", "when": "setup", "outcome": "passed", "seconds": 300.2}
        phases.append({**first, "slurm": slurm})
        for name in names:
            for when, seconds in (("call", 20.0), ("teardown", 0.1)):
                phases.append(
                    {"nodeid": f"{module}::{name}", "when": when, "outcome": "passed", "seconds": seconds}
                    | {"slurm": slurm}
                )
    (tmp_path / "reports.jsonl").write_text("".join(json.dumps(phase) + "\n" for phase in phases))
    rows, details = lane.rows_from(tmp_path)
    assert rows[0]["value"] == 2 and rows[0]["note"].startswith(
        "docker info: Cgroup Version 2, systemd driver"
    )
    assert [row["value"] for row in rows[1:3]] == [61.0, 80.5]  # boot, load
    for index, slurm in enumerate(versions):  # each version: its cluster's start, then its four checks
        own = rows[3 + 5 * index : 8 + 5 * index]
        assert own[0]["metric"].startswith(f"Slurm {slurm}: mini cluster up") and own[0]["value"] == 300.2
        assert [row["note"] for row in own[1:]] == [f"passed: {name}" for name in names]
        assert all(row["metric"].startswith(f"Slurm {slurm}: ") for row in own)
    assert details["engine"]["CgroupVersion"] == "2" and details["engine"]["MemTotalMiB"] == 6144
    assert lane.passed(details)
    phases[-2] = {**phases[-2], "outcome": "failed", "failure": "AssertionError: EPERM"}
    (tmp_path / "reports.jsonl").write_text("".join(json.dumps(phase) + "\n" for phase in phases))
    _, details = lane.rows_from(tmp_path)
    failed = f"{versions[-1]} {module}::{names[-1]}"
    assert not lane.passed(details) and details["tests"][failed]["outcome"] == "failed"
    del details["tests"][failed]
    assert not lane.passed(details)  # a check that did not run is no pass


def test_every_reliability_check_names_a_test_that_exists(monkeypatch: pytest.MonkeyPatch):
    """A renamed test would leave its row's check never run, and the row "not held" for no fault."""
    reliability = _benchmark(BENCH / "bench_reliability.py", monkeypatch)
    repo = BENCH.parent
    for scenario, checks in reliability.SCENARIOS.items():
        for check in checks:
            path, name = check.split("::")
            assert f"def {name}(" in (repo / path).read_text(), f"{scenario}: {check} is no test"
