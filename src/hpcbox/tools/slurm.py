"""Slurm's user commands (sbatch, squeue, sacct, scancel), run on a cluster's login node over SSH.

Parsing of their output is kept in pure functions beside the calls, so it is tested on its own.
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import re
import shlex
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc, ssh
from hpcbox.units import format_time, parse_cpu_time

# Job states after which nothing more happens to a job (Slurm's "completed" family).
FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

# What squeue's reason codes mean, in words a user can act on.
PENDING_REASONS = {
    "Priority": "other jobs have higher priority; it will start when its turn comes",
    "Resources": "waiting for nodes with the requested CPUs, memory or GPUs to become free",
    "Dependency": "waiting for the jobs it depends on to finish",
    "DependencyNeverSatisfied": "a job it depends on failed: it will never start; cancel it",
    "BeginTime": "its --begin time has not come yet",
    "JobHeldUser": "held by you: `scontrol release JOBID` lets it start",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is above the partition's limit: it will not start",
    "QOSMaxGRESPerUser": "you already use as many GPUs as your QOS allows; it starts when one of yours ends",
    "QOSMaxJobsPerUserLimit": "you already run as many jobs as your QOS allows",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above what the QOS allows: lower --time",
    "QOSGrpGRES": "the QOS's group GPU limit is reached",
    "QOSMaxCpuPerUserLimit": "you already use as many CPUs as your QOS allows",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "AssocGrpCPUMinutesLimit": "your account has used its CPU-minutes allocation",
    "AssocMaxJobsLimit": "your account already runs as many jobs as it may",
    "AssocGrpJobsLimit": "your account's group already runs as many jobs as it may",
    "InvalidAccount": "the account is not valid for you: check --account",
    "InvalidQOS": "the QOS is not valid for you: check --qos",
    "BadConstraints": "no node matches the constraints: the job cannot start as asked",
    "NodeDown": "a node it needs is down",
    "JobArrayTaskLimit": "its array already runs as many tasks at once as its throttle (%N) allows",
    "launch failed requeued held": "the job failed to launch and was held: `scontrol release JOBID`",
    "None": "being scheduled",
}

# Codes of a job that waiting will not start: its request exceeds a limit (a limit on the job's own
# request names itself ...PerJob...), or what it depends on failed.
_NEVER_STARTS = frozenset(
    {
        "BadConstraints",
        "DependencyNeverSatisfied",
        "InvalidAccount",
        "InvalidQOS",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
    }
)
_DOWN = frozenset({"NodeDown", "PartitionDown", "PartitionInactive"})
_HELD = frozenset({"BeginTime", "JobHeldAdmin", "JobHeldUser", "launch failed requeued held"})
# squeue's start time where it has none for a job (%S).
_NO_START = ("", "N/A", "Unknown", "None")


def wait_group(reason: str) -> str:
    """What a pending job with squeue's reason code ``reason`` waits for, grouped by what its user can do
    (as SkyPilot groups squeue's reasons, sky/provision/slurm/pending.py); "" for a code no group takes.
    Slurm has dozens of codes and adds more: a limit's names its kind (Assoc..., QOS...)."""
    if reason == "None":
        return "not yet looked at by the scheduler"
    if reason in _NEVER_STARTS or "PerJob" in reason:
        return "will not start as asked"
    if reason in ("Resources", "Licenses", "Reservation"):
        return "waiting for free resources"
    if reason == "Priority":
        return "waiting behind jobs of higher priority"
    if reason.startswith("Dependency"):
        return "waiting for a dependency"
    if reason in _HELD:
        return "held"
    if reason.startswith(("Assoc", "QOS")) or reason == "JobArrayTaskLimit":
        return "at a limit of your account or QOS"
    if reason in _DOWN or reason.startswith("ReqNodeNotAvail"):
        return "a node or partition it needs is down"
    return ""


@dataclass(frozen=True)
class JobState:
    """One job as squeue or sacct reports it."""

    job_id: str
    state: str  # e.g. PENDING, RUNNING, COMPLETED; "CANCELLED by 1500" is cut to CANCELLED
    reason: str = ""
    elapsed: str = ""
    time_limit: str = ""
    exit_code: str = ""
    nodes: str = ""
    source: str = ""  # squeue or sacct
    note: str = ""  # what is not known, and why (e.g. the exit code while accounting does not answer)
    # Its batch script's path and when it was submitted (last requeued), as Slurm says them; "" where
    # it does not (sacct before Slurm 23.02 has no SubmitLine).
    script: str = ""
    submitted: str = ""
    # Slurm's own guess of when a pending job starts (squeue's %S: the backfill scheduler's estimate
    # from the queue as it stands), "" where it has none. A guess: the queue moves under it.
    start_guess: str = ""
    # How many of its earlier runs sacct ends PREEMPTED (each requeued by Slurm). Slurm counts one or two
    # a preemption: the run after one is requeued once more when it exits 0, and sacct names it so too.
    preempted_runs: int = 0
    # How many runs sacct keeps of a finished job: its elapsed is then theirs together.
    runs: int = 1
    # How many times Slurm has requeued the job (squeue's RestartCnt), asked of a job it holds back by
    # BeginTime (a requeued job waits out Slurm's requeue delay under that reason, as if the user had
    # asked for --begin) and, by `status`, of a running one (its how-manieth run); else 0.
    restarts: int = 0

    def is_of(self, script: str) -> bool:
        """Whether this is the job whose batch script is ``script`` (unknown on either side: taken so).
        By file name, which hpcbox makes its own for each submission: Slurm records the folder as the
        login node's getcwd() gave it, which may differ from the one hpcbox named (a home folder that
        is a link to a parallel file system's)."""
        return not script or not self.script or posixpath.basename(self.script) == posixpath.basename(script)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def requeued(self) -> bool:
        """Whether it waits to run again after Slurm requeued it (not for a --begin of its user's)."""
        return self.state == "PENDING" and self.reason == "BeginTime" and self.restarts > 0

    @property
    def reason_in_words(self) -> str:
        if self.requeued:
            times = "once" if self.restarts == 1 else f"{self.restarts} times"
            return (
                f"Slurm requeued it ({times} so far) and holds it for its requeue delay before its next run"
            )
        return PENDING_REASONS.get(self.reason, "")

    @property
    def waiting_for(self) -> str:
        """What a pending job waits for, in words (`wait_group`); "" for a job not pending."""
        if self.requeued:
            return "requeued, to run again"
        return wait_group(self.reason) if self.state == "PENDING" else ""


def test_only_start(answer: str) -> str:
    """The start time in `sbatch --test-only`'s answer ("Job 5 to start at 2026-12-05T12:00:00 using 1
    processors on nodes c1 in partition debug"); "" where it gives none."""
    found = re.search(r"\bto start at (\S+)", answer)
    return found[1] if found else ""


def test_only(target: ssh.Target, script_text: str) -> str:
    """Ask the cluster whether it would accept `script_text` (`sbatch --test-only`); its answer, or raise."""
    with tempfile.TemporaryFile() as script:
        script.write(script_text.encode())
        script.seek(0)
        done = proc.run(
            ssh.ssh_argv(target, ["sbatch", "--test-only"]),
            what=f"check the job script with `sbatch --test-only` on {target.address}",
            hint="the message above is Slurm's; fix the resource it names",
            stdin=script,
        )
    return (done.stderr or done.stdout).strip()


# A GPU in a node's gres as sinfo prints it: gpu:a100:4(S:0-1), gpu:a100_3g.20gb:7, or untyped gpu:2.
_GRES_GPU = re.compile(r"gpu(?::([A-Za-z][\w.-]*))?:(\d+)")


def gpu_gres(gres: str) -> tuple[tuple[str, int], ...]:
    """Each (type, count) of GPUs in gres such as `gpu:a100:4(S:0-1),gpu:v100:2`; "" for an untyped one."""
    return tuple((gpu_type, int(count)) for gpu_type, count in _GRES_GPU.findall(gres))


def parse_job_id(parsable: str) -> str:
    """The job id from `sbatch --parsable` output (`ID` or `ID;cluster`)."""
    first = parsable.strip().splitlines()[-1] if parsable.strip() else ""
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        raise HpcboxError(f"sbatch answered {parsable.strip()!r}, not a job id")
    return job_id


# The batch script (%o, absolute) and submit time (%V) last: they tell a job from another given its id
# before (module doc of IdReused).
_SQUEUE_FORMAT = "%i|%T|%r|%M|%l|%N|%S|%V|%o"
# sacct gives up on a slurmdbd that takes the connection but never answers only after 40 s (measured on
# Slurm 24.11); hpcbox waits this long, then says that accounting does not answer.
SACCT_TIMEOUT_S = 10
# What sacct says when asked for a field its Slurm does not have (sacct 22.05: Restarts).
_UNKNOWN_FIELD = re.compile(r'Invalid field requested: "([^"]+)"')
# What sacct says when it cannot reach slurmdbd at all.
_NO_DATABASE = ("Problem talking to the database", "persist_conn")


class AccountingSilent(HpcboxError):
    """Slurm's accounting does not answer, and squeue no longer lists the job: its state is unknown."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job {job_id}: Slurm's accounting (slurmdbd) does not answer and squeue no longer lists the "
            "job: its state is unknown for now",
            "ask again in a while (the job's own results are in its run folder: `hpcbox fetch`)",
        )


class IdReused(HpcboxError):
    """Slurm's job of this id is another job: Slurm numbers jobs again from FirstJobId once its
    controller is rebuilt with its state, and wraps at MaxJobId. The batch script tells them apart
    (requeues keep it; they reset the submit time, so that alone cannot)."""

    def __init__(self, job_id: str, script: str, other: JobState) -> None:
        submitted = f", submitted {other.submitted}" if other.submitted else ""
        super().__init__(
            f"job {job_id} is no longer known to Slurm: its id now names another job ({other.script}"
            f"{submitted}), not this one ({script})",
            "Slurm gave the id again (its controller was rebuilt, or its ids wrapped): what this job copied "
            "back is in its run folder (`hpcbox fetch`)",
        )


# The batch script and submit time last: SubmitLine is free text, which may hold the delimiter.
_STATE_FIELDS = (
    "JobID", "State", "Reason", "Elapsed", "Timelimit", "ExitCode", "NodeList", "Submit", "WorkDir",
    "SubmitLine",
)  # fmt: skip
# What sacct before Slurm 23.02 does not know: the script is then told by squeue alone.
_NEWER_STATE_FIELDS = ("SubmitLine",)


def parse_squeue(text: str, job_id: str, squeue_format: str = _SQUEUE_FORMAT) -> JobState | None:
    """Job ``job_id``'s line of `squeue --format=SQUEUE_FORMAT`, read by the format's codes (this one's, or
    fewer: the captured outputs of older Slurms have the first six)."""
    return next((state for state in _squeue_lines(text, squeue_format) if state.job_id == job_id), None)


def _squeue_lines(text: str, squeue_format: str) -> Iterable[JobState]:
    codes = squeue_format.split("|")
    for line in text.splitlines():
        fields = line.strip().split("|", len(codes) - 1)
        if len(fields) != len(codes):
            continue
        field = dict(zip(codes, fields, strict=True))
        # %S is a running job's real start; only a pending one's is a guess
        start = field.get("%S", "") if field["%T"] == "PENDING" else ""
        yield JobState(
            field["%i"], field["%T"], field["%r"], _clock(field["%M"]), _clock(field["%l"]), "",
            _assigned(field["%N"]),
            "squeue", script=field.get("%o", ""), submitted=field.get("%V", ""),
            start_guess="" if start in _NO_START else start,
        )  # fmt: skip


def _clock(text: str) -> str:
    """squeue's times (`0:17`, `10:00`) written as sacct writes them (`00:00:17`, `00:10:00`), so that a
    job's elapsed and limit read the same running and ended; a word (UNLIMITED, INVALID) as it is."""
    try:
        return format_time(round(parse_cpu_time(text)))
    except ValueError:
        return text


def parse_sacct(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `sacct --noheader --parsable2 --format=<fields>`, one per job, step or task line, by field;
    ValueError on a line in another format."""
    rows: list[dict[str, str]] = []
    free_text = fields[-1] == "SubmitLine"
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|", len(fields) - 1 if free_text else -1)
        if free_text and rows and len(values) < len(fields):
            rows[-1]["SubmitLine"] += "\n" + line  # `sbatch --wrap` with lines in it: all of them its own
            continue
        if len(values) != len(fields):
            raise ValueError(
                f"sacct line has {len(values)} fields, expected {len(fields)} "
                f"(run sacct with --parsable2 --format={','.join(fields)}): {line!r}"
            )
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def accounted_states(text: str, job_id: str, fields: Sequence[str] = _STATE_FIELDS) -> list[JobState]:
    """Each run sacct keeps of job ``job_id`` (`--duplicates`: a requeued job's earlier runs, and the
    jobs an id named before), oldest first."""
    return [run for run in accounted_runs(text, fields) if run.job_id == job_id]


def accounted_runs(text: str, fields: Sequence[str] = _STATE_FIELDS) -> list[JobState]:
    """Each allocation line of `sacct -X --duplicates` (an array's tasks, each run), oldest first."""
    return sorted((_state_of(row) for row in parse_sacct(text, fields)), key=lambda run: run.submitted)


def _state_of(row: dict[str, str]) -> JobState:
    # sacct's State can carry a cause: "CANCELLED by 1000".
    state = row["State"].split()[0] if row["State"] else ""
    return JobState(
        row["JobID"], state, row["Reason"], row["Elapsed"], row["Timelimit"], row["ExitCode"],
        _assigned(row["NodeList"]), "sacct", script=_script_of(row), submitted=row.get("Submit", ""),
    )  # fmt: skip


def _script_of(row: dict[str, str]) -> str:
    """The batch script sacct's row was submitted with: SubmitLine's last word (hpcbox submits
    `sbatch --parsable scripts/NAME`), from its WorkDir; "" where sacct has no SubmitLine."""
    words = row.get("SubmitLine", "").split()
    if not words or not row.get("WorkDir"):
        return ""
    return posixpath.join(row["WorkDir"], words[-1])


def _own(runs: Iterable[JobState], job_id: str, script: str) -> list[JobState]:
    """The runs that are the job whose batch script is ``script``; IdReused where there are runs of the
    id and none is."""
    runs = list(runs)
    own = [run for run in runs if run.is_of(script)]
    if runs and not own:
        raise IdReused(job_id, script, runs[-1])
    return own


def _assigned(nodes: str) -> str:
    """The nodes a job was given; none where Slurm says so in words (`None assigned`, `(null)`)."""
    return "" if nodes in ("None assigned", "(null)") else nodes


def parse_tasks(
    sacct_text: str,
    squeue_text: str,
    job_id: str,
    script: str = "",
    fields: Sequence[str] = _STATE_FIELDS,
    squeue_format: str = _SQUEUE_FORMAT,
) -> dict[int, JobState]:
    """Each task of array job ``job_id`` whose batch script is ``script``: its sacct line (the last, if
    it was requeued), or squeue's while Slurm still holds the task (`squeue --array` lists pending
    tasks one by one). IdReused where Slurm knows only another job's tasks by the id."""
    task = re.compile(rf"^{re.escape(job_id)}_(\d+)$")
    accounted = [run for run in accounted_runs(sacct_text, fields) if task.match(run.job_id)]
    queued = [state for state in _squeue_lines(squeue_text, squeue_format) if task.match(state.job_id)]
    tasks: dict[int, JobState] = {}
    for run in _own(accounted, job_id, script):
        tasks[int(task.match(run.job_id).group(1))] = run  # type: ignore[union-attr]
    for run in _own(queued, job_id, script):
        if not run.finished:
            tasks[int(task.match(run.job_id).group(1))] = run  # type: ignore[union-attr]
    return dict(sorted(tasks.items()))


def task_states(connection: ssh.Connection, job_id: str, script: str = "") -> dict[int, JobState]:
    """The state of each task of array job ``job_id`` (the one whose batch script is ``script``), by
    task id."""
    found = look(connection, [Watched(job_id, script, array=True)])
    if isinstance(error := found.get(job_id), HpcboxError):
        raise error
    return tasks_in(found, job_id)


def tasks_in(said: Looked, job_id: str) -> dict[int, JobState]:
    """The states a look (`look`) gives of array ``job_id``'s tasks, by task id."""
    prefix = f"{job_id}_"
    return {
        int(key.removeprefix(prefix)): state
        for key, state in said.items()
        if key.startswith(prefix) and isinstance(state, JobState)
    }


def job_state(connection: ssh.Connection, job_id: str, script: str = "") -> JobState | None:
    """The state of job ``job_id`` (the one whose batch script is ``script``, where given) from squeue
    while Slurm holds it, or else sacct; None if neither knows it. IdReused where they know only
    another job by the id."""
    found = look(connection, [Watched(job_id, script)]).get(job_id)
    if isinstance(found, HpcboxError):
        raise found
    return found


@dataclass(frozen=True)
class Watched:
    """A job to look at: its id (an array's own), its batch script ("" where not known), and, for an
    array, how many tasks it has (0: not known)."""

    job_id: str
    script: str = ""
    array: bool = False
    tasks: int = 0


# What a look says of each job (by its id) and each array task (by `ID_TASK`): its state, or the error
# that stands for it (IdReused, AccountingSilent); a job neither squeue nor sacct knows is left out.
Looked = dict[str, JobState | HpcboxError]


def look(connection: ssh.Connection, jobs: Sequence[Watched]) -> Looked:
    """The state of each of ``jobs`` and of their arrays' tasks, asked together: one squeue for them all
    while Slurm holds them (pending, running: squeue alone), one sacct for those it no longer holds or
    has seen end (the exit code, and the runs of a requeued job), and one squeue more for a job held by
    BeginTime (how often it was requeued). However many jobs, at most three calls: what a wait on a
    thousand tasks asks of Slurm is what a wait on one does (submitit#1759: polled one by one,
    thousands of tasks hit a site's per-user RPC limit)."""
    ids = ",".join(dict.fromkeys(job.job_id for job in jobs))
    queued = connection.run(
        ["squeue", "--noheader", "--array", "--states=all", f"--jobs={ids}", f"--format={_SQUEUE_FORMAT}"],
        what=f"ask squeue about job {ids}",
        check=False,
    )
    # squeue exits non-zero for a lone id it does not know: that job is then sacct's to tell.
    queued_text = queued.stdout if queued.returncode == 0 else ""
    listed = {state.job_id: state for state in _squeue_lines(queued_text, _SQUEUE_FORMAT)}
    asking = [job.job_id for job in jobs if _needs_accounting(job, listed)]
    accounted, fields = _sacct_states(connection, ",".join(asking)) if asking else (None, _STATE_FIELDS)
    found: Looked = {}
    for job in jobs:
        try:
            if job.array:
                sacct_text = accounted.stdout if accounted is not None and accounted.returncode == 0 else ""
                tasks = _read(parse_tasks, sacct_text, queued_text, job.job_id, job.script, fields)
                found.update({f"{job.job_id}_{index}": task for index, task in tasks.items()})
            elif (state := _job_from(listed, accounted, fields, job)) is not None:
                found[job.job_id] = state
        except HpcboxError as error:
            found[job.job_id] = error
    requeued = [
        job.job_id for job in jobs
        if not job.array and isinstance(state := found.get(job.job_id), JobState)
        and state.state == "PENDING" and state.reason == "BeginTime"
    ]  # fmt: skip
    if requeued:
        counts = restarts(connection, requeued)
        for job_id in requeued:
            found[job_id] = dataclasses.replace(found[job_id], restarts=counts.get(job_id, 0))  # type: ignore[arg-type]
    return found


def _needs_accounting(job: Watched, listed: dict[str, JobState]) -> bool:
    """Whether squeue's lines leave the job's state to sacct: gone from squeue, ended, or another job's
    (the id named again); an array's where any task is so, or not every task is listed."""
    if not job.array:
        state = listed.get(job.job_id)
        return state is None or state.finished or not state.is_of(job.script)
    task = re.compile(rf"^{re.escape(job.job_id)}_\d+$")
    tasks = [state for key, state in listed.items() if task.match(key)]
    return (
        not job.tasks
        or len(tasks) < job.tasks
        or any(state.finished or not state.is_of(job.script) for state in tasks)
    )


def _job_from(
    listed: dict[str, JobState], accounted: proc.Completed | None, fields: Sequence[str], job: Watched
) -> JobState | None:
    """A single job's state from squeue's lines while Slurm holds it unfinished, else from sacct's runs
    (``accounted``, None where it was not asked); None where neither knows it."""
    state = listed.get(job.job_id)
    other = None
    if state is not None and not state.is_of(job.script):
        state, other = None, state
    if state is not None and not state.finished:
        return state
    # Finished, or already gone from squeue: sacct also knows the exit code.
    if accounted is not None and accounted.returncode == 0:
        runs = _read(accounted_states, accounted.stdout, job.job_id, fields)
        own = _own([*runs, *([other] if other else [])], job.job_id, job.script)
        return all_runs(own) if own else state
    if accounted is not None and accounting_silent(accounted):
        if state is None:
            if other is not None:
                raise IdReused(job.job_id, job.script, other)
            raise AccountingSilent(job.job_id)
        return dataclasses.replace(state, note="exit code unknown: Slurm's accounting does not answer")
    if other is not None:
        raise IdReused(job.job_id, job.script, other)
    return state


def all_runs(own: Sequence[JobState]) -> JobState:
    """A job from its runs in sacct, oldest first: the last one's state, with the earlier ones it was
    preempted in counted and the elapsed of them all (the last of a preempted job can be an instant)."""
    last = own[-1]
    if len(own) == 1:
        return last
    try:
        elapsed = format_time(round(sum(parse_cpu_time(run.elapsed) for run in own)))
    except ValueError:
        elapsed = last.elapsed
    preempted = sum(run.state == "PREEMPTED" for run in own[:-1])
    return dataclasses.replace(last, elapsed=elapsed, runs=len(own), preempted_runs=preempted)


def restarts(connection: ssh.Connection, job_ids: Sequence[str]) -> dict[str, int]:
    """How many times Slurm has requeued each of ``job_ids`` (squeue's RestartCnt, in the one form of
    squeue that has it); a job it does not say is left out."""
    ids = ",".join(job_ids)
    asked = connection.run(
        ["squeue", "--noheader", f"--jobs={ids}", "--Format=JobID:40,RestartCnt:12"],
        what=f"ask squeue how often job {ids} was requeued",
        check=False,
    )
    return parse_restarts(asked.stdout) if asked.returncode == 0 else {}


def parse_restarts(text: str) -> dict[str, int]:
    """The restart count of each job in `squeue --noheader --Format=JobID:40,RestartCnt:12` (columns
    padded with spaces), by job id; a line without a count is skipped."""
    counts = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isdigit():
            counts[words[0]] = int(words[1])
    return counts


# The shortest wait between two looks at a job's state, and each wait's share of the time waited so far
# (up to the caller's poll_s): a job of a few seconds is seen ending within a quarter of one, a longer
# one within a tenth of its run, and a day's wait costs a look every poll_s.
FIRST_POLL_S = 0.25
LOOK_SHARE = 0.1
# How long a wait rides out a login node that does not answer (the network, a reboot) before it says so.
UNREACHABLE_S = 15 * 60


class Silence:
    """The login node's silence while a job is followed (`poll`'s waits, the watch's fetches): each
    `Unreachable` borne until UNREACHABLE_S (or the caller's deadline) have passed since the first of a
    row, then said in one line; an answer between ends the row."""

    def __init__(self) -> None:
        self._since: float | None = None

    def heard(self) -> None:
        self._since = None

    def bear(self, lost: ssh.Unreachable, job_id: str, doing: str, again: str, deadline: float) -> None:
        """Return (ask again) while the silence is within its bound; else raise, saying for how long,
        while ``doing`` what, and to do ``again`` once the login node answers."""
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if now - self._since > UNREACHABLE_S or now > deadline:
            raise ssh.Unreachable(
                f"job {job_id}: no answer for {(now - self._since) / 60:.0f} min while {doing} "
                f"({lost.message}); the job runs on there",
                lost.hint or f"{again} once the login node answers",
                lost.details,
            ) from lost


def poll(
    read: Callable[[], JobState],
    job_id: str,
    *,
    until: Callable[[JobState], bool] = lambda found: found.finished,
    timeout_s: float = 3600,
    poll_s: float = 2,
    on_change: Callable[[JobState], None] | None = None,
    pause_s: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> JobState:
    """Call ``read`` for job ``job_id``'s state until ``until`` holds, telling ``on_change`` each new
    state (wait's loop, for a job no ledger records): every FIRST_POLL_S at first, then every tenth of
    the time waited, up to ``poll_s``; or, with ``pause_s``, as long as it says each time (a schedule of
    the caller's, e.g. a `jobs.watch.Watch`'s, shared with other waits)."""

    def pause() -> None:
        (sleep or time.sleep)(pause_s() if pause_s else _next_look(time.monotonic() - started, poll_s))

    started = time.monotonic()
    deadline = started + timeout_s
    last = None
    silence = Silence()
    while True:
        try:
            found = read()
        except AccountingSilent:
            # It comes back (slurmctld keeps what it owes it): a job is never taken for failed meanwhile.
            if time.monotonic() > deadline:
                raise
            pause()
            continue
        except ssh.Unreachable as lost:
            # The job runs on without us: asked again, up to UNREACHABLE_S, before the wait gives up.
            silence.bear(lost, job_id, "waiting on it", "wait on it again", deadline)
            pause()
            continue
        silence.heard()
        if on_change is not None and (found.state, found.reason) != last:
            on_change(found)
        last = (found.state, found.reason)
        if until(found):
            return found
        if time.monotonic() > deadline:
            raise HpcboxError(f"job {job_id} is still {found.state} after {timeout_s:.0f} s")
        pause()


def _next_look(waited_s: float, poll_s: float) -> float:
    return min(max(FIRST_POLL_S, waited_s * LOOK_SHARE), poll_s)


def _sacct(connection: ssh.Connection, arguments: Sequence[str], *, what: str) -> proc.Completed:
    """`sacct --noheader --parsable2 ARGUMENTS`, given at most SACCT_TIMEOUT_S; never raises."""
    argv = ["timeout", str(SACCT_TIMEOUT_S), "sacct", "--noheader", "--parsable2", *arguments]
    return connection.run(argv, what=what, check=False)


def _sacct_states(connection: ssh.Connection, job_id: str) -> tuple[proc.Completed, tuple[str, ...]]:
    """sacct's lines of each job the id has named (its array tasks too), and the fields they hold."""
    arguments = ["-X", "--duplicates", f"--jobs={job_id}"]
    what = f"ask sacct about job {job_id}"
    return _sacct_known(connection, arguments, _STATE_FIELDS, _NEWER_STATE_FIELDS, what=what)


def _sacct_known(
    connection: ssh.Connection,
    arguments: Sequence[str],
    fields: Sequence[str],
    droppable: Sequence[str],
    *,
    what: str,
) -> tuple[proc.Completed, tuple[str, ...]]:
    """`sacct ARGUMENTS --format=FIELDS`, asked again without each of ``droppable`` this cluster's sacct
    names as unknown (a field newer than its Slurm): its answer, and the fields it holds."""
    asked = tuple(fields)
    while True:
        done = _sacct(connection, [*arguments, f"--format={','.join(asked)}"], what=what)
        # sacct names the first field it does not know, and prints nothing else.
        unknown = unknown_field(done.stderr, droppable) if done.returncode != 0 else None
        if unknown is None:
            return done, asked
        asked = tuple(field for field in asked if field != unknown)


def accounting_silent(done: proc.Completed) -> bool:
    """Whether sacct failed because slurmdbd does not answer (timed out, or unreachable)."""
    return done.returncode == 124 or any(sign in done.stderr for sign in _NO_DATABASE)


@dataclass(frozen=True)
class HeldJob:
    """A job of the login user's that Slurm still holds (pending, running, completing, ...), with the
    batch script slurmctld keeps for it."""

    job_id: str  # an array's own id (%F): its tasks share one script
    script: str | None  # None where scontrol gave none (an srun or salloc job, a permission, an error)
    problem: str = ""  # scontrol's message then


# One squeue, then one `scontrol write batch_script` per job (an array's tasks share one script).
_HELD_JOBS = r"""held=$(squeue --noheader --user="$(id -un)" --format='%F|%A') || exit 1
held_line() {
    printf 'held\t%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | base64 | tr -d '\n')"
}
printf '%s\n' "$held" | sort -t '|' -k 1,1 -u | while IFS='|' read -r array job; do
    test -n "$job" || continue
    if script=$(scontrol write batch_script "$job" - 2>/dev/null); then
        held_line "$array" script "$script"
    else
        held_line "$array" none "$(scontrol write batch_script "$job" - 2>&1 >/dev/null | head -n 1)"
    fi
done"""


def held_jobs_script() -> str:
    """Shell that prints each job Slurm holds for the login user, one line per array with its batch
    script as `scontrol write batch_script` gives it, in base64: `held<TAB>id<TAB>script<TAB>...`, or
    `held<TAB>id<TAB>none<TAB>scontrol's message`. All in one command; where squeue fails, the command
    exits 1 with squeue's message (what a job needs is never guessed)."""
    return _HELD_JOBS


def parse_held_jobs(lines: Iterable[str]) -> tuple[HeldJob, ...]:
    """The jobs in the `held` lines of ``held_jobs_script``'s output; other lines are ignored."""
    held = []
    for line in lines:
        tag, _, rest = line.partition("\t")
        if tag != "held":
            continue
        job_id, how, encoded = [*rest.split("\t"), "", ""][:3]
        try:
            text = base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
        except ValueError:
            held.append(HeldJob(job_id, None, "its script came back damaged"))
            continue
        if how == "script":
            held.append(HeldJob(job_id, text))
        else:
            held.append(HeldJob(job_id, None, text.strip() or "scontrol gave no script"))
    return tuple(held)


def held_jobs(connection: ssh.Connection) -> tuple[HeldJob, ...]:
    """The login user's jobs Slurm still holds, each with its batch script (one round trip). A failure
    of squeue raises: a caller deciding what a job still needs cannot guess."""
    done = connection.run(
        held_jobs_script(), what="ask Slurm which of your jobs it still holds, and their scripts"
    )
    return parse_held_jobs(done.stdout.splitlines())


def end_times(connection: ssh.Connection, job_ids: Sequence[str]) -> dict[str, str]:
    """When each of ``job_ids`` ended, as sacct says it (`2026-11-25T10:09:00`), for those it knows;
    empty where accounting does not answer."""
    if not job_ids:
        return {}
    arguments = ["-X", f"--jobs={','.join(job_ids)}", "--format=JobID,End"]
    done = _sacct(connection, arguments, what="ask sacct when your jobs ended")
    if done.returncode != 0:
        return {}
    rows = _read(parse_sacct, done.stdout, ("JobID", "End"))
    return {row["JobID"]: row["End"] for row in rows if row["End"][:1].isdigit()}


def sacct_rows(
    connection: ssh.Connection, job_id: str, fields: Sequence[str], script: str = ""
) -> list[dict[str, str]]:
    """The accounting of the job and its steps: a row per line, ``fields`` by name. A field this
    cluster's sacct is too old to know is left empty, but Restarts (Slurm 23.02), which is counted from
    the runs `sacct --duplicates` lists. With ``script``, the job whose batch script it is (own_rows),
    where the id has named others too."""
    if not script:
        return _sacct_rows(connection, job_id, fields)
    # The scripts from the allocations' lines alone: a step's SubmitLine is its srun's, lines and all.
    runs, found = _sacct_states(connection, job_id)
    if runs.returncode != 0:
        return _sacct_rows(connection, job_id, fields)
    asked = [*fields, *(() if "Submit" in fields else ("Submit",))]
    rows = _sacct_rows(connection, job_id, asked, duplicates=True)
    own = own_rows(rows, _read(accounted_runs, runs.stdout, found), job_id, script)
    return [{field: row[field] for field in fields} for row in own]


def own_rows(
    rows: Sequence[dict[str, str]], runs: Sequence[JobState], job_id: str, script: str
) -> list[dict[str, str]]:
    """Of `sacct --duplicates`' rows of ``job_id`` (each run of each job the id has named, a run's
    allocation line then its steps'), the latest run of each allocation (an array's task is one) of
    the job whose batch script is ``script``, as ``runs`` (the allocations' states) tell: what sacct
    shows of a job without --duplicates. IdReused where the id's runs are all another job's."""
    own = {(run.job_id, run.submitted) for run in _own(runs, job_id, script)}
    latest: dict[str, list[dict[str, str]]] = {}
    current: list[dict[str, str]] | None = None
    for row in rows:
        if "." in row["JobID"]:
            if current is not None:
                current.append(row)
            continue
        kept = latest.get(row["JobID"])
        current = None
        if (row["JobID"], row["Submit"]) in own and (kept is None or row["Submit"] >= kept[0]["Submit"]):
            current = latest[row["JobID"]] = [row]
    return [row for run_rows in latest.values() for row in run_rows]


def _sacct_rows(
    connection: ssh.Connection, job_id: str, fields: Sequence[str], *, duplicates: bool = False
) -> list[dict[str, str]]:
    what = f"read job {job_id}'s accounting with sacct"
    arguments = [*(["--duplicates"] if duplicates else []), f"--jobs={job_id}"]
    done, asked = _sacct_known(connection, arguments, fields, fields, what=what)
    missing = [field for field in fields if field not in asked]
    if accounting_silent(done):
        raise HpcboxError(
            f"cannot {what}: Slurm's accounting (slurmdbd) does not answer",
            "ask again in a while: slurmctld sends it what it missed once it is back",
        )
    if done.returncode != 0:
        hint = "the report needs Slurm accounting (slurmdbd) on the cluster"
        raise proc.failure(what, done.returncode, done.stderr or done.stdout, hint, done.argv)
    if not missing:
        return _read(parse_sacct, done.stdout, fields)
    runs = ""
    if "Restarts" in missing:
        arguments = ["-X", "--duplicates", f"--jobs={job_id}", "--format=JobID,State"]
        counted = _sacct(connection, arguments, what=f"count the runs of job {job_id} with sacct")
        runs = counted.stdout if counted.returncode == 0 else ""
    return _read(older_sacct_rows, done.stdout, fields, missing, runs)


def unknown_field(stderr: str, fields: Sequence[str]) -> str | None:
    """The one of ``fields`` sacct refused as unknown (a field newer than its Slurm), if it did."""
    found = _UNKNOWN_FIELD.search(stderr)
    named = found.group(1).lower() if found else None
    return next((field for field in fields if field.lower() == named), None)


def older_sacct_rows(
    text: str, fields: Sequence[str], missing: Sequence[str], runs: str = ""
) -> list[dict[str, str]]:
    """Rows of ``fields`` from the output of an older sacct asked for all of them but ``missing`` (the
    ones it does not know): those are empty, except Restarts on each allocation's row, counted from
    ``runs`` (`sacct -X --duplicates --format=JobID,State`; empty: not counted)."""
    asked = [field for field in fields if field not in missing]
    rows = [{field: row.get(field, "") for field in fields} for row in parse_sacct(text, asked)]
    if "Restarts" in missing and runs:
        counts = requeue_counts(runs)
        for row in rows:
            if "." not in row["JobID"]:
                row["Restarts"] = str(counts.get(row["JobID"], 0))
    return rows


def requeue_counts(text: str) -> dict[str, int]:
    """How often each job was requeued, from `sacct -X --duplicates --format=JobID,State`: where sacct
    has no Restarts field (before Slurm 23.02) each earlier run of a requeued job is a line of its own,
    ended REQUEUED (REQUEUE_HOLD, REQUEUE_FED). A run in another state is not counted: the same id may
    name an older job of a cluster whose job numbers began again."""
    counts: dict[str, int] = {}
    for row in parse_sacct(text, ("JobID", "State")):
        counts.setdefault(row["JobID"], 0)
        if row["State"].startswith("REQUEUE"):
            counts[row["JobID"]] += 1
    return counts


def _read(parse: Callable[..., Any], text: str, *args: Any) -> Any:
    """``parse(text, *args)``, with output other than what hpcbox asked for as one line, not a traceback."""
    try:
        return parse(text, *args)
    except ValueError as exc:
        raise HpcboxError(f"sacct answered in a form hpcbox did not ask for: {exc}") from exc


# How `submit_script` ends where sbatch refuses the job (Slurm's message on its stderr).
SBATCH_REFUSED = 6
_SBATCH_WHAT = "submit the job with sbatch"
_SBATCH_HINT = "the message is Slurm's own: change the resource it names, or the cluster profile"


def submit_script(
    submit_dir: str,
    script_name: str,
    script_size: int,
    directories: tuple[str, ...],
    unset: tuple[str, ...] = (),
) -> str:
    """Shell that writes the job script, the next ``script_size`` bytes of its stdin (GNU head reads no
    further, so the script may follow other input), into ``submit_dir/scripts`` and `sbatch --parsable`s
    it from ``submit_dir``; it ends with the job id on stdout.

    ``directories`` (the log and run folders, relative ones under ``submit_dir``) are made first:
    Slurm writes no log into a missing folder. ``unset``: environment variables sbatch must not see.
    Where sbatch refuses, the script is removed again and the status is SBATCH_REFUSED.
    """
    script = f"scripts/{script_name}"
    unset_first = f"unset {shlex.join(unset)} && " if unset else ""
    return (
        f"cd {shlex.quote(submit_dir)} && mkdir -p -- {shlex.join(['scripts', *directories])} && "
        f"head -c {script_size} > {shlex.quote(script)} && {unset_first}"
        f"{{ sbatch --parsable {shlex.quote(script)} || {{ rm -f {shlex.quote(script)}; "
        f"exit {SBATCH_REFUSED}; }}; }}"
    )


def submitted(done: proc.Completed) -> str:
    """The job id a command ending in `submit_script` printed; sbatch's refusal (or any failure) as one
    line with Slurm's own words."""
    if done.returncode != 0:
        raise proc.failure(_SBATCH_WHAT, done.returncode, done.stderr or done.stdout, _SBATCH_HINT, done.argv)
    return parse_job_id(done.stdout)


def submit(
    connection: ssh.Connection,
    submit_dir: str,
    script_name: str,
    script_text: str,
    directories: tuple[str, ...],
    unset: tuple[str, ...] = (),
) -> str:
    """Write the script into ``submit_dir/scripts`` and `sbatch --parsable` it from ``submit_dir``
    (`submit_script`, in a command of its own); its job id. If sbatch refuses, its own message is the
    error and the script is removed again."""
    text = script_text.encode()
    command = submit_script(submit_dir, script_name, len(text), directories, unset)
    return submitted(connection.run(command, what=_SBATCH_WHAT, check=False, input_bytes=text))


def cancel(connection: ssh.Connection, job_id: str) -> None:
    """scancel the job."""
    connection.run(["scancel", job_id], what=f"cancel job {job_id}", hint="is it your job, on this cluster?")


def signal_batch(connection: ssh.Connection, job_id: str, signal: str) -> bool:
    """``signal`` to the job's batch shell alone (the job script's trap); False where scancel could not
    deliver it."""
    sent = connection.run(
        ["scancel", "--batch", f"--signal={signal}", job_id], what=f"signal job {job_id}", check=False
    )
    return sent.returncode == 0
