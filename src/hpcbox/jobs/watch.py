"""Jobs waited on at one cluster, looked at together and less often the longer the wait.

Whatever waits on many jobs of one cluster in a process (the executor's calls, a Hydra multirun's
points, their arrays' tasks) shares the cluster's `Watch`: each look asks Slurm about all its unfinished
jobs at once (`tools.slurm.look`: one squeue, one sacct for those that ended), a job seen ended is never
asked about again, and the looks space out with the time since the last job was added: every
FIRST_POLL_S at first, then every SHARE of that time, and once MAX_INTERVAL_S has passed, every
MAX_INTERVAL_S, whoever asks and however often (submitit's watcher: 0, 2, 4, 8 ... 64, then every
minute). A thousand tasks waited on cost what one does: one look a minute after the first minute (a
squeue, and a sacct where some task has ended; bench/bench_polling.py). A job cancelled is looked at
again at once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from hpcbox.errors import HpcboxError
from hpcbox.ledger import JobRecord
from hpcbox.tools import slurm

# Each look's wait: this share of the time since the last job was added, never less than
# slurm.FIRST_POLL_S: a call of a few seconds is seen ending within a quarter of a second (with half,
# the executor's benchmark measured a call of two seconds at twice its floor) ...
SHARE = 0.1
# ... until that time reaches this, then this (submitit's watcher's delay_s): once a minute from the
# first minute on, where submitit's 0, 2, 4 ... 64, 124 s reach it at its second.
MAX_INTERVAL_S = 60.0

# The transport: one look at ``records`` (each an array's or a single job's), by job id and `ID_TASK`.
Read = Callable[[Sequence[JobRecord]], slurm.Looked]


class Watch:
    """The jobs of one cluster a process waits on, and what the last look said of each (``read``: one
    look at the records given, `jobs.look` over the cluster's connection, or a stand-in)."""

    def __init__(
        self,
        read: Read,
        *,
        max_interval_s: float = MAX_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._read = read
        self.max_interval_s = max_interval_s
        self._clock, self._sleep = clock, sleep
        self._records: dict[str, JobRecord] = {}  # by job id (an array's own)
        self._said: slurm.Looked = {}  # the last look's, by job id and ID_TASK
        self._final: dict[str, slurm.JobState] = {}  # seen ended: never asked about again
        self._added_at = clock()
        self._next_look_at = -math.inf  # when a look is due: set at each look, from the schedule then
        self.looks = 0

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

    def due_in_s(self) -> float:
        """Seconds until the next look is due (0: now)."""
        return max(0.0, self._next_look_at - self._clock())

    def state(self, job_id: str, *, fresh: bool = False) -> slurm.JobState:
        """Job (or task, `ID_TASK`) ``job_id``'s state: as last seen where it had ended or no look is due
        yet, else from a look at every unfinished job of the watch; ``fresh``: a look now."""
        if job_id in self._final:
            return self._final[job_id]
        if fresh or self.due_in_s() == 0 or job_id not in self._said:
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
        if not unfinished:
            return
        said = self._read(unfinished)
        self.looks += 1
        self._said.update(said)
        for key, found in said.items():
            if isinstance(found, slurm.JobState) and found.finished:
                self._final[key] = found

    def ended(self, job_id: str) -> bool:
        """Whether job (or task) ``job_id`` was seen ended."""
        return job_id in self._final

    def _ended(self, record: JobRecord) -> bool:
        if not record.is_array:
            return record.job_id in self._final
        tasks = len(record.sweep)
        prefix = f"{record.job_id}_"
        ended = sum(key.startswith(prefix) for key in self._final)
        return bool(tasks) and ended == tasks

    def wait(self, job_id: str, timeout_s: float = math.inf) -> slurm.JobState:
        """Until job (or task) ``job_id`` has ended, looking as the schedule says; a login node that does
        not answer and accounting that is silent are ridden out as `tools.slurm.poll` rides them."""
        return slurm.poll(
            lambda: self.state(job_id), job_id, timeout_s=timeout_s, pause_s=self.due_in_s, sleep=self._sleep
        )

    def forget(self, job_id: str) -> None:
        """Read job (or task) ``job_id`` again at once: Slurm was told something of it (a cancel)."""
        self._final.pop(job_id, None)
        self._said.pop(job_id, None)
        self._next_look_at = -math.inf


_WATCHES: dict[tuple[object, ...], Watch] = {}


def watch_at(key: tuple[object, ...], read: Read) -> Watch:
    """The process's watch of the cluster ``key`` names (its login node, and the project), made with
    ``read`` the first time: every wait on that cluster's jobs in this process shares it."""
    if key not in _WATCHES:
        _WATCHES[key] = Watch(read)
    return _WATCHES[key]
