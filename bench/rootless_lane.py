"""The Python of the rootless lane (.ci/rootless), which runs hpcbox as an ordinary user whose Docker
engine is rootless: the demo whole, and test_minicluster.py's four enforcement tests.

`base` prints the base image the user's engine is given (made on this machine's engine where missing:
an ordinary user cannot bootstrap one); `record OUT COMMIT STARTED` writes bench/results/rootless.json
(and the docs' figure blocks) from what the user's run left in OUT: docker-info.json, timings.json,
demo.log, demo.rc and the tests' JUnit XML, tests.xml.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from cgroup2_lane import ENGINE_FACTS, row
from hpcbox.tools.docker import is_rootless

HERE = Path(__file__).resolve().parent
DIGESTS = HERE.parent / "digests.toml"
# What each enforcement test checks on an engine that gives the nodes no cgroups, as the table says it.
CHECKS = {
    "test_a_job_over_its_memory_ends_out_of_memory": "a job over --mem: FAILED 0:9 by Slurm's accounting",
    "test_a_spike_freed_at_once_is_stopped": "a spike freed within a second: completes or FAILED 0:9",
    "test_each_job_runs_on_the_cpus_it_was_given": "a one-CPU job: bound to one CPU",
    "test_a_gpu_job_sees_only_its_gpus": "GPU device files: each job told its own, every one opens",
}
# The demo's own lines the results keep: the engine's one line, and the demo's time by step.
_CANNOT = re.compile(r"^cluster \S+: (this Docker engine \(rootless.*)$", re.M)
_TOOK = re.compile(r"^hpcbox: the demo took ([\d.]+) s: (.*)$", re.M)
_TRAINED = re.compile(r"^trained \d+ epochs: .*$", re.M)
# The SIF the demo made and sent: the cluster's store names it by its SHA-256.
_SENT_SIF = re.compile(r"^hpcbox: uploading the sif \(.*\) to \S*/images/sha256/([0-9a-f]{64})\.sif$", re.M)


def base() -> str:
    from hpcbox.build import baseimage

    return baseimage.ensure_base(lock=baseimage.own_lock()).ref


def rows_from(out: Path) -> tuple[list[dict], dict]:
    info = json.loads((out / "docker-info.json").read_text())
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    engine = {key: info.get(key) for key in ENGINE_FACTS}
    engine["rootless"] = is_rootless(info)
    said = (
        f"docker info: {'rootless' if engine['rootless'] else 'NOT rootless'}, Cgroup Version "
        f"{engine['CgroupVersion']}, {engine['CgroupDriver']} driver; Docker {engine['ServerVersion']}, "
        f"{engine['OperatingSystem']}, kernel {engine['KernelVersion']}, {engine['NCPU']} CPUs"
    )
    rows = [row("the user's Docker engine runs rootless", int(engine["rootless"]), "", note=said)]
    if "bootstrap_s" in timings:
        rows.append(row("the user's bootstrap (the venv from uv.lock)", timings["bootstrap_s"], "s"))
    demo = (out / "demo.log").read_text() if (out / "demo.log").exists() else ""
    status = (out / "demo.rc").read_text().strip() if (out / "demo.rc").exists() else "not run"
    cannot, took, trained = _CANNOT.search(demo), _TOOK.search(demo), _TRAINED.search(demo)
    demo_passed = status == "0" and bool(cannot and took and trained)
    rows.append(
        row(
            "the demo, as the user: cluster, SIF, upload, job, results",
            float(took[1]) if took else timings.get("demo_s", 0.0),
            "s",
            note=f"{'passed' if demo_passed else 'failed'} (exit {status}): "
            + (f"{trained[0]}; {took[2]}" if trained and took else "see demo.log"),
        )
    )
    pinned = tomllib.loads(DIGESTS.read_text())
    sent = _SENT_SIF.search(demo)
    same_sif = bool(sent) and sent[1] == pinned["sif_sha256"]
    rows.append(
        row(
            "the demo's SIF is digests.toml's, byte for byte",
            int(same_sif),
            "",
            note=f"sent {sent[1][:12] if sent else 'none'}, pinned {pinned['sif_sha256'][:12]} "
            f"({pinned['flavour']}, {pinned['compression']})",
        )
    )
    tests = _tests(out / "tests.xml")
    for name, test in tests.items():
        what = next((check for prefix, check in CHECKS.items() if name.startswith(prefix)), name)
        rows.append(row(what, test["seconds"], "s", note=f"{test['outcome']}: {name}"))
    details = {
        "engine": engine,
        "timings": timings,
        "cluster_said": cannot[1] if cannot else None,
        "demo": {"exit": status, "passed": demo_passed, "tail": demo.splitlines()[-40:]},
        "sif": {"sent": sent[1] if sent else None, "pinned": pinned["sif_sha256"], "same": same_sif},
        "tests": tests,
    }
    return rows, details


def _tests(path: Path) -> dict[str, dict]:
    """Each test case of a JUnit XML file: its outcome, seconds, and the failure's text."""
    if not path.exists():
        return {}
    tests = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome = (
            "skipped" if case.find("skipped") is not None else "failed" if failed is not None else "passed"
        )
        tests[case.get("name", "")] = {"outcome": outcome, "seconds": round(float(case.get("time", 0)), 1)}
        if failed is not None:
            tests[case.get("name", "")]["failure"] = (failed.text or failed.get("message", ""))[-4000:]
    return tests


def passed(details: dict) -> bool:
    """Whether the engine was rootless, the demo passed with the pinned SIF, and every check ran and
    passed."""
    tests = details["tests"]
    checked = {prefix for prefix in CHECKS for name in tests if name.startswith(prefix)}
    every = all(test["outcome"] == "passed" for test in tests.values())
    made = details["engine"]["rootless"] and details["demo"]["passed"] and details["sif"]["same"]
    return made and every and checked == set(CHECKS)


def record(out: Path, commit: str, started: str) -> int:
    """Write bench/results/rootless.json from the user's OUT; 0 if everything passed, 1 if not."""
    sys.path[:0] = [str(HERE)]
    import run

    rows, details = rows_from(out)
    run.record("rootless", datetime.datetime.fromisoformat(started), rows, details=details, commit=commit)
    return 0 if passed(details) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["base"]:
        print(base())
    elif sys.argv[1:2] == ["record"]:
        sys.exit(record(Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
    else:
        sys.exit("usage: rootless_lane.py base | record OUT COMMIT STARTED")
