"""Jobs waited on at one cluster, looked at together and less often the longer the wait.

Whatever waits on many jobs of one cluster in a process (the executor's calls, a Hydra multirun's
points, their arrays' tasks) shares the cluster's `Watch`: each look asks Slurm about all its unfinished
jobs at once (`tools.slurm.look`: one squeue, one sacct for those that ended), a job seen ended is never
asked about again, and the looks space out with the time since the last job was added: every
FIRST_POLL_S at first, then every SHARE of that time, and once MAX_INTERVAL_S has passed, every
MAX_INTERVAL_S, whoever asks and however often (submitit's watcher: 0, 2, 4, 8 ... 64, then every
minute). A thousand tasks waited on cost what one does: one look a minute after the first minute (a
squeue, and a sacct where some task has ended; bench/bench_polling.py). A job cancelled is looked at
again at once.

Between looks, a peek asks the login node, not Slurm, which of the watched jobs' run folders keep an
exit status (the job script writes it as it ends): on the look's schedule, but at least every
MAX_PEEK_INTERVAL_S. Once every job and task not yet seen ended keeps one, one of them newly, the next
look comes now. Slurm stays the one that says a job ended; the peek only tells when asking it is worth
it, so work that ends just after the looks have gone over to one a minute is seen within seconds, and a
stream of tasks ending one after another (an array of a thousand) brings no look forward before its
last: it costs Slurm what it did without the peek."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from hpcbox.errors import HpcboxError
from hpcbox.jobs.follow import array_state
from hpcbox.ledger import JobRecord
from hpcbox.tools import slurm

# Each look's wait: this share of the time since the last job was added, never less than
# slurm.FIRST_POLL_S: a call of a few seconds is seen ending within a quarter of a second (with half,
# the executor's benchmark measured a call of two seconds at twice its floor) ...
SHARE = 0.1
# ... until that time reaches this, then this (submitit's watcher's delay_s): once a minute from the
# first minute on, where submitit's 0, 2, 4 ... 64, 124 s reach it at its second.
MAX_INTERVAL_S = 60.0
# The longest wait between peeks: a shell command on the login node through the open SSH connection,
# which no scheduler counts.
MAX_PEEK_INTERVAL_S = 5.0

# The transport: one look at ``records`` (each an array's or a single job's), by job id and `ID_TASK`.
Read = Callable[[Sequence[JobRecord]], slurm.Looked]
# The peek: which of ``records`` and their tasks keep an exit status in their run folders (job ids and
# `ID_TASK`s).
Peek = Callable[[Sequence[JobRecord]], set[str]]


class Watch:
    """The jobs of one cluster a process waits on, and what the last look said of each (``read``: one
    look at the records given, `jobs.look` over the cluster's connection, or a stand-in; ``peek``: which
    of them keep an exit status, `jobs.exits_kept` there, or none)."""

    def __init__(
        self,
        read: Read,
        *,
        peek: Peek | None = None,
        max_interval_s: float = MAX_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._read, self._peek = read, peek
        self.max_interval_s = max_interval_s
        self._clock, self._sleep = clock, sleep
        self._records: dict[str, JobRecord] = {}  # by job id (an array's own)
        self._said: slurm.Looked = {}  # the last look's, by job id and ID_TASK
        self._final: dict[str, slurm.JobState] = {}  # seen ended: never asked about again
        self._exits_seen: set[str] = set()  # found by a peek: each brings one look forward, once
        self._added_at = clock()
        self._next_look_at = -math.inf  # when a look is due: set at each look, from the schedule then
        self._next_peek_at = math.inf  # likewise, from each look and peek (none before the first look)
        self.looks = self.peeks = 0

    def add(self, record: JobRecord) -> None:
        """Watch ``record`` (a single job or an array, not one of its tasks); a job new to the watch
        starts its schedule again, as the first looks at a job are the likeliest to find it changed."""
        if record.job_id not in self._records:
            self._records[record.job_id] = record
            self._added_at = now = self._clock()
            self._next_look_at = min(self._next_look_at, now + slurm.FIRST_POLL_S)

    @property
    def interval_s(self) -> float:
        """The wait after a look made now."""
        waited = self._clock() - self._added_at
        if waited >= self.max_interval_s:
            return self.max_interval_s
        return max(slurm.FIRST_POLL_S, SHARE * waited)

    @property
    def peek_interval_s(self) -> float:
        """The wait after a look or peek made now until the next peek."""
        return min(self.interval_s, MAX_PEEK_INTERVAL_S)

    def due_in_s(self) -> float:
        """Seconds until the next look or peek is due (0: now)."""
        return max(0.0, min(self._next_look_at, self._next_peek_at) - self._clock())

    def state(self, job_id: str, *, fresh: bool = False) -> slurm.JobState:
        """Job (or task, `ID_TASK`) ``job_id``'s state: as last seen where it had ended or no look is due
        yet, else from a look at every unfinished job of the watch (made now where a peek due now finds
        a job's exit status new); ``fresh``: a look now. An array's own id: its tasks' states together
        (running while any runs), from the same look."""
        record = self._records.get(job_id)
        if record is not None and record.is_array:
            tasks = {task: self.state(f"{job_id}_{task}", fresh=fresh and not index)
                     for index, task in enumerate(record.array_tasks)}  # fmt: skip
            found = array_state(tasks)
            assert found is not None  # an array runs at least one task
            return found
        if job_id in self._final:
            return self._final[job_id]
        if fresh or job_id not in self._said or self._look_due():
            self.look()
        found = self._said.get(job_id, self._said.get(job_id.partition("_")[0]))
        if isinstance(found, HpcboxError):
            raise found
        if found is None or found.job_id != job_id:
            record = self._records.get(job_id.partition("_")[0])
            where = f" on {record.cluster}" if record else ""
            raise HpcboxError(
                f"job {job_id} is known to neither squeue nor sacct{where}",
                "Slurm forgets finished jobs after a while where accounting is off",
            )
        return found

    def look(self) -> None:
        """Ask about every watched job not seen ended, in one look."""
        unfinished = [record for record in self._records.values() if not self._ended(record)]
        self._next_look_at = self._clock() + self.interval_s
        self._next_peek_at = self._clock() + self.peek_interval_s if self._peek else math.inf
        if not unfinished:
            return
        said = self._read(unfinished)
        self.looks += 1
        self._said.update(said)
        for key, found in said.items():
            if isinstance(found, slurm.JobState) and found.finished:
                self._final[key] = found

    def _look_due(self) -> bool:
        """Whether a look is due now: by the schedule, or by a peek due now that finds an exit status."""
        now = self._clock()
        return now >= self._next_look_at or (now >= self._next_peek_at and self._exits_kept())

    def _exits_kept(self) -> bool:
        """Peek: whether every job and task of the watch not yet seen ended keeps an exit status, one of
        them not found before (one kept from an earlier run brings one look forward, once). A login node
        that does not answer finds none: the look due next says why."""
        assert self._peek is not None  # no peek is ever due without one
        self._next_peek_at = self._clock() + self.peek_interval_s
        unfinished = [record for record in self._records.values() if not self._ended(record)]
        if not unfinished:
            return False
        try:
            found = self._peek(unfinished)
        except HpcboxError:
            return False
        self.peeks += 1
        waited_on = {key for record in unfinished for key in _keys(record)} - set(self._final)
        new = (found & waited_on) - self._exits_seen
        self._exits_seen |= found
        return bool(new) and waited_on <= found

    def ended(self, job_id: str) -> bool:
        """Whether job (or task) ``job_id`` was seen ended."""
        return job_id in self._final

    def _ended(self, record: JobRecord) -> bool:
        return all(key in self._final for key in _keys(record))

    def wait(
        self,
        job_id: str,
        timeout_s: float = math.inf,
        *,
        on_change: Callable[[slurm.JobState], None] | None = None,
    ) -> slurm.JobState:
        """Until job (or task) ``job_id`` has ended, looking as the schedule says and telling
        ``on_change`` each new state; a login node that does not answer and accounting that is silent
        are ridden out as `tools.slurm.poll` rides them."""
        return slurm.poll(
            lambda: self.state(job_id),
            job_id,
            timeout_s=timeout_s,
            on_change=on_change,
            pause_s=self.due_in_s,
            sleep=self._sleep,
        )

    def forget(self, job_id: str) -> None:
        """Read job (or task) ``job_id`` again at once: Slurm was told something of it (a cancel)."""
        self._final.pop(job_id, None)
        self._said.pop(job_id, None)
        self._next_look_at = -math.inf


def _keys(record: JobRecord) -> list[str]:
    """What a look answers for ``record``: each task's `ID_TASK` of an array, else its id."""
    if record.is_array:
        return [f"{record.job_id}_{task}" for task in record.array_tasks]
    return [record.job_id]


_WATCHES: dict[tuple[object, ...], Watch] = {}


def watch_at(key: tuple[object, ...], read: Read, peek: Peek | None = None) -> Watch:
    """The process's watch of the cluster ``key`` names (its login node, and the project), made with
    ``read`` and ``peek`` the first time: every wait on that cluster's jobs in this process shares it."""
    if key not in _WATCHES:
        _WATCHES[key] = Watch(read, peek=peek)
    return _WATCHES[key]
