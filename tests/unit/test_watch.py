"""hpcbox.jobs.watch: the jobs a process waits on at one cluster, looked at together on one schedule.
Slurm is a stand-in here (its look, what `jobs.look` returns) and time a counter; bench/bench_polling.py
measures the same waits' calls on the mini cluster's Slurm."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.jobs.watch import MAX_INTERVAL_S, MAX_PEEK_INTERVAL_S, SHARE, Watch
from hpcbox.ledger import JobRecord
from hpcbox.tools import slurm
from hpcbox.tools.slurm import JobState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class StandInSlurm:
    """Jobs that end at given times; each look answers every record asked, and is kept."""

    def __init__(self, clock: Clock, ends: dict[str, float]) -> None:
        self.clock, self.ends = clock, ends
        self.looks: list[tuple[float, tuple[str, ...]]] = []  # when, and the records asked about
        self.peeks: list[float] = []
        self.kept_before: set[str] = set()

    def state(self, job_id: str) -> JobState:
        ended = self.clock.now >= self.ends[job_id]
        return JobState(job_id, "COMPLETED" if ended else "RUNNING", exit_code="0:0" if ended else "")

    def peek(self, records) -> set[str]:
        """The exit statuses the run folders keep: each job's and task's from its end on, and those
        listed in ``kept_before`` (an earlier run's) from the start."""
        self.peeks.append(self.clock.now)
        keys = [f"{r.job_id}_{task}" for r in records for task in range(len(r.sweep))]
        keys += [r.job_id for r in records if not r.sweep]
        return {key for key in keys if self.clock.now >= self.ends.get(key, 0) or key in self.kept_before}

    def read(self, records) -> slurm.Looked:
        self.looks.append((self.clock.now, tuple(record.job_id for record in records)))
        found: slurm.Looked = {}
        for record in records:
            keys = [f"{record.job_id}_{task}" for task in range(len(record.sweep))] or [record.job_id]
            found.update({key: self.state(key) for key in keys if key in self.ends})
        return found


def record(job_id: str, tasks: int = 0) -> JobRecord:
    return JobRecord(
        job_id=job_id, cluster="edi", host="me@login.edi:22", submitted_at="2026-12-05T10:00:00+00:00",
        submit_dir="/s", script=f"/s/scripts/{job_id}.sh", log="/s/logs/x.out", run_dir=f"/s/runs/{job_id}",
        sif="s.sif", sif_sha256="ab" * 32, image="i:1", code_revision="0", code_snapshot="cd" * 32,
        dataset_sha256="ef" * 32, resources={"array": f"0-{tasks - 1}"} if tasks else {},
        trainer_args=(), sweep=tuple((str(task),) for task in range(tasks)),
    )  # fmt: skip


def watched(
    ends: dict[str, float], *records: JobRecord, peek: bool = False
) -> tuple[Clock, StandInSlurm, Watch]:
    clock = Clock()
    cluster = StandInSlurm(clock, ends)
    watch = Watch(cluster.read, peek=cluster.peek if peek else None, clock=clock.monotonic, sleep=clock.sleep)
    for each in records:
        watch.add(each)
    return clock, cluster, watch


def test_separate_jobs_and_an_arrays_tasks_share_each_look():
    clock, cluster, watch = watched(
        {"5": 10, "6": 30, "7_0": 5, "7_1": 20}, record("5"), record("6"), record("7", 2)
    )
    assert [watch.state(key).state for key in ("5", "6", "7_0", "7_1")] == ["RUNNING"] * 4
    assert cluster.looks == [(0.0, ("5", "6", "7"))]  # one look answered all four
    clock.now = 6
    assert watch.state("7_0").state == "COMPLETED" and len(cluster.looks) == 2
    assert watch.state("5").state == "RUNNING" and len(cluster.looks) == 2  # the same look's
    clock.now = 40
    assert watch.state("6").state == "COMPLETED"
    assert [watch.state(key).state for key in ("5", "7_1")] == ["COMPLETED"] * 2
    assert len(cluster.looks) == 3


def test_an_arrays_own_id_reads_as_its_tasks_together_from_the_same_look():
    """A race asks whether an array job has started by its own id, which no look answers (a look says
    each task's): running while any task runs, its tasks' end once all have ended."""
    clock, cluster, watch = watched({"7_0": 5, "7_1": 20}, record("7", 2))
    assert watch.state("7") == JobState("7", "RUNNING", source="array") and len(cluster.looks) == 1
    clock.now = 6
    assert watch.state("7").state == "RUNNING" and len(cluster.looks) == 2  # one look for both tasks
    clock.now = 25
    assert watch.state("7", fresh=True).state == "COMPLETED" and len(cluster.looks) == 3
    assert watch.state("7").state == "COMPLETED" and len(cluster.looks) == 3  # ended: not asked again


def test_a_job_seen_ended_is_never_asked_about_again():
    clock, cluster, watch = watched({"5": 1, "6": 100}, record("5"), record("6"))
    clock.now = 2
    watch.state("5")
    clock.now = 50
    assert watch.state("5").state == "COMPLETED"  # kept: no look for it
    watch.state("6")
    assert cluster.looks[-1] == (50, ("6",))


def test_looks_space_out_with_the_time_waited_up_to_a_minute_and_a_new_job_starts_them_again():
    clock, cluster, watch = watched({"5": 10_000, "6": 20_000}, record("5"))
    found = watch.state("5")
    assert found.state == "RUNNING"
    waits = []
    for _ in range(100):
        waits.append(watch.due_in_s())
        clock.sleep(waits[-1])
        watch.state("5")
    assert waits[0] == slurm.FIRST_POLL_S and waits[-1] == pytest.approx(MAX_INTERVAL_S)
    assert all(later >= earlier - 1e-6 for earlier, later in itertools.pairwise(waits))  # never sooner
    # Each wait is SHARE of the time since the job was added (at 0), once over FIRST_POLL_S; a minute
    # once a minute has passed.
    looked = [when for when, _ in cluster.looks]
    expected = [
        MAX_INTERVAL_S if at >= MAX_INTERVAL_S else max(slurm.FIRST_POLL_S, SHARE * at) for at in looked
    ]
    assert [later - earlier for earlier, later in itertools.pairwise(looked)] == pytest.approx(expected[:-1])
    watch.add(record("6"))
    assert watch.due_in_s() == slurm.FIRST_POLL_S  # a new job is looked at soon


def test_asking_before_a_look_is_due_asks_slurm_nothing():
    _clock, cluster, watch = watched({"5": 100}, record("5"))
    watch.state("5")
    for _ in range(1000):  # a `while not job.done()` loop without a sleep
        watch.state("5")
    assert len(cluster.looks) == 1


def test_forget_looks_again_at_once():
    _clock, cluster, watch = watched({"5": 100}, record("5"))
    watch.state("5")
    watch.forget("5")  # e.g. cancelled
    watch.state("5")
    assert len(cluster.looks) == 2


def test_a_job_slurm_does_not_know_is_said_so():
    _clock, _cluster, watch = watched({"7_0": 1}, record("7", 2))
    with pytest.raises(HpcboxError, match="job 7_1 is known to neither squeue nor sacct on edi"):
        watch.state("7_1")


def test_a_thousand_tasks_waited_on_in_turn_cost_a_look_a_minute_after_the_first():
    """As a Hydra multirun or `[job.result() for job in jobs]` waits: task by task, each wait a
    schedule of the watch's, not its own. Tasks end at random over ten minutes."""
    shuffled = random.Random(0)
    ends = {f"7_{task}": shuffled.uniform(5, 600) for task in range(1000)}
    clock, cluster, watch = watched(ends, record("7", 1000))
    for task in range(1000):
        assert watch.wait(f"7_{task}").state == "COMPLETED"
    minutes = [0] * (int(clock.now // 60) + 1)
    for when, _ in cluster.looks:
        minutes[int(when // 60)] += 1
    assert all(count <= 1 for count in minutes[1:]), minutes
    assert minutes[0] <= 45, minutes  # a quarter second apart to 2.5 s, then a tenth of the time waited
    assert clock.now - max(ends.values()) <= MAX_INTERVAL_S  # the last end seen within a minute


def test_a_call_ending_after_the_first_minute_is_seen_within_a_peeks_interval_for_no_look_more():
    """Looks are a minute apart by then; the peek (the login node, no Slurm) finds the exit status its
    run folder keeps within MAX_PEEK_INTERVAL_S and brings the next look forward to see it ended."""
    clock, cluster, watch = watched({"5": 65.0}, record("5"), peek=True)
    assert watch.wait("5").state == "COMPLETED"
    assert 65.0 <= clock.now <= 65.0 + MAX_PEEK_INTERVAL_S
    without = watched({"5": 65.0}, record("5"))
    without[2].wait("5")
    assert without[0].now > 120  # a look a minute: seen at the look after it
    assert len(cluster.looks) == len(without[1].looks) == watch.looks
    # Nothing is peeked while the looks come as often as the peeks would.
    assert min(cluster.peeks) >= 50 and len(cluster.peeks) == watch.peeks <= 20 / MAX_PEEK_INTERVAL_S + 1


def test_an_exit_status_kept_from_an_earlier_run_brings_one_look_forward_once():
    _, cluster, watch = watched({"5": 400.0}, record("5"), peek=True)
    cluster.kept_before = {"5"}  # a requeued job's run folder keeps its last run's status
    assert watch.wait("5").state == "COMPLETED"
    without = watched({"5": 400.0}, record("5"))
    without[2].wait("5")
    assert len(cluster.looks) <= len(without[1].looks) + 1
    after = [when for when, _ in cluster.looks if when > min(cluster.peeks)]
    assert all(
        later - earlier == pytest.approx(MAX_INTERVAL_S) for earlier, later in itertools.pairwise(after)
    )


def test_a_peek_that_fails_finds_nothing_and_the_looks_go_on():
    clock, cluster, _ = watched({"5": 65.0}, record("5"))
    failing = Watch(cluster.read, peek=lambda _records: (_ for _ in ()).throw(HpcboxError("ssh: no answer")),
                    clock=clock.monotonic, sleep=clock.sleep)  # fmt: skip
    failing.add(record("5"))
    assert failing.wait("5").state == "COMPLETED" and failing.peeks == 0


def test_tasks_ending_one_after_another_bring_no_look_forward_before_the_last():
    """An array whose tasks end in a stream (a thousand, waited on in turn): the peek finds some new
    exit status at nearly every turn, and asking Slurm each time would cost a look every few seconds.
    Only the last end, every task's status kept, brings the look forward."""
    ends = {f"7_{task}": 30.0 + task * 2.0 for task in range(100)}  # the last at 228 s
    clock, cluster, watch = watched(ends, record("7", 100), peek=True)
    for task in range(100):
        assert watch.wait(f"7_{task}").state == "COMPLETED"
    assert 228.0 <= clock.now <= 228.0 + MAX_PEEK_INTERVAL_S
    minutes = [int(when // 60) for when, _ in cluster.looks]
    looks_a_minute = [minutes.count(minute) for minute in range(1, max(minutes))]
    assert looks_a_minute and max(looks_a_minute) == 1  # full minutes after the first: one look each


def test_a_wait_of_an_hour_tells_each_new_state_once_and_asks_slurm_about_once_a_minute():
    """`hpcbox.Job.wait` (the demo's) waits so: where it asked every 2 s, an hour cost 1,800 looks."""
    clock, cluster, watch = watched({"5": 3600.0}, record("5"), peek=True)
    said: list[JobState] = []
    assert watch.wait("5", on_change=said.append).state == "COMPLETED"
    assert [found.state for found in said] == ["RUNNING", "COMPLETED"]
    assert 3600.0 <= clock.now <= 3600.0 + MAX_PEEK_INTERVAL_S  # its end seen within a peek
    assert len(cluster.looks) <= 45 + 60  # the first minute's, then a look a minute


def test_a_rerun_of_some_points_is_waited_on_for_those_tasks_alone():
    """`submit --resubmit-failed` sends an array of the failed points only (`--array=3,7-8`), its
    record keeping the whole sweep: the watch waits for tasks 3, 7 and 8, not for tasks never sent."""
    rerun = dataclasses.replace(record("9", tasks=10), resources={"array": "3,7-8%2"})
    assert rerun.array_tasks == (3, 7, 8) and record("5").array_tasks == ()
    _, cluster, watch = watched({"9_3": 5.0, "9_7": 9.0, "9_8": 12.0}, rerun)
    assert [watch.wait(f"9_{task}").state for task in rerun.array_tasks] == ["COMPLETED"] * 3
    assert watch.ended("9_8") and watch.state("9_8").state == "COMPLETED"
    looks = len(cluster.looks)
    watch.look()
    assert len(cluster.looks) == looks  # every task sent has ended: nothing left to ask about
