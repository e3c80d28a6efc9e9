"""The Python of the cgroup v2 lane (.ci/cgroup2), which proves the mini cluster's enforcement on a real
cgroup v2 Docker engine: one in a QEMU guest, since this project's machines are cgroup v1.

On the host, `versions` prints the Slurm versions the mini cluster runs, for each of which the guest
runs the checks; `images` prints their node images (built here if missing) and the base they stand on,
which the lane carries into the guest; `record OUT` writes bench/results/cgroup2.json (and the docs'
figure blocks) from what the guest left in OUT. In the guest, it is the pytest plugin (`-p
cgroup2_lane`) that writes each phase of each test, with the Slurm version it ran on, to the file
HPCBOX_CG2_REPORTS names, one JSON object a line, so that each cluster's start (the first test's
set-up) is timed apart from the checks.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORTS_VARIABLE = "HPCBOX_CG2_REPORTS"
SLURM_VARIABLE = "HPCBOX_TEST_SLURM"  # tests/fixtures/cluster.py's: the session cluster's version
SLURM_CHOICE_VARIABLE = "HPCBOX_CG2_SLURM"
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
    line["slurm"] = os.environ[SLURM_VARIABLE]
    line["seconds"] = round(report.duration, 1)
    if report.failed:
        line["failure"] = str(report.longrepr)[-4000:]
    with open(os.environ[REPORTS_VARIABLE], "a") as reports:
        reports.write(json.dumps(line) + "\n")


def every_version() -> list[str]:
    """Every Slurm version the mini cluster runs, the default first."""
    from hpcbox.minicluster.versions import DEFAULT, SUITES

    return [DEFAULT, *sorted(set(SUITES) - {DEFAULT})]


def versions() -> list[str]:
    """The versions this run checks: every one, or those HPCBOX_CG2_SLURM names (space-separated), for
    a run that looks into one (whose results do not pass: `passed` asks for every version)."""
    from hpcbox.minicluster.versions import check

    chosen = os.environ.get(SLURM_CHOICE_VARIABLE, "").split()
    return [check(version, SLURM_CHOICE_VARIABLE) for version in chosen] or every_version()


def images() -> list[str]:
    """The node images of this checkout, one per Slurm version (built on this engine where missing),
    and their base."""
    from hpcbox.build import baseimage
    from hpcbox.minicluster.node_image import ensure_image

    nodes = [ensure_image(slurm=slurm, on_line=_to_stderr).ref for slurm in versions()]
    return [*nodes, baseimage.ensure_base(lock=baseimage.own_lock()).ref]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


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
        row(
            "the guest's Docker engine: its cgroup version", int(engine["CgroupVersion"] or 0), "", note=said
        ),
        row("guest boot to the lane's start (kernel, systemd, dockerd)", timings["boot_s"], "s"),
        row("node images into the guest's engine (docker load)", timings["load_s"], "s"),
    ]
    tests: dict[str, dict] = {}  # by "VERSION NODEID"
    for slurm in dict.fromkeys(phase["slurm"] for phase in phases):
        ran = [phase for phase in phases if phase["slurm"] == slurm]
        setups = [phase for phase in ran if phase["when"] == "setup"]
        if setups:
            rows.append(
                row(
                    f"Slurm {slurm}: mini cluster up in the guest (2 compute nodes): the first test's set-up",
                    setups[0]["seconds"],
                    "s",
                )
            )
        for phase in ran:
            test = tests.setdefault(f"{slurm} {phase['nodeid']}", {"outcome": "passed", "seconds": 0.0})
            if phase["when"] == "call":
                test["seconds"] = phase["seconds"]
            failed = phase["outcome"] == "failed"
            if failed or (phase["outcome"] == "skipped" and test["outcome"] == "passed"):
                test["outcome"] = phase["outcome"]
            if "failure" in phase:
                test["failure"] = phase["failure"]
        for key, test in tests.items():
            version, nodeid = key.split(" ", 1)
            if version == slurm:
                what = f"Slurm {slurm}: {check_of(nodeid) or nodeid.split('::')[-1]}"
                note = f"{test['outcome']}: {nodeid.split('::')[-1]}"
                rows.append(row(what, test["seconds"], "s", note=note))
    rows.append(row("the whole guest run (boot to the lane's end)", timings["guest_s"], "s"))
    details = {"engine": engine, "guest": timings.get("guest", {}), "tests": tests}
    return rows, details


def row(metric: str, value: float, unit: str, note: str = "") -> dict:
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
    """Whether every check ran in the guest on every Slurm version and passed."""
    checked = {(key.split(" ", 1)[0], check_of(key.split(" ", 1)[1])) for key in details["tests"]}
    every = all(test["outcome"] == "passed" for test in details["tests"].values())
    wanted = {(slurm, check) for slurm in every_version() for check in CHECKS.values()}
    return every and checked >= wanted


if __name__ == "__main__":
    if sys.argv[1:2] == ["versions"]:
        print(" ".join(versions()))
    elif sys.argv[1:2] == ["images"]:
        print(" ".join(images()))
    elif sys.argv[1:2] == ["record"]:
        sys.exit(record(Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
    else:
        sys.exit("usage: cgroup2_lane.py versions | images | record OUT COMMIT STARTED")
