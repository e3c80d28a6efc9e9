"""A job's results home: its run folder and logs into runs/<cluster>/<job>/, and its efficiency report."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.jobs.follow import log_words, state
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


def has_results(connection: ssh.Connection, record: JobRecord) -> bool:
    """Whether the job's run folder is on the cluster (the job script copied something back)."""
    present = connection.run(
        f"test -d {shlex.quote(record.run_dir)} && echo yes || echo no", what="look for the job's results"
    )
    return present.stdout.strip() == "yes"


class NoResults(HpcboxError):
    """The job has copied nothing back (yet)."""


def fetch(connection: ssh.Connection, project: ProjectConfig, record: JobRecord) -> tuple[Path, ssh.Transfer]:
    """The job's results and its log into runs/<cluster>/<job>/ here (rsync: resumable, incremental)."""
    local = local_run_dir(project, record)
    if not has_results(connection, record):
        raise NoResults(
            f"job {record.job_id} has no results in {record.run_dir} yet",
            "the job script copies them there when the trainer stops; `hpcbox status` tells where it is",
        )
    transfers = [connection.download(f"{record.run_dir}/", local)]
    listed = connection.run(
        # Each by its absolute path, as download_files takes them (a relative one is under the home).
        f'for log in {log_words(record)}; do if test -f "$log"; then '
        f'case $log in /*) ;; *) log=$HOME/$log ;; esac; printf "%s\\n" "$log"; fi; done',
        what="look for the job's logs",
    )
    logs = [log for log in listed.stdout.splitlines() if log]
    if logs:  # one transfer for them all: an array's logs are one a task
        transfers.append(connection.download_files(logs, local))
    return local, ssh.Transfer(sum(t.sent for t in transfers), sum(t.received for t in transfers))


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
