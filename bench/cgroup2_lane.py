"""The Python of the cgroup v2 lane (.ci/cgroup2), which proves the mini cluster's enforcement on a real
cgroup v2 Docker engine: one in a QEMU guest, since this project's machines are cgroup v1.

On the host, `images` prints the node image (built here if missing) and the base it stands on, which
the lane carries into the guest; `record OUT` writes bench/results/cgroup2.json (and the docs' figure
blocks) from what the guest left in OUT. In the guest, it is the pytest plugin (`-p cgroup2_lane`) that
writes each phase of each test to the file HPCBOX_CG2_REPORTS names, one JSON object a line, so that
the cluster's start (the first test's set-up) is timed apart from the checks.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORTS_VARIABLE = "HPCBOX_CG2_REPORTS"
# What each enforcement test checks, as the results table says it (the lane runs these, no others).
CHECKS = {
    "test_a_job_over_its_memory_ends_out_of_memory": "a job over --mem: OUT_OF_MEMORY by its cgroup",
    "test_a_spike_freed_at_once_is_stopped": "a spike freed within a second: OUT_OF_MEMORY",
    "test_each_job_runs_on_the_cpus_it_was_given": "a one-CPU job: confined to one CPU",
    "test_a_gpu_job_sees_only_its_gpus": "GPU device files: a job opens only its own",
}


# What the results keep of `docker info` in the guest.
ENGINE_FACTS = ("ServerVersion", "CgroupVersion", "CgroupDriver", "KernelVersion", "OperatingSystem", "NCPU")


def pytest_runtest_logreport(report) -> None:
    """Each phase of each test as it ends: its node id, phase, outcome and seconds."""
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    line["seconds"] = round(report.duration, 1)
    if report.failed:
        line["failure"] = str(report.longrepr)[-4000:]
    with open(os.environ[REPORTS_VARIABLE], "a") as reports:
        reports.write(json.dumps(line) + "\n")


def images() -> list[str]:
    """The node image of this checkout (built on this engine where missing) and its base."""
    from hpcbox.build import baseimage
    from hpcbox.minicluster.node_image import ensure_image

    node = ensure_image(on_line=lambda line: print(line, file=sys.stderr))
    return [node.ref, baseimage.ensure_base(lock=baseimage.own_lock()).ref]


def check_of(nodeid: str) -> str | None:
    name = nodeid.split("::")[-1]
    return next((what for prefix, what in CHECKS.items() if name.startswith(prefix)), None)


def rows_from(out: Path) -> tuple[list[dict], dict]:
    """The results table's rows and details from the guest's OUT folder: its timings (timings.json),
    its engine (docker-info.json) and its tests' phases (reports.jsonl)."""
    timings = json.loads((out / "timings.json").read_text())
    info = json.loads((out / "docker-info.json").read_text())
    phases = [json.loads(line) for line in (out / "reports.jsonl").read_text().splitlines() if line]
    engine = {key: info.get(key) for key in ENGINE_FACTS}
    engine["MemTotalMiB"] = round(info.get("MemTotal", 0) / 2**20)
    said = (
        f"docker info: Cgroup Version {engine['CgroupVersion']}, {engine['CgroupDriver']} driver; Docker "
        f"{engine['ServerVersion']}, {engine['OperatingSystem']}, kernel {engine['KernelVersion']}, "
        f"{engine['NCPU']} CPUs, {engine['MemTotalMiB']} MiB"
    )
    rows = [
        _row(
            "the guest's Docker engine: its cgroup version", int(engine["CgroupVersion"] or 0), "", note=said
        ),
        _row("guest boot to the lane's start (kernel, systemd, dockerd)", timings["boot_s"], "s"),
        _row("node images into the guest's engine (docker load)", timings["load_s"], "s"),
    ]
    setups = [phase for phase in phases if phase["when"] == "setup"]
    if setups:
        rows.append(
            _row(
                "mini cluster up in the guest (2 compute nodes): the first test's set-up",
                setups[0]["seconds"],
                "s",
            )
        )
    tests: dict[str, dict] = {}
    for phase in phases:
        test = tests.setdefault(phase["nodeid"], {"outcome": "passed", "seconds": 0.0})
        if phase["when"] == "call":
            test["seconds"] = phase["seconds"]
        if phase["outcome"] == "failed" or (phase["outcome"] == "skipped" and test["outcome"] == "passed"):
            test["outcome"] = phase["outcome"]
        if "failure" in phase:
            test["failure"] = phase["failure"]
    for nodeid, test in tests.items():
        what = check_of(nodeid) or nodeid.split("::")[-1]
        rows.append(_row(what, test["seconds"], "s", note=f"{test['outcome']}: {nodeid.split('::')[-1]}"))
    rows.append(_row("the whole guest run (boot to the lane's end)", timings["guest_s"], "s"))
    details = {"engine": engine, "guest": timings.get("guest", {}), "tests": tests}
    return rows, details


def _row(metric: str, value: float, unit: str, note: str = "") -> dict:
    return {"metric": metric, "value": value, "unit": unit, "note": note}


def record(out: Path, commit: str, started: str) -> int:
    """Write bench/results/cgroup2.json from the guest's OUT; 0 if every check passed, 1 if not."""
    sys.path[:0] = [str(HERE)]
    import run

    rows, details = rows_from(out)
    when = datetime.datetime.fromisoformat(started)
    run.record("cgroup2", when, rows, details=details, commit=commit)
    return 0 if passed(details) else 1


def passed(details: dict) -> bool:
    """Whether every check ran in the guest and passed."""
    checked = {check_of(nodeid) for nodeid in details["tests"]} - {None}
    every = all(test["outcome"] == "passed" for test in details["tests"].values())
    return every and checked == set(CHECKS.values())


if __name__ == "__main__":
    if sys.argv[1:2] == ["images"]:
        print(" ".join(images()))
    elif sys.argv[1:2] == ["record"]:
        sys.exit(record(Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
    else:
        sys.exit("usage: cgroup2_lane.py images | record OUT COMMIT STARTED")
