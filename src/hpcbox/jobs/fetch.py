"""A job's results home: its run folder and logs into runs/<cluster>/<job>/, and its efficiency report."""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from hpcbox.errors import HpcboxError
from hpcbox.jobs.follow import log_words, state
from hpcbox.jobs.tracked import MlflowFigures, WandbFigures, whole_lines_past
from hpcbox.ledger import JobRecord
from hpcbox.project.command import ContainerCommand, Steps, runs_example_trainer
from hpcbox.project.config import ProjectConfig
from hpcbox.tools import slurm, ssh


def local_run_dir(project: ProjectConfig, record: JobRecord) -> Path:
    """runs/<cluster>/<run> here: the job id, or `<id>-<n>` where an earlier job here had that id (a
    sweep's task: its folder in the sweep's)."""
    return project.runs_dir / record.where / record.run_folder


def shown_run_dir(project: ProjectConfig, record: JobRecord) -> str:
    """``local_run_dir`` as a line says it: relative to the project where it is inside it."""
    local = local_run_dir(project, record)
    return str(local.relative_to(project.root)) if local.is_relative_to(project.root) else str(local)


def fetched(project: ProjectConfig, record: JobRecord) -> bool:
    """Whether anything of the job's has been fetched here."""
    local = local_run_dir(project, record)
    return local.is_dir() and any(local.iterdir())


def fetched_logs(project: ProjectConfig, record: JobRecord) -> list[Path]:
    """The copies of the job's logs that a fetch brought here (an array's: every task's; a task's: its
    own, fetched with it or with its sweep), its output's first."""
    local = local_run_dir(project, record)
    folders = (local,) if record.task is None else (local, local.parent)
    return [
        copy
        for log in (record.log, record.error_log)
        if log
        for folder in folders
        for copy in sorted(folder.glob(PurePosixPath(log).name))
    ]


def has_results(connection: ssh.Connection, record: JobRecord) -> bool:
    """Whether the job's run folder is on the cluster (the job script copied something back)."""
    present = connection.run(
        f"test -d {shlex.quote(record.run_dir)} && echo yes || echo no", what="look for the job's results"
    )
    return present.stdout.strip() == "yes"


class NoResults(HpcboxError):
    """The job has copied nothing back (yet)."""


def fetch(
    connection: ssh.Connection, project: ProjectConfig, record: JobRecord, *, in_place: bool = False
) -> tuple[Path, ssh.Transfer]:
    """The job's results and its log into runs/<cluster>/<job>/ here (rsync: resumable, incremental;
    ``in_place``: `Connection.download`'s): whether there are results and which logs, asked in one
    command, and all of them in one transfer."""
    local = local_run_dir(project, record)
    # Each by its absolute path, as download_together takes them (a relative one is under the home).
    listing = (
        f'; for log in {log_words(record)}; do if test -f "$log"; then '
        f'case $log in /*) ;; *) log=$HOME/$log ;; esac; printf "%s\\n" "$log"; fi; done'
    )
    listed = connection.run(
        f'(cd {shlex.quote(record.run_dir)} 2>/dev/null && printf "%s\\n" "{_RESULTS} $PWD"){listing}',
        what="look for the job's results and logs",
    ).stdout.splitlines()
    if not listed or not listed[0].startswith(f"{_RESULTS} /"):
        raise NoResults(
            f"job {record.job_id} has no results in {record.run_dir} yet",
            "the job script copies them there when the trainer stops; `hpcbox status` tells where it is",
        )
    run_dir = listed[0].removeprefix(f"{_RESULTS} ")
    logs = [log for log in listed[1:] if log]  # an array's are one a task
    return local, connection.download_together([f"{run_dir}/", *logs], local, in_place=in_place)


# What fetch's look says first where the run folder is there (a log's absolute path never is this).
_RESULTS = "results-there"


# How often `fetch --follow` brings home what the job copied: the job copies its small files as often at
# most (render.sbatch.LIVE_COPY_S).
FOLLOW_EVERY_S = 10.0
# The files a job's tools only ever append to (TensorBoard's event files, the trainer's metrics, W&B's
# run files): a look while the job runs brings only their new bytes. The fetch at its end checks all.
GROWING = ("events.out.tfevents.*", "*.jsonl", "*.wandb")


def listing_digest(connection: ssh.Connection, remote_dir: str) -> str | None:
    """A digest of ``remote_dir``'s listing (each entry's path, size and modification time, in one
    order), made on the login node by one command; None where the folder is not there (yet)."""
    found = connection.run(
        f"if cd {shlex.quote(remote_dir)} 2>/dev/null; then "
        "find . -printf '%P %s %T@\\n' | LC_ALL=C sort | md5sum; fi",
        what="look at the job's run folder",
    )
    return found.stdout.split()[0] if found.stdout.strip() else None


def fetch_changed(
    connection: ssh.Connection, remote_dir: str, local: Path, seen: str | None
) -> tuple[str | None, ssh.Transfer]:
    """``remote_dir`` into ``local`` where its listing changed since the look that found ``seen`` (its
    `listing_digest`): a look that finds nothing new is one command, where rsync's would be two sessions
    and their file lists; files that grow come as their new bytes (`GROWING`). The digest found now, taken
    before the download, so that what changes during it is fetched at the next look."""
    digest = listing_digest(connection, remote_dir)
    if digest is None or digest == seen:
        return digest, ssh.Transfer(0, 0)
    # In place: TensorBoard, holding the event files open, sees what each fetch appends.
    return digest, connection.download(f"{remote_dir}/", local, in_place=True, growing=GROWING)


def fetch_following(
    connection: ssh.Connection,
    project: ProjectConfig,
    record: JobRecord,
    ended: Callable[[], bool],
    *,
    every_s: float = FOLLOW_EVERY_S,
    on_line: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Path, ssh.Transfer]:
    """The job's results home as it runs: its run folder fetched every ``every_s`` (what the job has
    copied there: its small files that changed, every 10 s at most, and everything at each
    `sync_every`), each new line of its metrics.jsonl and the newest values of its MLflow and W&B runs
    (a sweep's: each task's, named) said to ``on_line`` as figures, until ``ended`` says it has; then
    fetched once more, with its logs. A look that finds nothing new is one command (`fetch_changed`).
    A login node that stops answering is looked at again each ``every_s``, borne as a wait bears it
    (`tools.slurm.Silence`); the job runs on meanwhile."""
    local = local_run_dir(project, record)
    said: dict[Path, int] = {}  # bytes of each metrics.jsonl said (a sweep's: one a task)
    trackers = (MlflowFigures(), WandbFigures())
    moved = ssh.Transfer(0, 0)
    seen: str | None = None  # the run folder's listing, as the last look that fetched found it
    silence = slurm.Silence()
    while True:
        try:
            finished = ended()
            if finished:
                local, last = _fetch_ended(connection, project, record)
            else:
                seen, last = fetch_changed(connection, record.run_dir, local, seen)
        except ssh.Unreachable as lost:
            silence.bear(lost, record.run, "watching it", "watch it again", math.inf)
            sleep(every_s)
            continue
        silence.heard()
        moved += last
        for metrics in (
            sorted(local.glob("*/metrics.jsonl")) if record.is_array else [local / "metrics.jsonl"]
        ):
            task = f"task {metrics.parent.name}" if record.is_array else ""
            said[metrics] = _say_new_figures(
                metrics, said.get(metrics, 0), on_line, prefix=f"{task}: " if task else "",
                first=f"{task} ({_point_of(record, metrics.parent.name)}): " if task else "",
            )  # fmt: skip
        for tracker in trackers:
            for line in tracker.new_lines(local, tasks=record.is_array):
                on_line(line)
        if finished:
            return local, moved
        sleep(every_s)


def _point_of(record: JobRecord, task: str) -> str:
    """The arguments of the sweep's point task ``task`` runs (a task folder's name), as typed."""
    index = int(task) if task.isdigit() else len(record.sweep)
    if index >= len(record.sweep):
        return "its point unknown"
    return shlex.join(record.sweep[index]) or "no arguments of its own"


def _fetch_ended(
    connection: ssh.Connection, project: ProjectConfig, record: JobRecord
) -> tuple[Path, ssh.Transfer]:
    """The last fetch of a job watched, once it has ended; one that ended with nothing copied, said so."""
    try:
        return fetch(connection, project, record, in_place=True)
    except NoResults:
        raise NoResults(
            f"job {record.run} ended before it copied anything back (cancelled or failed while it waited "
            "or staged)",
            f"`hpcbox status -j {record.run}` says how it ended",
        ) from None


def _say_new_figures(
    metrics: Path, said: int, on_line: Callable[[str], None], *, prefix: str = "", first: str = ""
) -> int:
    """Each whole line of ``metrics`` past byte ``said`` as figures, after ``prefix`` (its first line
    after ``first``, where given); the bytes said now."""
    if not metrics.is_file():
        return said
    whole = whole_lines_past(metrics, said)
    opening = first if first and not said else prefix
    for line in whole.decode(errors="replace").splitlines():
        if line.strip():
            on_line(opening + figures(line))
            opening = prefix
    return said + len(whole)


def figures(line: str) -> str:
    """A metrics line in a few words: an epoch's and a step's figures, a start, a stop, the end; any
    other JSON object as its numbers."""
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(event, dict):
        return line
    kind = event.get("event")
    numbers = {
        name: value
        for name, value in event.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and name != "time"
    }
    if kind == "epoch" and "epochs" in numbers:
        shown = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "samples_per_s")
        said = ", ".join(f"{name} {_number(numbers[name])}" for name in shown if name in numbers)
        return f"epoch {numbers.get('epoch')}/{numbers['epochs']}: {said}"
    if kind == "step":
        return f"epoch {numbers.get('epoch')} step {numbers.get('step')}: loss {_number(numbers.get('loss'))}"
    if kind == "start":
        resumed = event.get("resumed")
        where = f" on {event['host']}" if event.get("host") else ""
        return f"started{where}" + (f", resumed from {resumed.get('checkpoint')}" if resumed else "")
    if kind == "preempted":
        return f"stopped by {event.get('signal')} at epoch {numbers.get('epoch')} step {numbers.get('step')}"
    if kind == "done":
        return f"done: val_accuracy {_number(numbers.get('val_accuracy'))}"
    said = ", ".join(f"{name} {_number(value)}" for name, value in numbers.items())
    return f"{kind}: {said}" if kind else said


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def report(connection: ssh.Connection, project: ProjectConfig, record: JobRecord) -> tuple[str, Path]:
    """The efficiency report of a job (text) and its plot (PNG beside the fetched results).

    Fetches the results first (incremental), so the trainer's metrics and the GPU samples are read
    from the local copy; sacct gives the rest.
    """
    from hpcbox.report import efficiency

    if record.is_array:
        return _sweep_report(connection, project, record)
    found = state(connection, record)
    if found.state == "PENDING":
        raise HpcboxError(f"job {record.job_id} has not started yet", "`hpcbox status` says why it waits")
    why_no_metrics = None
    try:
        local, _ = fetch(connection, project, record)
    except NoResults:
        if not found.finished:
            raise
        # Killed before it could copy anything back (a kill for memory is): sacct still says why.
        local = local_run_dir(project, record)
        local.mkdir(parents=True, exist_ok=True)  # for the report's plot
        why_no_metrics = f"the job copied no results back to {record.run_dir}"
    rows = _cancelled_by_name(
        connection, slurm.sacct_rows(connection, record.job_id, efficiency.SACCT_FIELDS, record.script)
    )
    metrics = local / "metrics.jsonl"
    metrics_path = metrics if metrics.is_file() else None
    gpu_csv = local / "gpu-utilization.csv"
    gpu_path = gpu_csv if gpu_csv.is_file() else None
    try:
        built = efficiency.build_report(
            rows, metrics_path, gpu_path, _own_program(project.run), why_no_metrics=why_no_metrics,
            resume=resume_command(record), preempted_runs=found.preempted_runs,
        )  # fmt: skip
    except ValueError as exc:
        raise HpcboxError(f"cannot report on job {record.job_id}: {exc}") from exc
    png = efficiency.plot_report(metrics_path, gpu_path, local / "report.png")
    return efficiency.format_report(built), png


_CANCELLED_BY = re.compile(r"^CANCELLED by (\d+)$")


def _cancelled_by_name(connection: ssh.Connection, rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """sacct's rows with `CANCELLED by 1500` said as the login node names that user (one look)."""
    uids = sorted({found[1] for row in rows if (found := _CANCELLED_BY.match(row["State"]))})
    if not uids:
        return rows
    looked = connection.run(
        f"for uid in {' '.join(uids)}; do "
        'printf "%s %s\\n" "$uid" "$(getent passwd "$uid" | cut -d: -f1)"; done',
        what="name who cancelled the job",
        check=False,
    )
    names = {
        uid: name for uid, _, name in (line.partition(" ") for line in looked.stdout.splitlines()) if name
    }
    return [
        {**row, "State": f"CANCELLED by {names[found[1]]}"}
        if (found := _CANCELLED_BY.match(row["State"])) and found[1] in names
        else row
        for row in rows
    ]


def _sweep_report(connection: ssh.Connection, project: ProjectConfig, record: JobRecord) -> tuple[str, Path]:
    """A sweep's report, a line per point, from its accounting and its fetched results; no plot of its
    own (each point's report has one): the path returned is its results folder."""
    from hpcbox.report import efficiency

    local, _ = fetch(connection, project, record)
    rows = slurm.sacct_rows(connection, record.job_id, efficiency.SACCT_FIELDS, record.script)
    points = {task: record.sweep[task] for task in record.array_tasks}
    return efficiency.sweep_report(record.job_id, points, rows, local), local


def resume_command(record: JobRecord) -> str | None:
    """The command that starts a job from ``record``'s last checkpoint (None for a sweep's tasks)."""
    if record.is_array:
        return None
    via = f" --via {record.via}" if record.via else ""
    return f"hpcbox submit --cluster={record.cluster}{via} --resume-from {record.run}"


def _own_program(run: ContainerCommand | Steps) -> str | None:
    """What the job runs, in words, where that is not the example trainer (which writes metrics.jsonl)."""
    if runs_example_trainer(run):
        return None
    commands = [step.command for step in run.steps] if isinstance(run, Steps) else [run]
    return " then ".join(
        command.target if command.kind == "entry_point" else " ".join(command.program_words())
        for command in commands
    )
