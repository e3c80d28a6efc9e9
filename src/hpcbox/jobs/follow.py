"""A job's life after submit: its state (an array's tasks together), waiting, its logs, cancelling it."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcbox.errors import HpcboxError
from hpcbox.jobs.connect import connection_target
from hpcbox.ledger import JobRecord, Ledger
from hpcbox.project.config import ProjectConfig
from hpcbox.render.sbatch import OUTCOME_FILE, SCRIPT_STARTED
from hpcbox.render.sweep import Sweep
from hpcbox.report import efficiency
from hpcbox.tools import slurm, ssh

# How long `cancel` lets the job script copy its results back before it cancels outright.
CANCEL_GRACE_S = 120
# `logs --follow` asks Slurm whether the job is over every few seconds for this long, then at most
# this often (but every few seconds once every task keeps its exit status), as jobs.watch does.
FOLLOW_ASK_S = 60
# A sweep's point whose run folder kept no exit status: killed before its script ended, or lost.
NO_OUTCOME = "NO_OUTCOME"


def state(connection: ssh.Connection, record: JobRecord, *, runs_so_far: bool = False) -> slurm.JobState:
    """The job's state; an array's is its tasks' together: running while any runs, pending while any
    waits, else COMPLETED when all did, else the state of the first that did not. A task's is its own,
    read among its array's (`squeue --array`: a pending task has no line of its own without it). With
    ``runs_so_far``, a running job's requeues too (a call more: asked by `status`, not by a wait's polls)."""
    found = _with_cause(connection, found_in(look(connection, [_looked_at(record)]), record))
    if runs_so_far and found.state == "RUNNING" and not record.is_array:
        counted = slurm.restarts(connection, [found.job_id]).get(found.job_id, 0)
        found = dataclasses.replace(found, restarts=counted)
    return found


def _looked_at(record: JobRecord) -> JobRecord:
    """What a look asks Slurm about for ``record``: a task's array (its tasks not known: `*`), else the job
    itself."""
    if record.task is None:
        return record
    array_id = record.job_id.partition("_")[0]
    return dataclasses.replace(
        record, job_id=array_id, task=None, resources={**record.resources, "array": "*"}
    )


def found_in(said: slurm.Looked, record: JobRecord) -> slurm.JobState:
    """``record``'s state in a look's answer (`look`): its own, or its array's tasks' together."""
    found = array_state(slurm.tasks_in(said, record.job_id)) if record.is_array else said.get(record.job_id)
    if found is None:
        found = said.get(record.job_id.partition("_")[0])
    if isinstance(found, HpcboxError):
        raise found
    if found is None:
        raise HpcboxError(
            f"job {record.job_id} is known to neither squeue nor sacct on {record.cluster}",
            "Slurm forgets finished jobs after a while where accounting is off; its results may still be "
            f"in {record.run_dir} (`hpcbox fetch -j {record.job_id}`)",
        )
    return found


def _with_cause(connection: ssh.Connection, found: slurm.JobState) -> slurm.JobState:
    if found.source == "sacct" and found.state in _MAYBE_MEMORY:
        return _with_memory_cause(connection, found)
    return found


# Where Slurm enforces --mem by its accounting, a job killed for memory ends FAILED or CANCELLED.
_MAYBE_MEMORY = ("FAILED", "CANCELLED", "OUT_OF_MEMORY")
_MEMORY_FIELDS = ("JobID", "State", "Start", "NCPUS", "NNodes", "ReqMem", "MaxRSS")


def _with_memory_cause(connection: ssh.Connection, found: slurm.JobState) -> slurm.JobState:
    """``found`` with a note saying it ran out of memory and the --mem to ask, where it did."""
    try:
        killed = efficiency.memory_kill(slurm.sacct_rows(connection, found.job_id, _MEMORY_FIELDS))
    except (HpcboxError, ValueError):
        return found  # the state stands on its own; `hpcbox report` says more when sacct does
    return dataclasses.replace(found, note=killed.in_words()) if killed else found


def look(connection: ssh.Connection, records: Sequence[JobRecord]) -> slurm.Looked:
    """One look at ``records`` (single jobs and arrays of one cluster): each one's state by its id, each
    array task's by `ID_TASK` (`tools.slurm.look`: one squeue for them all, one sacct for those that
    ended)."""
    watched = [
        slurm.Watched(record.job_id, record.script, record.is_array, len(record.array_tasks))
        for record in records
    ]
    return slurm.look(connection, watched)


def exits_kept(connection: ssh.Connection, records: Sequence[JobRecord]) -> set[str]:
    """The jobs of ``records`` (by id) and their array tasks (by `ID_TASK`) whose run folders on the
    cluster keep an exit status (OUTCOME_FILE, which the job script writes as it ends, with the results
    copied back), in one command on the login node: no call to Slurm."""
    kept_at = {f"{record.run_dir}/{OUTCOME_FILE}": record.job_id for record in records if not record.is_array}
    patterns = " ".join(_exit_words(record) for record in records)
    listed = connection.run(
        f'for kept in {patterns}; do if test -f "$kept"; then printf "%s\\n" "$kept"; fi; done',
        what="look for the exit statuses the jobs' run folders keep",
    )
    arrays = {record.run_dir: record.job_id for record in records if record.is_array}
    found = set()
    for path in listed.stdout.splitlines():
        if path in kept_at:
            found.add(kept_at[path])
            continue
        folder, _, task = path.removesuffix(f"/{OUTCOME_FILE}").rpartition("/")
        if folder in arrays and task.isdigit():
            found.add(f"{arrays[folder]}_{task}")
    return found


def task_states(connection: ssh.Connection, record: JobRecord) -> dict[int, slurm.JobState]:
    return slurm.task_states(connection, record.job_id, record.script)


def array_state(tasks: dict[int, slurm.JobState]) -> slurm.JobState | None:
    if not tasks:
        return None
    first = next(iter(tasks.values()))
    job_id = first.job_id.rpartition("_")[0]
    for waiting in ("RUNNING", "PENDING"):
        if any(task.state == waiting for task in tasks.values()):
            return slurm.JobState(job_id, waiting, source="array")
    unfinished = [task for task in tasks.values() if not task.finished]
    if unfinished:
        return slurm.JobState(job_id, unfinished[0].state, source="array")
    failed = [task for task in tasks.values() if task.state != "COMPLETED"]
    return slurm.JobState(
        job_id, failed[0].state if failed else "COMPLETED", exit_code=failed[0].exit_code if failed else "0:0"
    )


@dataclass(frozen=True)
class Outcomes:
    """A sweep's tasks' states, by task, and where they were read where not from Slurm."""

    tasks: dict[int, slurm.JobState]
    read_from: str = ""  # "": Slurm; else the run folders that kept each task's exit status

    def __str__(self) -> str:
        return f"from {self.read_from}" if self.read_from else "from Slurm"


def sweep_outcomes(connection: ssh.Connection, record: JobRecord) -> Outcomes:
    """Each task's state: Slurm's; where Slurm no longer knows the job (its accounting has forgotten
    it), the exit status each task's run folder on the cluster keeps (render.sbatch.OUTCOME_FILE)."""
    tasks = task_states(connection, record)
    if tasks:
        return Outcomes(tasks)
    listed = connection.run(
        f'for kept in {shlex.quote(record.run_dir)}/*/{OUTCOME_FILE}; do if test -f "$kept"; then '
        'task=${kept%/*}; printf "%s %s\\n" "${task##*/}" "$(cat "$kept")"; fi; done',
        what="read the outcome each task's run folder keeps",
    )
    kept = dict(line.split(maxsplit=1) for line in listed.stdout.splitlines() if " " in line)
    return outcomes_kept(record, kept, f"the run folders on the cluster ({record.run_dir})")


def fetched_outcomes(project: ProjectConfig, record: JobRecord) -> Outcomes:
    """Each task's state from the exit status its fetched run folder here keeps (a sweep whose cluster
    is gone: what was fetched is all there is)."""
    from hpcbox.jobs.fetch import local_run_dir, shown_run_dir

    kept = {
        found.parent.name: found.read_text().strip()
        for found in local_run_dir(project, record).glob(f"*/{OUTCOME_FILE}")
        if found.is_file()
    }
    return outcomes_kept(record, kept, f"its results fetched to {shown_run_dir(project, record)}")


def outcomes_kept(record: JobRecord, kept: dict[str, str], read_from: str) -> Outcomes:
    """Each point's state from the exit statuses its run folders kept (task id -> status): COMPLETED
    for 0, FAILED for another; a point with none kept (killed before its script ended, or lost) is
    NO_OUTCOME, which a rerun of the failed points runs again too. The points its --array ran: a rerun's
    record keeps the whole sweep."""
    tasks = {}
    for index in record.array_tasks:
        status = kept.get(str(index))
        task = f"{record.job_id}_{index}"
        if status is None:
            tasks[index] = slurm.JobState(task, NO_OUTCOME, source="run folder", note="no exit status kept")
        else:
            state = "COMPLETED" if status == "0" else "FAILED"
            tasks[index] = slurm.JobState(task, state, exit_code=f"{status}:0", source="run folder")
    return Outcomes(tasks, read_from)


def describe_tasks(record: JobRecord, tasks: dict[int, slurm.JobState], read_from: str = "") -> list[str]:
    """The array's tasks for people: how many are in each state, then one line per task (its point);
    ``read_from``: where the states come from, where not from Slurm."""
    counts: dict[str, int] = {}
    for task in tasks.values():
        counts[task.state] = counts.get(task.state, 0) + 1
    summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    lines = [f"job {record.job_id}: {len(tasks)} array task{'s' if len(tasks) != 1 else ''}: {summary}"]
    if read_from:
        lines[0] += f" (Slurm no longer knows it: from {read_from})"
    for index, task in tasks.items():
        point = record.sweep[index] if index < len(record.sweep) else ()
        lines.append("  " + describe(task) + (f" ({shlex.join(point)})" if point else ""))
    return lines


def sweep_of(record: JobRecord) -> Sweep:
    """The sweep a job ran, as its record keeps it (its throttle from the array's %N)."""
    _, percent, throttle = str(record.resources.get("array") or "").partition("%")
    return Sweep(f"job {record.job_id}'s sweep", record.sweep, int(throttle) if percent else None)


def failed_tasks(record: JobRecord, tasks: dict[int, slurm.JobState]) -> tuple[int, ...]:
    """The tasks of a finished sweep that did not complete (failed, timed out, cancelled, out of
    memory, lost with their node, or with no outcome kept): what `submit --resubmit-failed` runs
    again."""
    if not record.sweep:
        raise HpcboxError(
            f"job {record.job_id} is not a sweep",
            "--resubmit-failed reruns the failed points of a --sweep job",
        )
    running = [index for index, task in tasks.items() if not task.finished and task.state != NO_OUTCOME]
    if running:
        raise HpcboxError(
            f"job {record.job_id} still has {len(running)} tasks pending or running",
            f"wait until it ends (`hpcbox status -j {record.job_id}`), or cancel it",
        )
    return tuple(index for index, task in tasks.items() if task.state != "COMPLETED")


# Slurm's words for a time limit that is no duration (sacct's Partition_Limit: a job that never
# started, so never got one), said as words of their own.
_LIMITS_IN_WORDS = {
    "UNLIMITED": "no time limit",
    "INFINITE": "no time limit",
    "Partition_Limit": "its partition's time limit",
}


def describe(found: slurm.JobState) -> str:
    """One line for people: state, and what a pending job waits for (grouped, Slurm's reason with it, and
    its start guess labelled as one) or how a finished job ended."""
    parts = [f"job {found.job_id}: {found.state}"]
    if found.state == "PENDING" and found.reason == "None":  # no reason: Slurm has not looked at it yet
        parts.append(found.waiting_for)
    elif found.state == "PENDING" and found.reason:
        words = found.reason_in_words
        said = f"({found.reason}{': ' + words if words else ''})"
        parts.append(f"{found.waiting_for} {said}" if found.waiting_for else said)
    if found.start_guess:
        parts.append(f"Slurm guesses it starts at {found.start_guess} (its own estimate, not a promise)")
    limit = found.time_limit
    limit_in_words = _LIMITS_IN_WORDS.get(limit, "")
    # Slurm's accounting ended it while it waited (a cancel, a deadline): it had no time, node or exit
    # status of its own (a task's outcome read from its run folder names no node either, yet ran)
    never_ran = found.source == "sacct" and found.finished and not found.nodes and found.runs == 1
    if found.state == "PENDING":
        if limit:
            parts.append(limit_in_words or f"time limit {limit}")
    elif never_ran:
        parts.append("before it started")
    elif found.elapsed:
        runs, given = (f" in its {found.runs} runs", ", each given ") if found.runs > 1 else ("", " of ")
        shown = given + limit if limit and not limit_in_words else ""
        parts.append(f"elapsed {found.elapsed}{runs}{shown}")
        if limit_in_words:
            parts.append(limit_in_words)
    if found.nodes and found.state != "PENDING":
        parts.append(f"on {found.nodes}")
    if found.state == "RUNNING" and found.restarts:
        times = "once" if found.restarts == 1 else f"{found.restarts} times"
        parts.append(f"its run {found.restarts + 1} (Slurm requeued it {times})")
    if found.exit_code and not never_ran:
        parts.append(f"exit code {found.exit_code}")
    if found.preempted_runs:
        runs = "run" if found.preempted_runs == 1 else "runs"
        parts.append(f"preempted and requeued by Slurm ({found.preempted_runs} earlier {runs} PREEMPTED)")
    if found.note:
        parts.append(found.note)
    return ", ".join(parts)


def wait(
    connection: ssh.Connection,
    record: JobRecord,
    *,
    until: Callable[[slurm.JobState], bool] = lambda found: found.finished,
    timeout_s: float = 3600,
    poll_s: float = 2,
    on_change: Callable[[slurm.JobState], None] | None = None,
) -> slurm.JobState:
    """Poll the job until ``until`` holds (default: it finished), telling ``on_change`` each new state."""
    read = lambda: state(connection, record)  # noqa: E731
    return slurm.poll(
        read, record.job_id, until=until, timeout_s=timeout_s, poll_s=poll_s, on_change=on_change
    )


def _signal_batch(connection: ssh.Connection, job_id: str, tries: int = 5) -> bool:
    """TERM to the job's batch shell, tried again a second apart: a scancel --batch of an array task
    squeue had just called RUNNING once failed in a full run (exit status 229, no message), its cause
    not known; a job that just started has nothing to save yet."""
    for attempt in range(tries):
        if slurm.signal_batch(connection, job_id, "TERM"):
            return True
        if attempt + 1 < tries:
            time.sleep(1)
    return False


def follow_command(record: JobRecord, follow: bool) -> str:
    """The remote shell command printing the job's logs, to the end of the job with ``follow``."""
    logs = log_words(record)
    first = _glob_word(record.log)
    if not follow:
        return f"""
set --; for log in {logs}; do if test -f "$log"; then set -- "$@" "$log"; fi; done
if test $# -gt 0; then tail -n +1 -- "$@"; else echo 'hpcbox: no log yet at '{first} >&2; fi
"""
    finished = "|".join(sorted(slurm.FINISHED_STATES))
    job_state = f"squeue --noheader --states=all --jobs={record.job_id} --format=%T 2>&1"
    # Until the job ends: wait for a log to appear, then tail them; a requeued job comes back to PENDING
    # and writes on in the same log, so only a finished state (or a job Slurm forgot) ends it. An array
    # has a line per task: it is over when none of them is in another state. A squeue that fails for
    # another reason (slurmctld busy: "Socket timed out") says nothing of the job: it goes on.
    # Slurm is asked every few seconds in the first minute, then once a minute, and again every few
    # seconds once the run folders keep an exit status for every task (the job script writes it as it
    # ends): a follow of hours costs Slurm a call a minute, and its end is seen within seconds.
    return f"""
over() {{
    local said
    if ! said=$({job_state}); then
        case $said in *'Invalid job id'*) return 0 ;; *) return 1 ;; esac
    fi
    ! printf '%s\n' "$said" | grep -qvxE '{finished}|'
}}
any_log() {{ for log in {logs}; do if test -f "$log"; then return 0; fi; done; return 1; }}
all_kept() {{
    local kept=0 status
    for status in {_exit_words(record)}; do if test -f "$status"; then kept=$((kept + 1)); fi; done
    test "$kept" -ge {len(record.array_tasks) or 1}
}}
ask_now() {{
    local now
    now=$(date +%s)
    if test $((now - started)) -lt {FOLLOW_ASK_S} || test $((now - asked)) -ge {FOLLOW_ASK_S} ||
        all_kept; then
        asked=$now
        return 0
    fi
    return 1
}}
started=$(date +%s); asked=0
until any_log || {{ ask_now && over; }}; do sleep 2; done
any_log || exit 0
tail -n +1 -F -- {logs} 2>/dev/null & tailer=$!
until ask_now && over; do sleep 3; done
sleep 2; kill "$tailer"
"""


def _exit_words(record: JobRecord) -> str:
    """The exit statuses' paths in the job's run folder (each task's own in an array's), as shell words."""
    if record.is_array:
        return f"{shlex.quote(record.run_dir)}/*/{OUTCOME_FILE}"
    return shlex.quote(f"{record.run_dir}/{OUTCOME_FILE}")


def log_words(record: JobRecord) -> str:
    return " ".join(_glob_word(path) for path in (record.log, record.error_log) if path)


def _glob_word(path: str) -> str:
    """``path`` as a shell word: quoted, but for the `*` standing for an array task's id."""
    return "*".join(shlex.quote(part) for part in path.split("*"))


# `log_text`'s remote command's status where the log is not there (yet).
_NO_LOG = 3


def log_text(connection: ssh.Connection, record: JobRecord) -> str | None:
    """The job's log as it stands now (a task's: its own), read on the cluster while the job writes
    it; None before the job has written one."""
    log = shlex.quote(record.log)
    done = connection.run(
        f"if test -f {log}; then cat -- {log}; else exit {_NO_LOG}; fi",
        what=f"read the log of job {record.job_id}",
        check=False,
    )
    if done.returncode == _NO_LOG:
        return None
    if done.returncode != 0:
        raise HpcboxError(f"cannot read the log of job {record.job_id}: {done.stderr.strip()}")
    return done.stdout


def logs(
    connection: ssh.Connection, record: JobRecord, *, follow: bool, on_line: Callable[[str], None]
) -> None:
    connection.stream(
        follow_command(record, follow), what=f"read the log of job {record.job_id}", on_line=on_line
    )


def cancel(
    connection: ssh.Connection,
    record: JobRecord,
    *,
    grace_s: float = CANCEL_GRACE_S,
    say: Callable[[str], None] = print,
) -> slurm.JobState:
    """Stop the job so that nothing it wrote is lost.

    A running job's batch shell alone gets TERM (a plain scancel's TERM also reaches the squashfuse
    process serving the SIF under unprivileged Apptainer, and the trainer dies before it can save):
    the script passes it to the trainer, which checkpoints; the script copies the results to shared
    storage, cleans node scratch and cancels its own job. Past ``grace_s``, a plain scancel.
    """
    found = state(connection, record)
    if found.finished:
        say(f"hpcbox: job {record.job_id} has already ended: {found.state}")
        return found
    if found.state != "RUNNING":
        slurm.cancel(connection, record.job_id)
    elif not script_started(connection, record):
        say(
            f"hpcbox: job {record.job_id} has not started its script yet: cancelling it, with nothing to save"
        )
        slurm.cancel(connection, record.job_id)
    else:
        say(f"hpcbox: asking job {record.job_id} to save its results and stop")
        if not _signal_batch(connection, record.job_id):
            say(f"hpcbox: job {record.job_id}'s batch shell did not take the signal; cancelling it outright")
            slurm.cancel(connection, record.job_id)
    try:
        return wait(connection, record, timeout_s=grace_s, poll_s=1)
    except HpcboxError:
        say(f"hpcbox: job {record.job_id} did not stop within {grace_s:.0f} s; cancelling it outright")
        slurm.cancel(connection, record.job_id)
        return wait(connection, record, timeout_s=60, poll_s=1)


def script_started(connection: ssh.Connection, record: JobRecord) -> bool:
    """Whether the job's script has set its traps, as the line it then writes to its log says (an
    array's: any task's). Before, TERM to its batch shell alone would end it unsaved, and Slurm would
    call the job FAILED, where a plain scancel ends it CANCELLED with nothing yet to save."""
    found = connection.run(
        f"grep -qsE -- {shlex.quote(SCRIPT_STARTED)} {log_words(record)}",
        what=f"read whether job {record.job_id}'s script has started",
        check=False,
    )
    return found.returncode == 0


def overview(project: ProjectConfig, cluster: str | None = None) -> list[str]:
    """A line per ledger entry with its live state, one connection per cluster; a job whose mini
    cluster has gone since is said so (identity.gone), without asking the new one about its id."""
    from hpcbox.jobs.identity import gone
    from hpcbox.render.profiles import load_profile

    records = Ledger(project).on(cluster)
    described: dict[tuple[str, str], str] = {}
    for record in records:
        if (line := gone(record, project)) is not None:
            described[record.where, record.run] = line
    # One connection per cluster: a site's login node, or the mini cluster a rehearsal ran on (of
    # several up, each its own).
    clusters: dict[tuple[str, str], list[JobRecord]] = {}
    for record in records:
        if (record.where, record.run) not in described:
            clusters.setdefault((record.where, record.mini_cluster or ""), []).append(record)
    for (name, _), mine in sorted(clusters.items()):
        try:
            target = connection_target(
                load_profile(mine[0].cluster), project, via=mine[0].via, mini_cluster=mine[0].mini_cluster
            )
            with ssh.Connection(target) as connection:
                said = look(connection, mine)  # one squeue for them all
                for record in mine:
                    # One job the cluster forgot is that job's line only.
                    try:
                        described[name, record.run] = describe(
                            _with_cause(connection, found_in(said, record))
                        )
                    except HpcboxError as exc:
                        described[name, record.run] = _unknown(record, exc)
        except HpcboxError as exc:
            for record in mine:
                described.setdefault((name, record.run), _unknown(record, exc))
    return [
        f"{r.submitted_at}  {r.where:<10} {described[r.where, r.run]}"
        + (f" ({r.race_said})" if r.race else "")
        for r in records
    ]


def _unknown(record: JobRecord, exc: HpcboxError) -> str:
    return f"job {record.job_id}: state unknown ({exc.message})"
