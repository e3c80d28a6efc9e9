"""The test suite's history: every full run of `invoke test`, green or not, one entry each in
bench/results/suite.json's `history` (oldest first), beside the last run's rows and details, which stay
where their readers (docs/testing.md's table, `bench_reliability.py --from-suite`) find them.

    python bench/suite_history.py merge OTHER_SUITE_JSON

adds the run another checkout recorded (a fresh clone's bench/results/suite.json, copied here) to this
checkout's history and, where it is the newest, takes its rows and details as the latest; the docs'
figure blocks are written again. The same run merged twice is kept once (a run is its commit and start).
OTHER may be of the format before the history (one run, no `history`): its run is read from its rows.

An entry: `commit`, `date`, `started` and `finished` (UTC, where measured), `minutes` (the whole run's
wall clock), `passed`, `failed`, `errors` and `skipped` where any, `failed_tests` (node ids), `lanes_min`
(each lane's minutes: by name where measured, in the lanes' order where transcribed), `how` (how the
run was made: `HPCBOX_SUITE_NOTE` as given, e.g. "fresh clone, engine wiped"), `reverse` (each lane's
modules in reverse order), `load_1min` (the machine's load average as the run started), `machine` (its
kernel's release, which names the host's build, and where measured as the run started its speeds:
bench/machine_speed.py), `exit_status`, and `source`: `measured` by the suite itself, or what else it
was read from (the CHANGELOG's prose, for the runs from before this history).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "results" / "suite.json"
NOTE_VARIABLE = "HPCBOX_SUITE_NOTE"
MEASURED = "measured"
COUNTS = ("passed", "failed", "errors", "skipped")
SPEEDS = (("spawn_ms", "a spawn"), ("python_ms", "the Python loop"))
_LANE = re.compile(r"lane: (.+)")


def entry(
    *,
    commit: str,
    started: str,
    finished: str,
    minutes: float,
    outcomes: dict[str, str],
    errors: set[str],
    lanes_min: dict[str, float],
    how: str | None,
    reverse: bool,
    load_1min: float | None,
    machine: dict | None,
    exit_status: int,
) -> dict:
    """One measured run: ``outcomes`` is every test's (node id → passed, failed, skipped), ``errors`` the
    failed ones that failed outside their call only (set-up, tear-down: pytest's errors)."""
    failed = sorted(test for test, outcome in outcomes.items() if outcome == "failed")
    counts = {
        "passed": sum(outcome == "passed" for outcome in outcomes.values()),
        "failed": sum(test not in errors for test in failed),
        "errors": sum(test in errors for test in failed),
        "skipped": sum(outcome == "skipped" for outcome in outcomes.values()),
    }
    return {
        "commit": commit,
        "date": started[:10],
        "started": started,
        "finished": finished,
        "minutes": round(minutes, 1),
        **{name: count for name, count in counts.items() if count or name in ("passed", "failed")},
        **({"failed_tests": failed} if failed else {}),
        "lanes_min": {lane: round(value, 1) for lane, value in lanes_min.items()},
        **({"how": how} if how else {}),
        **({"reverse": True} if reverse else {}),
        **({"load_1min": round(load_1min, 2)} if load_1min is not None else {}),
        **({"machine": machine} if machine else {}),
        "exit_status": exit_status,
        "source": MEASURED,
    }


def history(result: dict) -> list[dict]:
    """A suite.json's runs, oldest first; one of the format before the history gives its one run."""
    if result.get("history"):
        return list(result["history"])
    return [last_run(result)]


def last_run(result: dict) -> dict:
    """The run a suite.json's rows and details are of: its history's latest, or, in the format before
    the history, read from the rows (the whole suite's row, the lanes') and the details."""
    if result.get("history"):
        return max(result["history"], key=_when)
    rows = result["rows"]
    whole = next(row for row in rows if row["metric"].startswith("the whole suite"))
    counted = {name: int(count) for count, name in re.findall(r"(\d+) (\w+)", whole["note"])}
    tests = (result.get("details") or {}).get("integration tests", {})
    failed = sorted(test for test, each in tests.items() if each["outcome"] == "failed")
    return {
        "commit": result["commit"],
        "date": result["started"][:10],
        "started": result["started"],
        "minutes": whole["value"],
        "passed": counted.get("passed", 0),
        "failed": counted.get("failed", 0),
        **{name: counted[name] for name in ("errors", "skipped") if counted.get(name)},
        **({"failed_tests": failed} if failed else {}),
        "lanes_min": {
            found[1]: row["value"] for row in rows if (found := _LANE.fullmatch(row["metric"])) is not None
        },
        "source": f"{MEASURED} (read from the rows of a suite.json from before its history)",
    }


def key(run: dict) -> tuple:
    """What makes a run itself: its commit and start; a run transcribed without a start, its date and
    figures too (a commit's suite was run twice on one day)."""
    if run.get("started"):
        return (run["commit"], run["started"])
    return (run["commit"], run["date"], run.get("minutes"), run.get("passed"), run.get("how"))


def added(runs: list[dict], run: dict) -> list[dict]:
    """``runs`` with ``run`` in its place by time, unless a run of the same key is there already."""
    if any(key(each) == key(run) for each in runs):
        return list(runs)
    return sorted([*runs, run], key=_when)  # stable: runs of one date keep their order


def merge(ours: dict | None, theirs: dict) -> dict:
    """``ours`` (a suite.json; None where this checkout has none) with ``theirs``'s last run added to its
    history; where that run is the latest, its rows and details become the result's."""
    run = last_run(theirs)
    if ours is None:
        return {**{name: value for name, value in theirs.items() if name != "history"}, "history": [run]}
    runs = added(history(ours), run)
    latest = ours if _when(last_run(ours)) >= _when(run) else theirs
    merged = {name: value for name, value in latest.items() if name != "history"}
    return {**merged, "history": runs}


def green(run: dict) -> bool | None:
    """Whether a run was green: none failed and no error; None where its record does not say."""
    if run.get("failed") is None:
        return None
    return run["failed"] == 0 and not run.get("errors")


def green_streak(runs: list[dict]) -> int:
    """How many of the latest runs, one after another back from the newest, are green."""
    streak = 0
    for run in reversed(runs):
        if not green(run):
            break
        streak += 1
    return streak


def table(result: dict) -> str:
    """The history as docs/testing.md shows it: a line on the latest green runs, the runs by the machine
    they had, then every run, newest first."""
    runs = history(result)
    streak = green_streak(runs)
    said = f"Green in a row, back from the newest: **{streak}**"
    if not runs:
        said = "No full run is recorded yet."
    elif streak == len(runs):
        said += ", every run recorded."
    else:
        stopped = runs[len(runs) - streak - 1]
        why = "its failures not stated" if green(stopped) is None else _outcome(stopped)
        which = "one before them" if streak else "latest"
        said += f" (the {which}, on {stopped['commit'][:7]} of {stopped['date']}: {why})."
    lines = [
        f"`bench/results/suite.json`'s history: {len(runs)} full run{'' if len(runs) == 1 else 's'}. {said}",
        "",
        *by_machine(runs),
        "| date | commit | passed | failed | min | lanes (min) | machine | how | failed tests | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in reversed(runs):
        lanes = run.get("lanes_min") or {}
        shown = ", ".join(str(value) for value in (lanes.values() if isinstance(lanes, dict) else lanes))
        how = "; ".join(
            part for part in (run.get("how"), "modules reversed" if run.get("reverse") else None) if part
        )
        when = run["started"].replace("+00:00", "Z") if run.get("started") else run["date"]
        failed_tests = ", ".join(f"`{test}`" for test in run.get("failed_tests", ()))
        lines.append(
            f"| {when} | {run['commit'][:7]} | {run.get('passed', '')} | {_failures(run)} | "
            f"{run.get('minutes', '')} | {shown} | {_machine(run)} | {how} | {failed_tests} | "
            f"{_source(run)} |"
        )
    return "\n".join(lines)


def by_machine(runs: list[dict]) -> list[str]:
    """The green runs' minutes by the kernel their machine had (a host's build), in the order each first
    ran, with the speeds measured as they started (medians): the same code's minutes on two hosts apart.
    Runs that kept no kernel are left out; nothing where none did."""
    kernels: dict[str, list[dict]] = {}
    for run in runs:
        if kernel := (run.get("machine") or {}).get("kernel"):
            kernels.setdefault(kernel, []).append(run)
    if not kernels:
        return []
    lines = [
        "| machine (kernel) | runs | green | from | to | green runs' min: fastest, median, slowest | "
        "speeds, median |",
        "|---|---|---|---|---|---|---|",
    ]
    for kernel, each in kernels.items():
        minutes = sorted(run["minutes"] for run in each if green(run) and run.get("minutes") is not None)
        spread = f"{minutes[0]}, {statistics.median(minutes):.1f}, {minutes[-1]}" if minutes else ""
        medians = {
            name: statistics.median(measured)
            for name, _ in SPEEDS
            if (measured := [run["machine"][name] for run in each if name in run["machine"]])
        }
        lines.append(
            f"| {kernel} | {len(each)} | {len(minutes)} | {_when(each[0])[:10]} | {_when(each[-1])[:10]} | "
            f"{spread} | {'; '.join(_speeds(medians))} |"
        )
    return [*lines, ""]


def _machine(run: dict) -> str:
    """The kernel the run had (its host's build), and its speeds where they were measured."""
    machine = run.get("machine") or {}
    return "; ".join([machine.get("kernel", ""), *_speeds(machine)]).strip("; ")


def _speeds(measured: dict) -> list[str]:
    """``measured``'s speeds as the tables say them (`0.6 ms a spawn`)."""
    return [f"{measured[name]} ms {what}" for name, what in SPEEDS if name in measured]


def _when(run: dict) -> str:
    return run.get("started") or run["date"]


def _outcome(run: dict, names: tuple[str, ...] = COUNTS[1:]) -> str:
    return ", ".join(f"{run[name]} {name}" for name in names if run.get(name) is not None)


def _failures(run: dict) -> str:
    if run.get("failed") is None:
        return "not stated"
    return ", ".join(
        [str(run["failed"]), *(f"{run[name]} {name}" for name in ("errors", "skipped") if run.get(name))]
    )


def _source(run: dict) -> str:
    source = run.get("source", "")
    return "measured" if source.startswith(MEASURED) else "CHANGELOG.md"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "merge":
        print("usage: python bench/suite_history.py merge OTHER_SUITE_JSON", file=sys.stderr)
        return 2
    theirs = json.loads(Path(argv[1]).read_text())
    ours = json.loads(SUITE.read_text()) if SUITE.exists() else None
    merged = merge(ours, theirs)
    run = last_run(theirs)
    if ours is not None and merged == ours:
        print(f"already recorded: the run on {run['commit'][:12]} of {_when(run)}")
        return 0
    SUITE.write_text(json.dumps(merged, indent=2) + "\n")
    import run as runner  # beside this file, where Python finds a script's neighbours

    runner.write_docs()
    print(
        f"added the run on {run['commit'][:12]} of {_when(run)} ({_outcome(run, COUNTS)}, {run['minutes']} "
        f"min): {len(merged['history'])} runs, the latest {green_streak(merged['history'])} green"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
