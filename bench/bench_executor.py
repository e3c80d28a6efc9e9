"""What a Python function's round trip through hpcbox.submitit costs, as a ratio to its floor, on an
idle mini cluster of its own.

- one call: `executor.submit(identity, x).result()` (pickled, shipped as the job's dataset, sbatch,
  the job in the environment SIF on node scratch, its result fetched and unpickled), beside the floor:
  a fresh `ssh LOGIN sbatch` of a trivial script already there (one `echo`), polled until it ends over
  a kept connection, then `cat` of its output. ROUNDS rounds, each first in turn; medians.
- `map_array` of POINTS points to the last result, beside its floor: `sbatch --array=0-(POINTS-1)` of
  the trivial script, waited out, and its POINTS outputs read in one `cat`.

Both sides ask for the same resources (the project's memory for the local cluster, ten minutes), so
the difference is hpcbox's: the pickles, the upload, the job script's staging and clean-up, Apptainer's
start, the fetch. The environment image, its SIF on the cluster and the code there exist before the
clock starts (a first call has sent them, as a user's has).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import copy_project, free_port
from hpcbox import minicluster
from hpcbox.build.image import build_image, record_image
from hpcbox.project.config import load_project
from hpcbox.tools import slurm, ssh

ROUNDS = 15  # a floor moves by seconds (0.99-3.53 s in 7 rounds) with where its job falls in Slurm's passes
POINTS = 100
MEM = "640M"  # the project's own request for the local cluster ([tool.hpcbox.resources.local])
FLOOR_SCRIPT = "bench-call-floor.sh"
FLOOR_TEXT = f"#!/bin/sh\n#SBATCH --job-name=floor\n#SBATCH --time=10\n#SBATCH --mem={MEM}\necho 42\n"
CALLS = "def identity(value):\n    return value\n"


def _floor(target: ssh.Target, connection: ssh.Connection, array: int | None = None) -> float:
    """Seconds from a fresh `ssh LOGIN sbatch` to its output read back: the job (or every task of the
    array) ended, then `cat` of what it wrote."""
    started = time.perf_counter()
    words = ["sbatch", "--parsable", "--output=floor-%A_%a.out" if array else "--output=floor-%j.out"]
    words += [f"--array=0-{array - 1}"] if array else []
    done = subprocess.run(
        ssh.ssh_argv(target, [*words, FLOOR_SCRIPT]), capture_output=True, text=True, check=True
    )
    job_id = slurm.parse_job_id(done.stdout)
    while True:
        found = slurm.task_states(connection, job_id) if array else None
        ended = (
            found and len(found) == array and all(each.finished for each in found.values())
            if array
            else (state := slurm.job_state(connection, job_id)) is not None and state.finished
        )
        if ended:
            break
        time.sleep(0.1)
    pattern = f"floor-{job_id}_*.out" if array else f"floor-{job_id}.out"
    outputs = connection.run(f"cat {pattern}", what="read the floor's output").stdout.split()
    if outputs != ["42"] * (array or 1):
        raise RuntimeError(f"the floor's job {job_id} wrote {outputs[:5]}...")
    took = time.perf_counter() - started
    connection.run(f"rm -f {pattern}", what="tidy the floor's outputs")
    return took


def _idle(connection: ssh.Connection) -> None:
    idle = 'test -z "$(squeue --noheader)" && test -z "$(sinfo --noheader --format=%T | grep -vx idle)"'
    while connection.run(idle, what="wait for an idle cluster", check=False).returncode != 0:
        time.sleep(0.3)


def run() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-executor-") as work:
        root = copy_project(Path(work) / "project")
        (root / "src" / "hpctrain" / "bench_calls.py").write_text(CALLS)
        sys.path.insert(0, str(root / "src"))
        project = load_project(root)
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
        state = root / ".hpcbox" / "cluster"
        os.environ.update({"HPCBOX_CACHE": str(Path(work) / "cache"), "HPCBOX_MINICLUSTER_STATE": str(state)})
        image = build_image(project, flavour="cpu", offline=True, say=quiet, on_line=quiet)
        record_image(project, image)
        from hpctrain.bench_calls import identity  # type: ignore[import-not-found]

        from hpcbox.submitit import Executor

        measured: dict[str, list[float]] = {"call": [], "floor": [], "to_job_id": []}
        try:
            cluster = minicluster.up(spec, state)
            target = cluster.ssh_target()
            executor = Executor(
                Path(work) / "calls", "local", mini_cluster=spec.name, project=root, say=quiet
            )
            executor.update_parameters(timeout_min=10)
            if executor.submit(identity, "first").result() != "first":  # sends the SIF and the code
                raise RuntimeError("the first call did not come back")
            with ssh.Connection(target) as connection:
                connection.run(
                    f"cat > {FLOOR_SCRIPT}", input_bytes=FLOOR_TEXT.encode(), what="write the floor"
                )
                for round_number in range(ROUNDS):
                    for kind in ("call", "floor") if round_number % 2 == 0 else ("floor", "call"):
                        _idle(connection)
                        if kind == "floor":
                            measured["floor"].append(_floor(target, connection))
                            continue
                        started = time.perf_counter()
                        job = executor.submit(identity, round_number)
                        measured["to_job_id"].append(time.perf_counter() - started)
                        if job.result() != round_number:
                            raise RuntimeError("a call came back wrong")
                        measured["call"].append(time.perf_counter() - started)
                _idle(connection)
                started = time.perf_counter()
                mapped = executor.map_array(identity, range(POINTS))
                if mapped[-1].result() != POINTS - 1 or [job.result() for job in mapped] != list(
                    range(POINTS)
                ):
                    raise RuntimeError("map_array came back wrong")
                array_seconds = time.perf_counter() - started
                _idle(connection)
                array_floor = _floor(target, connection, array=POINTS)
        finally:
            minicluster.down(spec.name, state)
    return _rows(measured, array_seconds, array_floor)


def _rows(measured: dict[str, list[float]], array_seconds: float, array_floor: float) -> list[dict]:
    call, floor = statistics.median(measured["call"]), statistics.median(measured["floor"])
    ratio = statistics.median(c / f for c, f in zip(measured["call"], measured["floor"], strict=True))

    def runs(kind: str) -> str:
        return ", ".join(f"{each:.2f}" for each in measured[kind])

    return [
        _row("one call: submit to result", call, "s", None,
             f"`executor.submit(identity, x).result()`, median of {ROUNDS}; runs {runs('call')}"),
        _row("one call: submit to job id", statistics.median(measured["to_job_id"]), "s", None,
             f"pickled, shipped in ship's one command, sbatch; runs {runs('to_job_id')}"),
        _row("floor: ssh sbatch, wait, cat", floor, "s", None,
             f"a trivial script, same --mem and --time; median of {ROUNDS}; runs {runs('floor')}"),
        _row("one call / floor", ratio, "ratio", "<= 1.0", "each call over its round's floor, the median"),
        _row(f"map_array of {POINTS}: to the last result", array_seconds, "s", None,
             "one array job; every result fetched and unpickled"),
        _row(f"floor: sbatch --array of {POINTS}, wait, cat", array_floor, "s", None,
             "the same resources each task"),
        _row(f"map_array of {POINTS} / floor", array_seconds / array_floor, "ratio", "<= 1.5", None),
    ]  # fmt: skip


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "target": target, "note": note}
