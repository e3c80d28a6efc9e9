"""What `hpcbox submit` costs a user, as a ratio to the floor: a bare `ssh login sbatch` on the same cluster.

Every submit is the whole command as a user types it, `python -m hpcbox submit --cluster=local ...` in a
subprocess (the interpreter's start, the imports and the earlier stages' up-to-date checks included),
timed from its start to its exit (it prints the job id) and on to the job RUNNING on an idle mini
cluster. The environment image and its SIF are built before the clock starts (a user has built them).

- first: to a cluster that has nothing (it sends the SIF, the dataset and the code);
- steady state, the SIF already on the cluster: nothing changed (nothing sent), and a code-only change
  (a new code snapshot sent), each beside the floor: `ssh` to the login node (a fresh connection, the
  options hpcbox uses) running `sbatch --parsable` of a trivial script already there. The three are
  interleaved, ROUNDS rounds in a rotating order; the rows are medians, the ratios medians over them.

Every job is cancelled once RUNNING and waited out before the next command, so each starts on an idle
cluster. While each submitted job runs, `hpcbox status -j JOB` is timed beside its floor, a bare
`ssh LOGIN squeue -j JOB` (a fresh connection), each first in turn. A command finds the SSH master
the last one left (tools/ssh.py), as a user's next command within a few minutes does; the floors
never do.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchkit import copy_project, free_port
from hpcbox import jobs, minicluster
from hpcbox.build.image import build_image
from hpcbox.cli.demo import make_dataset
from hpcbox.project.config import load_project
from hpcbox.tools import slurm, ssh

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 7
# What the floor submits: a script already on the login node, which only waits to be cancelled.
FLOOR_SCRIPT = "bench-floor.sh"
FLOOR_TEXT = "#!/bin/sh\n#SBATCH --job-name=floor\n#SBATCH --time=10\nsleep 600\n"
SUBMIT_ARGS = ("--cluster=local", "--offline", "--job-name=bench", "--time=10")
TRAINER_ARGS = ("--", "--epochs", "1000")
SQUEUE_FLOOR = ("squeue", "--states=all", "-j")


def _hpcbox(root: Path, env: dict[str, str], *argv: str) -> tuple[float, str]:
    """Run `python -m hpcbox ARGV` in the project as a user does: (seconds to its exit, its stdout)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *argv],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"hpcbox {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return took, done.stdout


def _until_running_then_cancel(
    connection: ssh.Connection, job_id: str, started: float, while_running: Callable[[], None] = lambda: None
) -> float:
    """Seconds from ``started`` until the job is RUNNING; then ``while_running``, and cancel it and wait
    until it has ended."""
    deadline = time.monotonic() + 120
    while True:
        found = slurm.job_state(connection, job_id)
        if found is not None and found.state == "RUNNING":
            to_running = time.perf_counter() - started
            break
        if (found is not None and found.finished) or time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not run: {found}")
        time.sleep(0.1)
    while_running()
    slurm.cancel(connection, job_id)
    while not ((found := slurm.job_state(connection, job_id)) is None or found.finished):
        time.sleep(0.3)
    # Idle again: no job left and every node out of COMPLETING (its epilog, the job's clean-up done).
    idle = 'test -z "$(squeue --noheader)" && test -z "$(sinfo --noheader --format=%T | grep -vx idle)"'
    while connection.run(idle, what="wait for an idle cluster", check=False).returncode != 0:
        time.sleep(0.3)
    return to_running


def _submit(
    root: Path,
    env: dict[str, str],
    data: Path,
    connection: ssh.Connection,
    project,
    while_running: Callable[[str], None] = lambda _job_id: None,
) -> dict:
    """The whole `hpcbox submit` command: to the job id, to RUNNING, and what it sent; ``while_running``
    is given the job id once it runs."""
    started = time.perf_counter()
    to_job_id, out = _hpcbox(root, env, "submit", *SUBMIT_ARGS, f"--data={data}", *TRAINER_ARGS)
    job_id = out.split()[-1]
    to_running = _until_running_then_cancel(connection, job_id, started, lambda: while_running(job_id))
    record = jobs.Ledger(project).find(job_id, "local")
    return {
        "job_id": job_id,
        "to_job_id": to_job_id,
        "to_running": to_running,
        "bytes": record.bytes_sent,
        "sent": record.sent,
    }


def _status(root: Path, env: dict[str, str], job_id: str) -> dict:
    """The whole `hpcbox status -j JOB` command, to its exit."""
    took, out = _hpcbox(root, env, "status", "-j", job_id)
    if not out.startswith(f"job {job_id}:"):
        raise RuntimeError(f"hpcbox status said {out!r}")
    return {"seconds": took}


def _status_floor(target: ssh.Target, job_id: str) -> dict:
    """A bare `ssh LOGIN squeue -j JOB --states=all`: a fresh connection."""
    started = time.perf_counter()
    subprocess.run(ssh.ssh_argv(target, [*SQUEUE_FLOOR, job_id]), capture_output=True, check=True)
    return {"seconds": time.perf_counter() - started}


def _floor(target: ssh.Target, connection: ssh.Connection) -> dict:
    """A bare `ssh LOGIN sbatch --parsable SCRIPT`: a fresh connection, as each hpcbox command opens one."""
    started = time.perf_counter()
    done = subprocess.run(
        ssh.ssh_argv(target, ["sbatch", "--parsable", FLOOR_SCRIPT]),
        capture_output=True,
        text=True,
        check=True,
    )
    to_job_id = time.perf_counter() - started
    to_running = _until_running_then_cancel(connection, slurm.parse_job_id(done.stdout), started)
    return {"to_job_id": to_job_id, "to_running": to_running}


def _change_code(root: Path) -> None:
    init = root / "src" / "hpctrain" / "__init__.py"
    init.write_text(init.read_text() + f"\n# bench {uuid.uuid4().hex}\n")


def run() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-submit-") as work:
        root = copy_project(Path(work) / "project")
        project = load_project(root)
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
        # The project's own SIF cache, and its mini cluster: nothing of this checkout's is used or left.
        state = root / ".hpcbox" / "cluster"
        env = {**os.environ, "HPCBOX_CACHE": str(Path(work) / "cache"), "HPCBOX_MINICLUSTER": spec.name}
        env["HPCBOX_MINICLUSTER_STATE"] = str(state)  # not the user's state folder
        image = build_image(project, flavour="cpu", offline=True, say=quiet, on_line=quiet)
        data = make_dataset(project, image.ref, say=quiet)
        measured: dict[str, list[dict]] = {
            "floor": [], "unchanged": [], "code": [], "status": [], "status_floor": []
        }  # fmt: skip
        try:
            cluster = minicluster.up(spec, state)
            target = cluster.ssh_target()
            # The environment image and its SIF exist before the clock starts (a user has built them);
            # a dry run builds and converts, and sends nothing.
            _hpcbox(root, env, "submit", *SUBMIT_ARGS, f"--data={data}", "--dry-run", *TRAINER_ARGS)
            with ssh.Connection(target) as connection:
                connection.run(
                    f"cat > {FLOOR_SCRIPT}", input_bytes=FLOOR_TEXT.encode(), what="write the floor's script"
                )
                scheduler = _scheduler(connection)
                first = _submit(root, env, data, connection, project)
                kinds = ("floor", "unchanged", "code")
                for round_number in range(ROUNDS):

                    def ask_status(job_id: str, first_asked: int = round_number % 2) -> None:
                        # hpcbox status and its floor on the running job, in turns first.
                        for asked in (first_asked, 1 - first_asked):
                            if asked:
                                measured["status"].append(_status(root, env, job_id))
                            else:
                                measured["status_floor"].append(_status_floor(target, job_id))

                    for kind in kinds[round_number % 3 :] + kinds[: round_number % 3]:
                        if kind == "floor":
                            measured[kind].append(_floor(target, connection))
                            continue
                        if kind == "code":
                            _change_code(root)
                        measured[kind].append(_submit(root, env, data, connection, project, ask_status))
        finally:
            minicluster.down(spec.name, state)
    return _rows(first, measured, scheduler)


def _scheduler(connection: ssh.Connection) -> str:
    """The cluster's SchedulerParameters (how often its main scheduler passes over pending jobs)."""
    config = connection.run(["scontrol", "show", "config"], what="ask Slurm how it schedules").stdout
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SchedulerParameters":
            return value.strip()
    return "(none)"


def _rows(first: dict, measured: dict[str, list[dict]], scheduler: str) -> list[dict]:
    def median(kind: str, key: str) -> float:
        return statistics.median(each[key] for each in measured[kind])

    def runs(kind: str, key: str) -> str:
        return ", ".join(f"{each[key]:.2f}" for each in measured[kind])

    def ratio(kind: str, key: str, floor_kind: str = "floor") -> float:
        # Each command over the floor of its own round; the median of those.
        return statistics.median(
            mine[key] / floor[key] for mine, floor in zip(measured[kind], measured[floor_kind], strict=True)
        )

    def sent(kind: str) -> str:
        kinds = sorted({", ".join(each["sent"]) or "nothing" for each in measured[kind]})
        return " / ".join(kinds)

    command = f"`python -m hpcbox submit {' '.join(SUBMIT_ARGS)} --data=DIGITS.tar -- ...`"
    floor = f"`ssh LOGIN {shlex.join(['sbatch', '--parsable', FLOOR_SCRIPT])}`, a fresh connection"
    of_rounds = f"median of {ROUNDS}, interleaved with the floor"
    pass_note = (
        f"then Slurm's own scheduling (SchedulerParameters {scheduler}): a job not started at submission "
        "waits for the scheduler's next pass"
    )
    rows = [
        _row("first submit: whole command to job id", first["to_job_id"], "s", None,
             f"{command}; sent {', '.join(first['sent'])} (cpu environment SIF)"),
        _row("first submit: to RUNNING", first["to_running"], "s", None,
             f"polled over SSH every 0.1 s; {pass_note}"),
        _row("first submit: bytes sent", first["bytes"], "bytes", None,
             "rsync's count, plus the code archive"),
        _row("floor: ssh + sbatch to job id", median("floor", "to_job_id"), "s", None,
             f"{floor}; median of {ROUNDS}, interleaved with the submits; runs {runs('floor', 'to_job_id')}"),
        _row("floor: ssh + sbatch to RUNNING", median("floor", "to_running"), "s", None,
             f"{pass_note}; runs {runs('floor', 'to_running')}"),
        _row("nothing changed: whole command to job id", median("unchanged", "to_job_id"), "s", None,
             f"sent {sent('unchanged')}; {of_rounds}; runs {runs('unchanged', 'to_job_id')}"),
        _row("nothing changed / floor, to job id", ratio("unchanged", "to_job_id"), "ratio", "<= 10", None),
        _row("nothing changed: to RUNNING", median("unchanged", "to_running"), "s", None,
             f"runs {runs('unchanged', 'to_running')}"),
        _row("nothing changed / floor, to RUNNING", ratio("unchanged", "to_running"), "ratio", None,
             "as noisy as Slurm's passes"),
        _row("code-only change: whole command to job id", median("code", "to_job_id"), "s", "<= 3 s",
             f"sent {sent('code')}; {of_rounds}; runs {runs('code', 'to_job_id')}"),
        _row("code-only change / floor, to job id", ratio("code", "to_job_id"), "ratio", "<= 2", None),
        _row("code-only change: to RUNNING", median("code", "to_running"), "s", "<= 5 s",
             f"runs {runs('code', 'to_running')}"),
        _row("code-only change / floor, to RUNNING", ratio("code", "to_running"), "ratio", None,
             "as noisy as Slurm's passes"),
        _row("code-only change: bytes sent", int(median("code", "bytes")), "bytes", "<= 1 MB",
             f"sent {sent('code')}"),
        _row("code-only change / first submit, to job id", median("code", "to_job_id") / first["to_job_id"],
             "ratio", None, None),
        _row("floor: ssh + squeue -j", median("status_floor", "seconds"), "s", None,
             f"`ssh LOGIN {shlex.join(SQUEUE_FLOOR)} JOB`, a fresh connection; median of {2 * ROUNDS}; "
             f"runs {runs('status_floor', 'seconds')}"),
        _row("status: whole command", median("status", "seconds"), "s", None,
             f"`python -m hpcbox status -j JOB` of a running job; median of {2 * ROUNDS}, beside the floor; "
             f"runs {runs('status', 'seconds')}"),
        _row("status / floor", ratio("status", "seconds", "status_floor"), "ratio", "<= 2", None),
    ]  # fmt: skip
    return rows


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3) if isinstance(value, float) else value, "unit": unit,
            "target": target, "note": note}  # fmt: skip
