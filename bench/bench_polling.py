"""How often a wait on a thousand tasks asks Slurm, on a mini cluster of its own: hpcbox's watch (what
the executor and the Hydra launcher wait through) beside submitit's own watcher, each over an array of
TASKS tasks that takes minutes, waited on task by task as `[job.result() for job in jobs]` does.

- hpcbox: `jobs.watch.Watch` over the real transport (`jobs.look`: one squeue for the unfinished
  jobs, one sacct for those that ended; `jobs.exits_kept` between looks: one command on the login
  node for the exit statuses the tasks' run folders keep, which each task writes as it ends, as
  hpcbox's job script does), each task waited on in turn with `Watch.wait`.
- submitit: its `SlurmInfoWatcher` (sacct of the arrays, on its schedule from the last job registered),
  each task's `is_done` asked once a second, as submitit's `Job.wait` loops; its sacct run over SSH.

Counted two ways: each squeue and sacct the waiter ran (by the minute of the wait; hpcbox's peeks
apart, as they ask the login node's shell, not Slurm), and what Slurm
itself counted of the login user's calls (sdiag's RPCs by user at slurmctld, sacctmgr's at slurmdbd),
before and after. The two waits run one after the other, each over a fresh array of the same tasks.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchkit import free_port
from hpcbox import minicluster
from hpcbox.jobs import exits_kept, look
from hpcbox.jobs.watch import Watch
from hpcbox.ledger import JobRecord
from hpcbox.render.sbatch import OUTCOME_FILE
from hpcbox.tools import ssh

TASKS = 1000
THROTTLE = 24  # tasks at once: 2 nodes of 12 CPUs
RUNS = "bench-polling"  # under the user's home on the cluster: a run folder per array, one per task
# 2 to 6 s, 4 s on average; then the exit status kept in the task's run folder, as the job script keeps it.
TASK = (
    "sleep $((2 + SLURM_ARRAY_TASK_ID % 5)) && "
    f'kept="$HOME/{RUNS}/$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID" && mkdir -p "$kept" && '
    f'echo 0 >"$kept/{OUTCOME_FILE}"'
)
GOAL_PER_MINUTE = 2  # Slurm calls a minute after the first minute (issue 56)


class Counted:
    """A connection whose squeue and sacct calls are counted, by when they were made."""

    def __init__(self, connection: ssh.Connection, started: float) -> None:
        self.connection, self.started = connection, started
        self.calls: list[tuple[float, str]] = []
        self.peeks: list[float] = []

    def run(self, argv, **kwargs):
        if isinstance(argv, str):  # the peek: a shell loop over the run folders
            self.peeks.append(time.monotonic() - self.started)
        else:
            self.calls.append((time.monotonic() - self.started, "sacct" if "sacct" in argv else str(argv[0])))
        return self.connection.run(argv, **kwargs)


def _array(connection: ssh.Connection) -> str:
    submitted = connection.run(
        ["sbatch", "--parsable", f"--array=0-{TASKS - 1}%{THROTTLE}", "--cpus-per-task=1", "--mem=20M",
         "--time=10", "--output=/dev/null", f"--wrap={TASK}"],
        what="submit the array",
    ).stdout  # fmt: skip
    return submitted.strip().split(";")[0]


def _record(job_id: str, home: str) -> JobRecord:
    """The array as a ledger would record it: what a look and a peek need (its id, its tasks, its run
    folder; no script to tell it by, so Slurm's answer is taken as the array's)."""
    return JobRecord(
        job_id=job_id, cluster="local", host="bench", submitted_at="", submit_dir="", script="", log="",
        run_dir=f"{home}/{RUNS}/{job_id}", sif="", sif_sha256="", image="", code_revision="",
        code_snapshot="", dataset_sha256="",
        resources={"array": f"0-{TASKS - 1}%{THROTTLE}"}, trainer_args=(),
        sweep=tuple((str(task),) for task in range(TASKS)),
    )  # fmt: skip


def _slurm_counts(cluster: minicluster.Cluster) -> dict[str, int]:
    """The login user's RPCs as slurmctld (sdiag) and slurmdbd (sacctmgr show stats) count them."""
    counts = {}
    for name, argv in (("slurmctld", ["sdiag"]), ("slurmdbd", ["sacctmgr", "show", "stats"])):
        said = cluster.exec("controller", argv).stdout
        by_user = said.partition("by user")[2]
        found = re.search(rf"^\s*{re.escape(cluster.user)}\s*\(\s*\d+\)\s*count:\s*(\d+)", by_user, re.M)
        counts[name] = int(found[1]) if found else 0
    return counts


def _per_minute(times: list[float]) -> list[int]:
    minutes = [0] * (int(max(times, default=0) // 60) + 1)
    for when in times:
        minutes[int(when // 60)] += 1
    return minutes


def _hpcbox_wait(connection: ssh.Connection, job_id: str, home: str) -> tuple[list[float], float, int]:
    started = time.monotonic()
    counted = Counted(connection, started)
    watch = Watch(
        lambda records: look(counted, records),  # type: ignore[arg-type]
        peek=lambda records: exits_kept(counted, records),  # type: ignore[arg-type]
    )
    watch.add(_record(job_id, home))
    for task in range(TASKS):
        watch.wait(f"{job_id}_{task}")
    return [when for when, _ in counted.calls], time.monotonic() - started, len(counted.peeks)


def _submitit_wait(target: ssh.Target, job_id: str) -> tuple[list[float], float, int]:
    from submitit.slurm.slurm import SlurmInfoWatcher

    started = time.monotonic()
    calls: list[float] = []

    class OverSsh(SlurmInfoWatcher):
        def _make_command(self):
            command = super()._make_command()
            return None if command is None else ssh.ssh_argv(target, command)

        def update(self) -> None:
            if self._make_command() is not None:
                calls.append(time.monotonic() - started)
            super().update()

    watcher = OverSsh(delay_s=60)
    ids = [f"{job_id}_{task}" for task in range(TASKS)]
    for each in ids:
        watcher.register_job(each)
    for each in ids:
        while not watcher.is_done(each):  # submitit's Job.wait: `while not self.done(): sleep(1)`
            time.sleep(1)
    return calls, time.monotonic() - started, 0


def _last_end(connection: ssh.Connection, job_id: str) -> float:
    """Seconds from the array's submission to its last task's end, as sacct has them."""
    rows = connection.run(
        ["sacct", "-X", "-n", "-P", f"--jobs={job_id}", "--format=Submit,End"], what="read the array's times"
    ).stdout.split()
    stamps = [row.split("|") for row in rows]
    epoch = lambda text: time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))  # noqa: E731
    return max(epoch(end) for _, end in stamps) - min(epoch(submit) for submit, _ in stamps)


def _measured(
    cluster: minicluster.Cluster,
    connection: ssh.Connection,
    wait: Callable[[str], tuple[list[float], float, int]],
) -> dict:
    before = _slurm_counts(cluster)
    job_id = _array(connection)
    calls, waited, peeks = wait(job_id)
    after = _slurm_counts(cluster)
    return {
        "minutes": _per_minute(calls),
        "calls": len(calls),
        "peeks": peeks,
        "waited_s": waited,
        "array_s": _last_end(connection, job_id),
        "slurm": {daemon: after[daemon] - before[daemon] for daemon in after},
    }


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-polling-") as work:
        state = Path(work) / "cluster"
        os.environ["HPCBOX_MINICLUSTER_STATE"] = str(state)
        spec = minicluster.ClusterSpec(
            name=f"hpcboxbench-{uuid.uuid4().hex[:8]}",
            port=free_port(),
            cpus_per_node=12,
            memory_mb_per_node=2000,
        )
        try:
            cluster = minicluster.up(spec, state)
            target = cluster.ssh_target()
            with ssh.Connection(target) as connection:
                home = f"/home/{cluster.user}"
                hpcbox = _measured(cluster, connection, lambda job_id: _hpcbox_wait(connection, job_id, home))
                submitit = _measured(cluster, connection, lambda job_id: _submitit_wait(target, job_id))
        finally:
            minicluster.down(spec.name, state)
    return _rows(hpcbox, submitit)


def _rows(hpcbox: dict, submitit: dict) -> list[dict]:
    rows = []
    for name, found in (("hpcbox's watch", hpcbox), ("submitit's watcher", submitit)):
        # The minutes after the first but the last, which the wait's end cuts short (and where the peek
        # brings the look that sees the last task end forward): the by-minute list shows every one.
        full_minutes = found["minutes"][1:-1]
        peeks = f"; and {found['peeks']} peeks at the run folders (no Slurm call)" if found["peeks"] else ""
        rows += [
            _row(f"{name}: Slurm calls in the first minute", found["minutes"][0], "calls", None,
                 f"squeue and sacct it ran; by minute: {found['minutes']}"),
            _row(f"{name}: Slurm calls in a full minute after the first (most)", max(full_minutes, default=0),
                 "calls", f"<= {GOAL_PER_MINUTE}" if name.startswith("hpcbox") else None,
                 f"{found['calls']} in all over {found['waited_s'] / 60:.1f} min, the last minute "
                 f"{found['minutes'][-1]}{peeks}"),
            _row(f"{name}: RPCs slurmctld and slurmdbd counted", sum(found["slurm"].values()), "RPCs", None,
                 "the login user's, sdiag and sacctmgr show stats, before and after: "
                 + ", ".join(f"{daemon} {count}" for daemon, count in found["slurm"].items())),
            _row(f"{name}: wait / the array's own time", found["waited_s"] / found["array_s"], "ratio", None,
                 f"{found['waited_s']:.0f} s waited, {found['array_s']:.0f} s from submission to the last "
                 "task's end (sacct): the rest is the last end seen late"),
        ]  # fmt: skip
    return rows


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "target": target, "note": note}
