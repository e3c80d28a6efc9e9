"""`Job`: a job hpcbox submitted, as the project's ledger records it, and its life after submit: state,
wait, logs, fetch, report, cancel. Each call talks to the login node the job was sent to, over the
SSH master the user's commands share (a second call within minutes skips the handshake)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hpcbox.errors import HpcboxError

if TYPE_CHECKING:
    from hpcbox.api.site import Site
    from hpcbox.jobs.watch import Watch
    from hpcbox.ledger import JobRecord
    from hpcbox.project.config import ProjectConfig
    from hpcbox.tools.slurm import JobState

Say = Callable[[str], None]


class Job:
    """Job ``record`` at ``site`` (where it ran: its rehearsal, or the login node it was sent to).

    Made by `Site.submit`, `Site.job` or `Job.find`; ``job_id`` is Slurm's, ``record`` the ledger's
    entry (`.hpcbox/jobs/<cluster>-<id>.json`: paths, digests, resources, arguments)."""

    def __init__(self, site: Site, record: JobRecord) -> None:
        self.site = site
        self.record = record

    @classmethod
    def find(
        cls,
        job_id: str | None = None,
        cluster: str | None = None,
        *,
        project: ProjectConfig | str | Path | None = None,
        say: Say | None = None,
    ) -> Job:
        """Job ``job_id`` (default: the last one submitted from ``project``), on ``cluster`` where given
        (`edi`, or `edi-via-local` for a rehearsal), reached where it ran."""
        from hpcbox.api.site import Site, project_of, to_stderr
        from hpcbox.jobs import Ledger, place_of

        found = project_of(project)
        record = Ledger(found).find(job_id, cluster)
        place = dataclasses.asdict(place_of(record))
        site = Site(
            record.cluster, **place, mini_cluster=record.mini_cluster, project=found, say=say or to_stderr
        )
        return cls(site, record)

    @property
    def job_id(self) -> str:
        return self.record.job_id

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, site={self.record.where!r})"

    def _connection(self):
        """To the login node it ran behind; a job of a mini cluster removed (or made again) since is
        refused first, in one line saying where it ran and where its results are."""
        from hpcbox.jobs import check_reachable

        check_reachable(self.record, self.site.project)
        return self.site.connect()

    def state(self) -> JobState:
        """The job's state (an array's is its tasks' together: running while any runs, COMPLETED when
        all did, else the first that did not), with why it waits, its node and exit code."""
        from hpcbox import jobs

        with self._connection() as connection:
            return jobs.state(connection, self.record)

    def task_states(self) -> dict[int, JobState]:
        """An array job's tasks' states, by task id."""
        from hpcbox import jobs

        with self._connection() as connection:
            return jobs.task_states(connection, self.record)

    @property
    def watch(self) -> Watch:
        """Its site's watch (`Site.watch`), watching it: waits on it and on the site's other jobs in this
        process share one look at Slurm a poll."""
        watch = self.site.watch
        watch.add(self.record)
        return watch

    def describe(self) -> list[str]:
        """The job's state in words: a line, or for an array a line per state with its tasks."""
        from hpcbox import jobs

        with self._connection() as connection:
            if self.record.is_array:
                found = jobs.sweep_outcomes(connection, self.record)
                return jobs.describe_tasks(self.record, found.tasks, found.read_from)
            return [jobs.describe(jobs.state(connection, self.record, runs_so_far=True))]

    def wait(
        self, timeout_s: float = math.inf, *, on_change: Callable[[JobState], None] | None = None
    ) -> JobState:
        """Its state once it has ended, telling ``on_change`` each new state on the way (an array's: its
        tasks' together, once they have all ended; one task's of a sweep: that task's). Looked at
        through its site's `watch`, with the site's other jobs waited on in this process: every few
        seconds at first, once a minute after the first minute, and within seconds of its end (its run
        folder's exit status, seen on the login node); an array's state once ended is its tasks' as the
        watch saw them end, not asked of Slurm again."""
        from hpcbox import jobs

        watch = self.watch
        if not self.record.is_array:
            return watch.wait(self.record.job_id, timeout_s, on_change=on_change)
        deadline, job_id = time.monotonic() + timeout_s, self.record.job_id
        tasks = {task: watch.wait(f"{job_id}_{task}", deadline - time.monotonic()) for task in self._tasks}
        ended = jobs.array_state(tasks)
        assert ended is not None  # an array runs at least one task
        if on_change is not None:
            on_change(ended)
        return ended

    def done(self) -> bool:
        return self.state().finished

    def logs(self, *, follow: bool = False, on_line: Say = print) -> None:
        """Its Slurm log, line by line to ``on_line``; with ``follow``, until the job ends. A job of a
        mini cluster removed (or made again) since: the copy its fetch brought here."""
        from hpcbox import jobs

        if copies := self._logs_fetched_from_a_cluster_gone():
            for copy in copies:
                if len(copies) > 1:
                    on_line(f"==> {copy.name} <==")
                for line in copy.read_text(errors="replace").splitlines():
                    on_line(line)
            return
        with self._connection() as connection:
            jobs.logs(connection, self.record, follow=follow, on_line=on_line)

    def log_text(self) -> str | None:
        """Its Slurm log as it stands now, read on the cluster while it runs (a task's: its own);
        None before it has written one. A job of a mini cluster gone since: the copy fetched here."""
        from hpcbox import jobs

        if copies := self._logs_fetched_from_a_cluster_gone():
            return copies[0].read_text(errors="replace")
        with self._connection() as connection:
            return jobs.log_text(connection, self.record)

    def _logs_fetched_from_a_cluster_gone(self) -> list[Path]:
        """Where its mini cluster has gone since and a fetch brought its logs here: those copies, said
        so first (its log on the cluster went with it); [] otherwise (`_connection` refuses a job gone
        with nothing fetched)."""
        from hpcbox import jobs

        project = self.site.project
        if (gone := jobs.gone(self.record, project)) is None:
            return []
        if copies := jobs.fetched_logs(project, self.record):
            self.site.say(f"hpcbox: {gone}; its log as fetched there:")
        return copies

    def task(self, index: int) -> Job:
        """Task ``index`` of this array job as a job of its own: its state, log, results and cancel are
        that task's alone (`-j 12_3` on the command line)."""
        return Job(self.site, self.record.of_task(index))

    def fetch(self, *, follow: bool = False, every_s: float | None = None, on_line: Say = print) -> Path:
        """Its results, checkpoints, metrics and log copied to `runs/<cluster>/<job>/` (resumable: a
        second fetch brings only what is new); what came is said in bytes. The folder.

        With ``follow``, fetched again every ``every_s`` (10 s) while it runs (what the job has copied:
        its small files that changed, every 10 s; everything, every `sync_every`), each new
        line of its metrics said as figures to ``on_line``, until it ends and its last results came:
        TensorBoard, pointed at the folder, draws its curves as it trains."""
        from hpcbox import jobs

        with self._connection() as connection:
            if not follow:
                local, transfer = jobs.fetch(connection, self.site.project, self.record)
            else:
                local, transfer = jobs.fetch_following(
                    connection, self.site.project, self.record, self._ended,
                    every_s=every_s or jobs.FOLLOW_EVERY_S, on_line=on_line,
                )  # fmt: skip
        self.site.say(f"hpcbox: received {transfer.received:,} bytes")
        return local

    @contextlib.contextmanager
    def tensorboard(self) -> Iterator[str]:
        """TensorBoard on this machine over its results as fetched (`runs/<cluster>/<job>/`: every event
        file in it, each folder a run), for the block: its URL. Beside `fetch(follow=True)`, it draws
        the curves as the job trains (it reads the folder again every 2 s)."""
        from hpcbox import jobs
        from hpcbox.tools import tensorboard

        with tensorboard.serving(jobs.local_run_dir(self.site.project, self.record)) as url:
            yield url

    @property
    def _tasks(self) -> tuple[int, ...]:
        """The array tasks it stands for: one where it is one task of a sweep (`-j 3_2`), else those its
        --array ran (a rerun of failed points: those alone)."""
        return (self.record.task,) if self.record.task is not None else self.record.array_tasks

    def _ended(self) -> bool:
        """Whether it has ended, as its site's watch last saw (an array: each task it runs)."""
        watch, job_id = self.watch, self.record.job_id
        if not self.record.is_array:
            return watch.state(job_id).finished
        return all(watch.state(f"{job_id}_{task}").finished for task in self._tasks)

    def report(self) -> tuple[str, Path]:
        """Was it efficient: CPU, memory, time, GPUs, throughput, data wait, each with advice; and a PNG
        of its figures (after fetching its results). A sweep's: a line per point, and its results
        folder in place of a plot."""
        from hpcbox import jobs

        with self._connection() as connection:
            return jobs.report(connection, self.site.project, self.record)

    def cancel(self, *, outright: bool = False) -> JobState | None:
        """Stop it so that it keeps what it wrote: it checkpoints and copies its results back, then
        ends (cancelled outright after a grace period). Its last state. ``outright``: `scancel` it and
        return at once (None), keeping nothing (a race's loser); cancelling twice is harmless."""
        from hpcbox import jobs
        from hpcbox.tools import slurm

        with self._connection() as connection:
            if outright:
                try:
                    slurm.cancel(connection, self.job_id)
                except HpcboxError:
                    if not jobs.state(connection, self.record).finished:
                        raise  # else it had ended meanwhile: nothing to cancel
                self.site.watch.forget(self.job_id)
                return None
            return jobs.cancel(connection, self.record, say=self.site.say)

    def attach_notebook(self, *, show: Say = print) -> None:
        """Reach this notebook job again (from another terminal, or after a network drop): its URL to
        ``show``, forwarded until Ctrl-C (which ends it) or SIGHUP/SIGTERM."""
        from hpcbox.jobs import notebook as notebooks
        from hpcbox.jobs.connect import require_slurm

        require_slurm(self.site.profile)
        notebooks.require_notebook(self.record)
        with self._connection() as connection:
            notebooks.serve(connection, self.site.profile, self.record, say=self.site.say, show=show)


def describe(found: JobState) -> str:
    """A job's state in words: `job 12: RUNNING, elapsed 00:00:42 of 00:10:00, on node1` (why it waits,
    its exit code, a memory kill's cause, where they apply)."""
    from hpcbox import jobs

    return jobs.describe(found)
