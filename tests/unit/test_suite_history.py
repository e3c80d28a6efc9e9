"""The suite's history (bench/suite_history.py): every full run added to bench/results/suite.json, green or
not; another clone's run merged in once however often it is merged, from either format; the table
docs/testing.md shows, newest first, with how many of the latest runs in a row are green."""

from __future__ import annotations

import json
import platform
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

REPO = Path(__file__).resolve().parents[2]
history = conftest._bench("suite_history")

CLONE_RUN = "2026-12-06T10:00:00+00:00"


def _old_format(started: str = CLONE_RUN, commit: str = "c" * 40, note: str = "1 failed, 9 passed") -> dict:
    """A suite.json as written before the history: one run, read from its rows and details."""
    return {
        "benchmark": "suite",
        "started": started,
        "commit": commit,
        "machine": {"cpus": 2},
        "rows": [
            {"metric": "the whole suite, wall clock", "value": 18.2, "unit": "min", "note": note},
            {"metric": "lane: cluster jobs", "value": 17.9, "unit": "min", "note": ""},
            {"metric": "lane: other clusters", "value": 12.0, "unit": "min", "note": ""},
            {"metric": "test_submit.py", "value": 300.0, "unit": "s", "note": "cluster submits: 9 passed"},
        ],
        "details": {
            "integration tests": {
                "tests/integration/test_submit.py::test_a": {"outcome": "failed", "seconds": 3.0},
                "tests/integration/test_submit.py::test_b": {"outcome": "passed", "seconds": 2.0},
            }
        },
    }


def _run(commit: str, when: str, failed: int | None = 0, **more) -> dict:
    at = {"started": when} if "T" in when else {}
    return {"commit": commit, "date": when[:10], **at, "passed": 5, "failed": failed, "minutes": 19.0, **more}


def _report(nodeid: str, when: str, outcome: str, start: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(
        nodeid=nodeid,
        when=when,
        outcome=outcome,
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        duration=1.0,
        start=start,
        stop=start + 60.0,
    )


def test_a_full_run_is_added_to_the_history_the_file_had_with_its_counts_failures_lanes_and_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    suite = tmp_path / "suite.json"
    suite.write_text(
        json.dumps({**_old_format("2026-12-01T08:00:00+00:00"), "history": [_run("a" * 40, "2026-11-30")]})
    )
    recorded = {}
    runner = SimpleNamespace(measured_at=lambda: "b" * 40, record=lambda *args, **kw: recorded.update(kw))
    monkeypatch.setattr(history, "SUITE", suite)
    machine_speed = conftest._bench("machine_speed")
    benches = {"run": runner, "suite_history": history, "machine_speed": machine_speed}
    monkeypatch.setattr(conftest, "_bench", lambda name: benches[name])
    monkeypatch.setenv("HPCBOX_SUITE_NOTE", "fresh clone, under CPU load ")
    recorder = conftest.SuiteDurations()
    lane = "tests/integration/test_submit.py"
    for report in (
        _report(f"{lane}::test_passes", "setup", "passed"),
        _report(f"{lane}::test_passes", "call", "passed", start=120.0),
        _report(f"{lane}::test_fails", "call", "failed"),
        _report(f"{lane}::test_fails", "teardown", "failed"),  # one failed test, not an error more
        _report(f"{lane}::test_set_up_fails", "setup", "failed"),
        _report(f"{lane}::test_tear_down_fails", "call", "passed"),
        _report(f"{lane}::test_tear_down_fails", "teardown", "failed"),
        _report("tests/unit/test_x.py::test_skipped", "setup", "skipped"),
    ):
        recorder.pytest_runtest_logreport(report)
    config = SimpleNamespace(getoption=lambda name: name == "--reverse-modules")
    recorder.pytest_sessionfinish(SimpleNamespace(config=config), exitstatus=1)

    earlier, run = recorded["history"]
    assert earlier["commit"] == "a" * 40
    assert recorded["commit"] == run["commit"] == "b" * 40
    assert (run["passed"], run["failed"], run["errors"], run["skipped"]) == (1, 1, 2, 1)
    assert run["failed_tests"] == [
        f"{lane}::test_fails",
        f"{lane}::test_set_up_fails",
        f"{lane}::test_tear_down_fails",
    ]
    assert run["lanes_min"] == {"cluster submits": 3.0}
    assert (run["how"], run["reverse"], run["exit_status"], run["source"]) == (
        "fresh clone, under CPU load",
        True,
        1,
        "measured",
    )
    assert run["started"] <= run["finished"]
    assert run["machine"]["kernel"] == platform.release()
    assert run["machine"]["spawn_ms"] > 0 and run["machine"]["python_ms"] > 0


def test_a_run_of_the_format_before_the_history_is_read_from_its_rows_and_details():
    run = history.last_run(_old_format())
    assert run["commit"] == "c" * 40 and run["started"] == CLONE_RUN and run["date"] == "2026-12-06"
    assert (run["passed"], run["failed"], run["minutes"]) == (9, 1, 18.2)
    assert run["failed_tests"] == ["tests/integration/test_submit.py::test_a"]
    assert run["lanes_min"] == {"cluster jobs": 17.9, "other clusters": 12.0}
    assert run["source"].startswith(history.MEASURED)
    assert history.history(_old_format()) == [run]


def test_merging_a_clones_run_adds_it_once_and_takes_its_rows_as_the_latest():
    ours = {**_old_format("2026-12-05T07:00:00+00:00", "e" * 40, "3 passed"), "history": []}
    ours["history"] = [_run("d" * 40, "2026-12-04"), history.last_run(ours)]
    theirs = {**_old_format(), "history": [*ours["history"], _run("c" * 40, CLONE_RUN, failed=2)]}

    merged = history.merge(ours, theirs)
    assert [run["commit"][0] for run in merged["history"]] == ["d", "e", "c"]
    assert merged["history"][-1]["failed"] == 2  # its history's own record, not the rows read again
    assert merged["started"] == CLONE_RUN and merged["rows"] == theirs["rows"]
    assert merged["details"] == theirs["details"]
    assert history.merge(merged, theirs) == merged  # the same run again: kept once
    assert history.merge(history.merge(merged, theirs), theirs) == merged


def test_merging_a_run_of_the_old_format_and_an_older_one_keeps_the_latest_rows_ours():
    ours = {**_old_format(), "history": [history.last_run(_old_format())]}
    older = _old_format("2026-12-02T09:00:00+00:00", "f" * 40, "12 passed")
    merged = history.merge(ours, older)
    assert [run["commit"][0] for run in merged["history"]] == ["f", "c"]  # in its place by time
    assert merged["history"][0]["passed"] == 12 and merged["history"][0]["failed"] == 0
    assert merged["started"] == CLONE_RUN and merged["rows"] == ours["rows"]
    assert history.merge(merged, older) == merged
    # Ours of the old format as well: both runs, ours read from its rows.
    both = history.merge(_old_format(), older)
    assert [run["commit"][0] for run in both["history"]] == ["f", "c"]
    # A checkout with no suite.json yet: the clone's file, its run the history.
    assert history.merge(None, older)["history"] == [history.last_run(older)]


def test_the_merge_command_writes_the_file_and_the_docs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    suite, other = tmp_path / "suite.json", tmp_path / "other.json"
    suite.write_text(json.dumps({**_old_format("2026-12-05T07:00:00+00:00", "e" * 40), "history": []}))
    other.write_text(json.dumps(_old_format()))
    written = []
    monkeypatch.setattr(history, "SUITE", suite)
    monkeypatch.setitem(sys.modules, "run", types.SimpleNamespace(write_docs=lambda: written.append(1)))

    assert history.main(["merge", str(other)]) == 0
    assert "added the run on cccccccccccc" in capsys.readouterr().out
    assert [run["commit"][0] for run in json.loads(suite.read_text())["history"]] == ["e", "c"]
    before = suite.read_text()
    assert history.main(["merge", str(other)]) == 0
    assert "already recorded" in capsys.readouterr().out
    assert suite.read_text() == before and written == [1]
    assert history.main(["append", str(other)]) == 2


def test_green_runs_in_a_row_count_back_from_the_newest_and_stop_at_one_not_known_green():
    runs = [_run("a", "2026-11-01"), _run("b", "2026-11-02", failed=None), _run("c", "2026-11-03")]
    assert history.green_streak(runs) == 1
    assert history.green_streak([*runs, _run("d", "2026-11-04", errors=1)]) == 0
    assert history.green_streak([_run("a", "2026-11-01"), _run("c", "2026-11-03")]) == 2


def test_the_table_shows_every_run_newest_first_and_how_many_latest_are_green():
    runs = [
        _run(
            "1" * 40,
            "2026-11-01",
            failed=None,
            source="transcribed from CHANGELOG.md",
            lanes_min=[20.1, 19.0],
        ),
        _run("2" * 40, "2026-11-02", failed=1, errors=2, source="transcribed from CHANGELOG.md"),
        _run("3" * 40, "2026-12-06T09:00:00+00:00", how="fresh clone", reverse=True, source="measured"),
        _run(
            "4" * 40,
            "2026-12-06T10:00:00+00:00",
            lanes_min={"cluster jobs": 18.0},
            failed_tests=[],
            machine={"kernel": "6.18.44-fc-v1300", "spawn_ms": 1.52, "python_ms": 96.0},
            source="measured",
        ),
    ]
    shown = history.table({"history": runs})
    rows = [line for line in shown.splitlines() if re.match(r"\| \d{4}-", line)]
    assert [row.split(" | ")[1] for row in rows] == ["4444444", "3333333", "2222222", "1111111"]
    assert (
        "4 full runs. Green in a row, back from the newest: **2** (the one before them, on 2222222" in shown
    )
    assert "1, 2 errors" in rows[2] and "not stated" in rows[3] and "20.1, 19.0" in rows[3]
    assert "fresh clone; modules reversed" in rows[1] and "2026-12-06T09:00:00Z" in rows[1]
    assert rows[0].endswith("| measured |") and rows[3].endswith("| CHANGELOG.md |")
    assert "| 6.18.44-fc-v1300; 1.52 ms a spawn; 96.0 ms the Python loop |" in rows[0]
    assert "every run recorded" in history.table({"history": runs[2:]})
    assert "**0** (the latest, on 2222222 of 2026-11-02: 1 failed, 2 errors)" in history.table(
        {"history": runs[:2]}
    )


def test_the_recorded_history_is_in_order_each_run_once_and_the_changelogs_runs_quoted_from_it():
    recorded = json.loads((REPO / "bench/results/suite.json").read_text())
    runs = recorded["history"]
    assert [history._when(run) for run in runs] == sorted(history._when(run) for run in runs)
    assert len({history.key(run) for run in runs}) == len(runs)
    assert history.last_run(recorded)["started"] == recorded["started"]
    changelog = re.sub(r"\s+", " ", (REPO / "CHANGELOG.md").read_text())
    transcribed = [run for run in runs if not run["source"].startswith(history.MEASURED)]
    assert transcribed
    for run in transcribed:
        assert "transcribed from CHANGELOG.md" in run["source"] and "started" not in run
        assert run["changelog"] in changelog, run["changelog"]
        assert f"{run['minutes']} min" in run["changelog"]
        # passed, or as "N of M" (the failed, where stated, the rest)
        assert (
            str(run["passed"]) in run["changelog"]
            or f"of {run['passed'] + run['failed']}" in run["changelog"]
        )


def test_the_green_runs_minutes_are_shown_by_the_kernel_each_ran_on_in_the_order_each_first_ran():
    def on(kernel: str, **speeds: float) -> dict:
        return {"machine": {"kernel": kernel, **speeds}}

    runs = [
        _run("a", "2026-12-05T01:00:00+00:00", minutes=17.0, **on("6.18.44-fc-v1252")),
        _run("b", "2026-12-05T02:00:00+00:00", minutes=19.0, **on("6.18.44-fc-v1252")),
        _run("c", "2026-12-05T03:00:00+00:00", failed=2, minutes=9.0, **on("6.18.44-fc-v1252")),
        _run("d", "2026-12-06T01:00:00+00:00", minutes=25.0, **on("6.18.44-fc-v1300", spawn_ms=0.8)),
        _run("e", "2026-12-06T02:00:00+00:00", minutes=24.0),  # no kernel kept: left out of the rows
        _run("f", "2026-12-07T01:00:00+00:00", minutes=27.0, **on("6.18.44-fc-v1300", spawn_ms=0.7)),
        _run("g", "2026-12-07T02:00:00+00:00", minutes=26.0, **on("6.18.44-fc-v1300", spawn_ms=0.9)),
    ]
    rows = [line for line in history.by_machine(runs) if line.startswith("| 6.18")]
    assert rows == [
        "| 6.18.44-fc-v1252 | 3 | 2 | 2026-12-05 | 2026-12-05 | 17.0, 18.0, 19.0 |  |",
        "| 6.18.44-fc-v1300 | 3 | 3 | 2026-12-06 | 2026-12-07 | 25.0, 26.0, 27.0 | 0.8 ms a spawn |",
    ]
    assert history.by_machine(runs[4:5]) == []
    assert "| 6.18.44-fc-v1300 | 3 | 3 |" in history.table({"history": runs})
