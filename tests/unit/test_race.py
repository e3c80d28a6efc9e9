"""hpcbox.race without a cluster: every entrant sent, each login from a thread of its own, the first to
start kept, the others cancelled (one started in the same look too, and said so), an entrant that
cannot be sent raced without, and each job's ledger entry naming the race. The sites here are stand-ins
for what `race` calls of `hpcbox.Site` and `hpcbox.Job`; tests/integration/test_rehearsal.py races two
accounts on a rehearsal's Slurm."""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from hpcbox.api.race import Entrant, race
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.jobs.watch import Watch
from hpcbox.ledger import JobRecord, Ledger
from hpcbox.project.config import load_project
from hpcbox.render.sweep import Sweep
from hpcbox.tools import slurm
from hpcbox.tools.slurm import JobState

JOB_IDS = itertools.count(100)


class StandInJob:
    """A job as `Site.submit` returns it: an array job (its tasks' ids `--array` names) for a sweep."""

    def __init__(self, site: StandInSite, job_id: str, account: str | None, sweep: Sweep | None) -> None:
        self.site, self.job_id = site, job_id
        array = f"0-{len(sweep.points) - 1}" if sweep else None
        self.record = JobRecord(
            job_id=job_id, cluster=site.where, host="h", submitted_at="2026-12-05T19:00:00+00:00",
            submit_dir="/s", script=f"/s/scripts/{job_id}.sh", log="/s/l.out", run_dir=f"/s/runs/{job_id}",
            sif="s.sif", sif_sha256="ab" * 32, image="i:1", code_revision="0", code_snapshot="cd" * 32,
            dataset_sha256="ef" * 32, resources={"account": account, "array": array},
            trainer_args=(), sweep=sweep.points if sweep else (),
        )  # fmt: skip
        self.cancelled = False

    @property
    def watch(self) -> Watch:
        self.site.watch.add(self.record)
        return self.site.watch

    def cancel(self, *, outright: bool = False) -> None:
        assert outright
        self.cancelled = True


class StandInSite:
    """A site whose jobs start at the look given (None: never); its submit uploads for ``upload_s``
    (after the race's hold), and fails where that is negative."""

    def __init__(
        self,
        where: str,
        project,
        starts_at_look: int | None,
        upload_s: float = 0.0,
        mini_cluster: str | None = None,
    ) -> None:
        self.where, self.project, self.starts_at_look, self.upload_s = (
            where,
            project,
            starts_at_look,
            upload_s,
        )
        self.mini_cluster = mini_cluster
        self.target = (where, mini_cluster)  # one login each
        self.compression = "gzip"  # the SIFs it reads
        self.say = print
        self.prepared = 0
        self.sent_prepared: list[object] = []  # each submit's `prepared`
        self.sent_with: list[dict[str, object]] = []  # each submit's sweep and command
        self.prepared_for: object = None  # the command `prepare` was given
        self.sent_at: float | None = None
        self.send_s = 0.0  # what its submit takes besides an upload
        self.upload_started_at: float | None = None
        self.looks = 0
        self.watch = Watch(self.read)

    def read(self, records) -> slurm.Looked:
        """As `jobs.look` answers: a job by its id, an array by each task's (`ID_TASK`), never its own."""
        self.looks += 1
        started = self.starts_at_look is not None and self.looks >= self.starts_at_look
        keys = [f"{record.job_id}_{task}" for record in records for task in record.array_tasks]
        keys += [record.job_id for record in records if not record.is_array]
        return {key: JobState(key, "RUNNING" if started else "PENDING") for key in keys}

    def resources(self, options, *, command=None, warn: bool) -> None:
        if options.get("mem") == "lots":
            raise FieldError("mem", "'lots' is not a Slurm memory size")

    def prepare(self, **made: object) -> tuple[str, str]:
        self.prepared += 1
        self.prepared_for = made.get("command")
        return ("made by", self.where)

    def submit(self, args, **options) -> StandInJob:
        self.sent_prepared.append(options.pop("prepared"))
        self.sent_with.append({name: options.pop(name) for name in ("sweep", "command")})
        before_upload = options.pop("before_upload")
        if self.upload_s < 0:
            raise HpcboxError(f"{self.where}'s login node does not answer")
        time.sleep(self.send_s)
        if self.upload_s:
            before_upload()
            self.upload_started_at = time.monotonic()
            time.sleep(self.upload_s)
        self.sent_at = time.monotonic()
        return StandInJob(self, str(next(JOB_IDS)), options.get("account"), self.sent_with[-1]["sweep"])


@pytest.fixture
def project(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "raced"\n')
    return load_project(tmp_path)


def test_the_first_to_start_is_kept_and_the_other_cancelled_and_the_ledger_says_so(project, capsys):
    fast, slow = StandInSite("edi", project, 2), StandInSite("mila", project, None)
    raced = race([slow, fast], ["--epochs", "1"], say=print)
    assert raced.kept.site is fast and [job.site for job in raced.others] == [slow]
    assert raced.others[0].cancelled and not raced.kept.cancelled
    assert fast.prepared + slow.prepared == 1  # built and converted once: one compression, sent as made
    assert fast.sent_prepared == slow.sent_prepared == [("made by", "mila")]
    said = capsys.readouterr().out
    assert f"cancelled job {raced.others[0].job_id} on mila\n" in said
    assert f"kept job {raced.kept.job_id} on edi, the first to start" in said
    kept, lost = (Ledger(project).find(job.job_id, job.site.where) for job in (raced.kept, raced.others[0]))
    assert kept.race == lost.race and kept.race["kept"] == f"edi job {raced.kept.job_id}"
    assert kept.race_said == "raced against 1 other: kept, the first to start"
    assert lost.race_said == f"raced: cancelled, edi job {raced.kept.job_id} started first"


def test_a_loser_that_started_in_the_same_look_is_cancelled_and_said_so(project, capsys):
    first, second = StandInSite("edi", project, 1), StandInSite("mila", project, 1)
    raced = race([first, second], say=print)
    assert raced.kept.site is first and raced.others[0].cancelled
    assert "(it had started too, in the same look)" in capsys.readouterr().out


def test_a_loser_that_had_already_ended_is_left_as_it_ended(project, capsys):
    running, ended = StandInSite("edi", project, 1), StandInSite("mila", project, 1)
    ended.read = lambda records: {r.job_id: JobState(r.job_id, "COMPLETED", exit_code="0:0") for r in records}
    ended.watch = Watch(ended.read)
    raced = race([running, ended], say=print)
    assert raced.kept.site is running and not raced.others[0].cancelled
    said = capsys.readouterr().out
    assert f"job {raced.others[0].job_id} on mila had already ended COMPLETED; left so" in said
    left = Ledger(project).find(raced.others[0].job_id, "mila")
    assert left.race["cancelled"] == [] and left.race_said == (
        f"raced: edi job {raced.kept.job_id} was kept; this one had ended before it was called off"
    )


def test_a_slow_upload_delays_no_other_sites_sbatch(project):
    fast, slow = StandInSite("edi", project, 1), StandInSite("mila", project, None, upload_s=1.0)
    started = time.monotonic()
    raced = race([slow, fast], say=lambda _: None)
    assert fast.sent_at is not None and slow.sent_at is not None
    assert fast.sent_at - started < 0.5 <= slow.sent_at - started  # sent while the other uploaded
    assert raced.kept.site is fast


def test_an_upload_starts_once_the_sites_that_lack_nothing_have_sent(project):
    """The upload shares no second with the sbatch of a site that needed none: it starts after that
    send, however long the send takes; two sites that both upload start together."""
    ready, uploading = StandInSite("edi", project, 1), StandInSite("mila", project, None, upload_s=0.2)
    ready.send_s = 0.3
    race([uploading, ready], say=lambda _: None)
    assert ready.sent_at is not None and uploading.upload_started_at is not None
    assert uploading.upload_started_at >= ready.sent_at
    first, second = (StandInSite(where, project, 1, upload_s=0.3) for where in ("edi", "mila"))
    race([first, second], say=lambda _: None)
    assert first.upload_started_at is not None and second.upload_started_at is not None
    assert first.sent_at is not None and second.sent_at is not None
    assert first.upload_started_at < second.sent_at and second.upload_started_at < first.sent_at


def test_an_entrant_that_cannot_be_sent_is_raced_without(project, capsys):
    gone, there = StandInSite("edi", project, 1, upload_s=-1), StandInSite("mila", project, 1)
    raced = race([gone, there], say=print)
    assert raced.kept.site is there and [str(entrant) for entrant, _ in raced.unsent] == ["edi"]
    assert "edi could not be sent (edi's login node does not answer); racing on without it" in (
        capsys.readouterr().out
    )
    assert Ledger(project).find(raced.kept.job_id, "mila").race["entrants"][-1] == "edi (not sent)"


def test_two_mini_clusters_named_are_two_entrants_though_both_are_local(project):
    first, second = (StandInSite("local", project, 1, mini_cluster=name) for name in ("lab-a", "lab-b"))
    raced = race([first, second], say=lambda _: None)
    assert raced.kept.site is first and raced.others[0].site is second
    with pytest.raises(FieldError, match="local on mini cluster lab-a is named twice"):
        race([first, StandInSite("local", project, 1, mini_cluster="lab-a")], say=lambda _: None)


def test_two_accounts_of_one_site_are_two_entrants(project):
    site = StandInSite("edi", project, 1)
    raced = race([Entrant(site, "def-lab"), Entrant(site, "rrg-lab")], say=lambda _: None)
    accounts = [job.record.resources["account"] for job in (raced.kept, *raced.others)]
    assert accounts == ["def-lab", "rrg-lab"]  # both started at the first look: the first given kept
    assert raced.others[0].cancelled


@pytest.mark.parametrize(
    ("entrants", "options", "message"),
    [
        (lambda p: [StandInSite("edi", p, 1)], {}, "cluster: a race needs two entrants or more"),
        (
            lambda p: [StandInSite("edi", p, 1), StandInSite("edi", p, 1)],
            {},
            "edi is named twice in the race",
        ),
        (
            lambda p: [StandInSite("edi", p, 1), StandInSite("mila", p, 1)],
            {"mem": "lots"},
            "mem: 'lots' is not",
        ),
        (
            lambda p: [Entrant(StandInSite("edi", p, 1), "a"), Entrant(StandInSite("mila", p, 1), "b")],
            {"account": "c"},
            "account: give it per entrant or for all, not both",
        ),
    ],
)
def test_bad_input_is_one_line_and_sends_nothing(project, entrants, options, message):
    sites = entrants(project)
    with pytest.raises(HpcboxError) as refused:
        race(sites, say=lambda _: None, **options)
    assert message in str(refused.value.message) and "\n" not in refused.value.message
    assert all(getattr(each, "site", each).sent_at is None for each in sites)
    assert Ledger(project).all() == []


def test_failover_sends_one_at_a_time_each_given_its_time_to_start(project, capsys):
    waiting, starting = StandInSite("edi", project, None), StandInSite("mila", project, 1)
    raced = race([waiting, starting], failover_after_s=0.5, say=print)
    assert raced.kept.site is starting and raced.others[0].site is waiting and raced.others[0].cancelled
    assert waiting.sent_at is not None and starting.sent_at is not None
    assert starting.sent_at - waiting.sent_at >= 0.5  # sent once the first had had its time
    said = capsys.readouterr().out
    assert f"job {raced.others[0].job_id} on edi did not start within 0.5 s; cancelled, trying mila" in said
    assert said.count("cancelled") == 1  # not cancelled again at the end


def test_sites_of_two_compressions_are_each_sent_what_was_made_for_their_compression(project):
    gzip, zstd, other_gzip = (StandInSite(name, project, 1) for name in ("edi", "mila", "carc"))
    zstd.compression = "zstd:3"
    race([gzip, zstd, other_gzip], say=print)
    assert (gzip.prepared, zstd.prepared, other_gzip.prepared) == (1, 1, 0)
    assert gzip.sent_prepared == other_gzip.sent_prepared == [("made by", "edi")]
    assert zstd.sent_prepared == [("made by", "mila")]


def test_a_sweep_and_another_program_go_to_every_entrant(project):
    """The executor races its calls: an array of them (`sweep`), run by its runner (`command`); an
    array has started once a task runs (Slurm is asked of its tasks, not of the array's own id)."""
    from hpcbox.project.command import ContainerCommand

    runner = ContainerCommand("script", "run_call.py", ())
    calls = Sweep("hpcbox.submitit", (("0",), ("1",)), 256)
    fast, slow = StandInSite("edi", project, 1), StandInSite("mila", project, None)
    raced = race([slow, fast], sweep=calls, command=runner, say=lambda _: None, timeout_s=30)
    assert raced.kept.site is fast and raced.kept.record.is_array  # started: its tasks run
    assert fast.sent_with == slow.sent_with == [{"sweep": calls, "command": runner}]
    assert slow.prepared_for == runner  # the one compression's SIF made once, for the runner


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread alone"
)
def test_ctrl_c_while_the_race_waits_says_each_job_left_waiting_and_how_to_cancel_it(project, capsys):
    """A real SIGINT at the race's third look (Python's own Ctrl-C handler, as a terminal's command
    has): the race ends interrupted, no job cancelled, each said with the command that cancels it."""
    edi, mila = StandInSite("edi", project, None), StandInSite("mila", project, None)
    reading = edi.read

    def read_then_interrupted(records):
        if edi.looks == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return reading(records)

    edi.watch = Watch(read_then_interrupted)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a suite in the background ignores it
    try:
        with pytest.raises(KeyboardInterrupt):
            race([edi, mila], say=print)
    finally:
        signal.signal(signal.SIGINT, before)
    said = capsys.readouterr().out
    sent = re.findall(r"^hpcbox: race: (\w+): job (\d+)$", said, re.M)
    assert sorted(where for where, _ in sent) == ["edi", "mila"], said  # each from a thread of its own
    for where, job_id in sent:
        line = (
            f"hpcbox: race stopped: job {job_id} on {where} waits on as it is "
            f"(`hpcbox cancel -j {job_id} --cluster={where}` if you do not want it)"
        )
        assert line in said.splitlines(), said
    assert "cancelled" not in said
