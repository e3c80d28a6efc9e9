"""The submit stage's pure parts: Slurm output parsing, the ledger, the code snapshot, ssh options.

What talks to a cluster is tested against the mini cluster in tests/integration/test_submit.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from hpcbox import jobs
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import SHA256_MEMO
from hpcbox.project.config import load_project
from hpcbox.render import profiles
from hpcbox.render.resources import ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, render_sbatch
from hpcbox.store import ship
from hpcbox.tools import proc, slurm, ssh

REPO = Path(__file__).resolve().parents[2]


def record(job_id: str, cluster: str = "local", at: str = "2026-11-23T10:00:00+00:00") -> jobs.JobRecord:
    return jobs.JobRecord(
        job_id=job_id,
        cluster=cluster,
        host="researcher@127.0.0.1:2222",
        submitted_at=at,
        submit_dir="/home/researcher/hpcbox/trainer",
        script="/home/researcher/hpcbox/trainer/scripts/x.sh",
        log=f"/home/researcher/hpcbox/trainer/logs/trainer-{job_id}.out",
        run_dir=f"/home/researcher/hpcbox/trainer/runs/{job_id}",
        sif="/home/researcher/hpcbox/images/sha256/ab.sif",
        sif_sha256="ab" * 32,
        image="hpcbox/trainer-environment:0123456789ab",
        code_revision="0123abc-dirty",
        code_snapshot="cd" * 32,
        dataset_sha256="ef" * 32,
        resources={"job_name": "trainer", "gpus": 1},
        trainer_args=("--epochs", "3", "it's $HOME"),
        sent=("sif", "code"),
        bytes_sent=1234,
    )


@pytest.fixture
def project(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.hpcbox]\nproject = "demo"\n')
    return load_project(tmp_path)


def test_ledger_round_trips_records_and_finds_the_last_by_default(project):
    ledger = jobs.Ledger(project)
    ledger.add(record("7", at="2026-11-23T10:00:00+00:00"), "#!/bin/bash\n")
    kept = ledger.add(record("12", cluster="edi", at="2026-11-23T11:00:00+00:00"), "#!/bin/bash\necho edi\n")
    assert kept == dataclasses.replace(
        record("12", cluster="edi", at="2026-11-23T11:00:00+00:00"), run_name="12"
    )
    assert ledger.find() == kept
    assert ledger.find("7").trainer_args == ("--epochs", "3", "it's $HOME")
    assert ledger.find(cluster="local").job_id == "7"
    assert ledger.path("edi", "12").with_suffix(".sh").read_text() == "#!/bin/bash\necho edi\n"
    # Nothing but the records and their scripts: no partial files left behind.
    assert sorted(p.name for p in ledger.directory.iterdir()) == [
        "edi-12.json",
        "edi-12.sh",
        "local-7.json",
        "local-7.sh",
    ]


@pytest.mark.parametrize(
    ("job", "cluster", "message"),
    [
        ("99", None, "job 99 was not submitted from this project"),
        ("7", "edi", "job 7 on cluster edi was not submitted from this project"),
        ("7; rm -rf ~", None, "is not a job id"),
        ("7", "lcoal", "cluster: no profile named 'lcoal' (did you mean local?)"),
        ("7", "edi-via-lcoal", "job 7 on cluster edi-via-lcoal was not submitted from this project"),
        (None, "nowhere", "cluster: no profile named 'nowhere'"),
    ],
)
def test_ledger_refuses_unknown_or_malformed_jobs_in_one_line(project, job, cluster, message):
    jobs.Ledger(project).add(record("7"), "")
    with pytest.raises(HpcboxError) as caught:
        jobs.Ledger(project).find(job, cluster)
    assert message in caught.value.message and "\n" not in caught.value.message


def test_an_empty_ledger_says_how_to_start(project):
    with pytest.raises(HpcboxError, match="no job was submitted") as caught:
        jobs.Ledger(project).find()
    assert "hpcbox submit" in caught.value.hint


def test_the_same_job_id_on_two_clusters_needs_the_cluster(project):
    jobs.Ledger(project).add(record("5", "local"), "")
    jobs.Ledger(project).add(record("5", "edi"), "")
    with pytest.raises(HpcboxError, match="several clusters"):
        jobs.Ledger(project).find("5")
    assert jobs.Ledger(project).find("5", "edi").cluster == "edi"


def test_a_rehearsal_is_kept_apart_from_the_sites_own_jobs(project):
    ledger = jobs.Ledger(project)
    ledger.add(record("5", "edi"), "")
    rehearsed = ledger.add(
        dataclasses.replace(record("5", "edi", at="2026-11-23T12:00:00+00:00"), via="local"), ""
    )
    assert sorted(p.name for p in ledger.directory.glob("*.json")) == ["edi-5.json", "edi-via-local-5.json"]
    assert ledger.find("5", "edi-via-local") == rehearsed
    assert ledger.find(cluster="edi") == rehearsed  # the last edi job, rehearsed or not
    with pytest.raises(HpcboxError, match="several clusters"):
        ledger.find("5")
    assert jobs.JobRecord.from_json(rehearsed.to_json()).where == "edi-via-local"


def test_a_job_given_an_id_an_earlier_job_had_gets_a_run_of_its_own_and_replaces_nothing(project):
    """Issue 59: a mini cluster made again (or a site's Slurm) reuses ids; the later job 1's record and
    run folder are `1-2`, and the first job 1's stay as they were, found by that name."""
    ledger = jobs.Ledger(project)
    first = ledger.add(dataclasses.replace(record("1"), script="/s/first.sh"), "#!/bin/bash\necho first\n")
    assert first.run == "1" and ledger.path("local", "1").is_file()
    fetched = project.runs_dir / "local" / "1"
    fetched.mkdir(parents=True)
    (fetched / "metrics.jsonl").write_text("{}\n")
    later = ledger.add(
        dataclasses.replace(record("1", at="2026-11-23T11:00:00+00:00"), script="/s/later.sh"), "echo later\n"
    )
    assert later.run == "1-2"
    assert jobs.JobRecord.from_json(ledger.path("local", "1").read_text()) == first
    assert ledger.path("local", "1").with_suffix(".sh").read_text() == "#!/bin/bash\necho first\n"
    assert jobs.local_run_dir(project, later) == project.runs_dir / "local" / "1-2"
    assert ledger.find("1") == later and ledger.find("1-2") == later
    assert ledger.find("1-1") == first  # its run is `1`, which names the later job 1 too
    assert ledger.earlier(later) == [first]
    # A run folder with no record (fetched by hand, or its record deleted) is not taken either.
    (project.runs_dir / "local" / "7").mkdir()
    assert ledger.add(record("7"), "").run == "7-2"
    with pytest.raises(HpcboxError, match="is not a job id"):
        ledger.find("1-x")


def test_a_job_of_a_mini_cluster_made_again_is_said_where_it_ran_and_where_its_results_are(
    project, tmp_path: Path, monkeypatch
):
    from hpcbox.minicluster.cluster import Cluster, Incarnation, note_removed
    from hpcbox.minicluster.cluster import record as keep
    from hpcbox.minicluster.secrets import generate
    from hpcbox.minicluster.shape import shape_like
    from hpcbox.minicluster.spec import spec_like, state_dir

    monkeypatch.setenv("HPCBOX_MINICLUSTER_STATE", str(tmp_path / "state"))
    root = tmp_path / "state"
    spec = spec_like("local", name="mc-ident", port=2298)
    first = Cluster(
        spec, "img", generate(spec, state_dir(root, spec.name)), shape_like("local"), Incarnation.new()
    )
    keep(first, root)
    ran = dataclasses.replace(record("1"), mini_cluster=spec.name, incarnation=first.incarnation.id)
    assert jobs.gone(ran, project) is None  # its cluster still runs
    note_removed(root, spec.name)
    again = dataclasses.replace(first, incarnation=Incarnation.new())
    keep(again, root)
    gone = jobs.gone(ran, project)
    assert gone is not None
    assert re.fullmatch(
        rf"job 1 ran on mini cluster mc-ident as brought up at {re.escape(first.incarnation.up_at)}, "
        r"removed at \S+; its results were never fetched and went with it",
        gone,
    )
    (project.runs_dir / "local" / "1").mkdir(parents=True)
    (project.runs_dir / "local" / "1" / "job.out").write_text("done\n")
    assert jobs.gone(ran, project).endswith("; its results were fetched to runs/local/1")
    with pytest.raises(HpcboxError, match="job 1 ran on mini cluster mc-ident"):
        jobs.check_reachable(ran, project)
    assert jobs.gone(record("1"), project) is None  # a site's job, or one recorded before incarnations


def test_a_sweeps_outcomes_kept_in_its_run_folders_say_which_points_to_run_again(project):
    """Where Slurm has forgotten a sweep (or its cluster is gone), each point's run folder keeps its exit
    status: 0 completed, another failed, none (killed, or lost) run again too."""
    sweep = dataclasses.replace(
        record("69"), resources={"job_name": "s", "array": "0-3"}, sweep=(("--lr", "1"),) * 4
    )
    local = jobs.local_run_dir(project, sweep)
    for task, status in (("0", "0"), ("1", "1"), ("3", "0")):
        (local / task).mkdir(parents=True)
        (local / task / ".hpcbox-exit").write_text(status + "\n")
    found = jobs.fetched_outcomes(project, sweep)
    assert {index: task.state for index, task in found.tasks.items()} == {
        0: "COMPLETED",
        1: "FAILED",
        2: "NO_OUTCOME",
        3: "COMPLETED",
    }
    assert jobs.failed_tasks(sweep, found.tasks) == (1, 2)
    lines = jobs.describe_tasks(sweep, found.tasks, found.read_from)
    assert lines[0] == (
        "job 69: 4 array tasks: 2 COMPLETED, 1 FAILED, 1 NO_OUTCOME "
        "(Slurm no longer knows it: from its results fetched to runs/local/69)"
    )
    assert lines[2] == "  job 69_1: FAILED, exit code 1:0 (--lr 1)"


def test_a_reruns_outcomes_kept_are_those_of_the_points_it_ran_again(project):
    """A rerun of 2 of 5 points (`--array=1,3`) keeps the whole sweep in its record: its outcomes are its
    two points', not three NO_OUTCOME more that a rerun of the rerun would run again though they had
    completed in the first job."""
    rerun = dataclasses.replace(
        record("70"), resources={"job_name": "s", "array": "1,3"}, sweep=(("--lr", "1"),) * 5
    )
    local = jobs.local_run_dir(project, rerun)
    for task, status in (("1", "0"), ("3", "1")):
        (local / task).mkdir(parents=True)
        (local / task / ".hpcbox-exit").write_text(status + "\n")
    found = jobs.fetched_outcomes(project, rerun)
    assert {index: task.state for index, task in found.tasks.items()} == {1: "COMPLETED", 3: "FAILED"}
    assert jobs.failed_tasks(rerun, found.tasks) == (3,)
    only_failed = {3: found.tasks[3]}
    assert jobs.describe_tasks(rerun, only_failed)[0] == "job 70: 1 array task: 1 FAILED"
    assert jobs.describe_tasks(rerun, found.tasks, found.read_from)[0].startswith(
        "job 70: 2 array tasks: 1 COMPLETED, 1 FAILED"
    )
    with pytest.raises(HpcboxError, match=r"job: sweep 70 ran tasks 1,3, not 2"):
        rerun.of_task(2)
    assert rerun.of_task(3).trainer_args[-2:] == ("--lr", "1")


def test_a_sweeps_task_is_named_by_its_id_wherever_a_job_id_goes(project):
    """Issue 59: `report/status/logs -j 3_2` were refused ("job ids are numbers") though status prints
    `job 3_2: ...`. A task is its sweep's record seen as one job: its id, log, run folder and arguments."""
    sweep = dataclasses.replace(
        record("3"), log="/h/logs/s-3_*.out", resources={"job_name": "s", "array": "0-2"},
        sweep=(("--lr", "1"), ("--lr", "2"), ("--lr", "3")),
    )  # fmt: skip
    ledger = jobs.Ledger(project)
    ledger.add(sweep, "")
    task = ledger.find("3_2")
    assert (task.job_id, task.run, task.log, task.is_array) == ("3_2", "3_2", "/h/logs/s-3_2.out", False)
    assert task.run_dir == sweep.run_dir + "/2" and task.trainer_args[-2:] == ("--lr", "3")
    assert jobs.local_run_dir(project, task) == project.runs_dir / "local" / "3" / "2"
    for wrong, said in (("3_7", "job: sweep 3 ran tasks 0-2, not 7"), ("9_0", "job 9 was not submitted")):
        with pytest.raises(HpcboxError, match=re.escape(said)):
            ledger.find(wrong)
    ledger.add(record("5"), "")
    with pytest.raises(HpcboxError, match="job: 5 is not a sweep: it has no task 1"):
        ledger.find("5_1")


def test_a_sweeps_report_is_a_line_per_point_and_one_of_them_all(tmp_path: Path):
    from hpcbox.report.efficiency import sweep_report

    rows = [
        {"JobID": "3_0", "State": "COMPLETED", "Elapsed": "00:00:09", "MaxRSS": ""},
        {"JobID": "3_0.batch", "State": "COMPLETED", "Elapsed": "00:00:09", "MaxRSS": "204800K"},
        {"JobID": "3_1", "State": "FAILED", "Elapsed": "00:00:02", "MaxRSS": ""},
    ]
    for task, accuracy in ((0, 0.9), (1, 0.5)):
        (tmp_path / str(task)).mkdir()
        epoch = {"event": "epoch", "epoch": 2, "val_accuracy": accuracy, "val_loss": 1 - accuracy}
        (tmp_path / str(task) / "metrics.jsonl").write_text(json.dumps(epoch) + "\n")
    text = sweep_report("3", {0: ("--lr", "1"), 1: ("--lr", "2"), 2: ("--lr", "3")}, rows, tmp_path)
    assert text.splitlines() == [
        "sweep 3: 3 points: 1 COMPLETED, 1 FAILED, 1 unknown to sacct; best val accuracy 0.900, "
        "task 0 (--lr 1)",
        "  task 0 (--lr 1): COMPLETED, ran 00:00:09, peak 200M, epoch 2: val accuracy 0.900, val loss 0.100",
        "  task 1 (--lr 2): FAILED, ran 00:00:02, epoch 2: val accuracy 0.500, val loss 0.500",
        "  task 2 (--lr 3): unknown to sacct",
        "  (each point's own report: `hpcbox report -j 3_TASK`)",
    ]


def test_rehearsing_anywhere_but_the_mini_cluster_is_refused_naming_the_flag(project):
    from hpcbox.render.profiles import load_profile

    with pytest.raises(HpcboxError) as caught:
        jobs.connection_target(load_profile("edi"), project, via="edi")
    assert caught.value.message == "via: 'edi' is not a place to rehearse a job"


def test_a_rehearsal_needs_the_mini_cluster_up(project, monkeypatch):
    from hpcbox.render.profiles import load_profile

    monkeypatch.setenv("HPCBOX_MINICLUSTER_STATE", str(project.root / "no-cluster-here"))
    with pytest.raises(HpcboxError) as caught:
        jobs.connection_target(load_profile("edi"), project, via="local")
    assert "is not up" in caught.value.message and "hpcbox cluster.up --like edi" in caught.value.hint


def test_sbatch_parsable_output_gives_the_job_id():
    assert slurm.parse_job_id("1234\n") == "1234"
    assert slurm.parse_job_id("1234;cluster_a\n") == "1234"
    with pytest.raises(HpcboxError, match="not a job id"):
        slurm.parse_job_id("sbatch: error: Batch job submission failed")


def test_squeue_and_sacct_lines_are_read_field_by_field():
    queued = slurm.parse_squeue(
        "41|PENDING|QOSMaxGRESPerUser|0:00|1:00:00||N/A|2026-12-05T09:00:01|/home/r/hpcbox/t/scripts/t-1.sh\n",
        "41",
    )
    assert queued == slurm.JobState(
        "41", "PENDING", "QOSMaxGRESPerUser", "00:00:00", "01:00:00", "", "", "squeue",
        script="/home/r/hpcbox/t/scripts/t-1.sh", submitted="2026-12-05T09:00:01",
    )  # fmt: skip
    # squeue's times are written as sacct's, so a job reads the same running and ended; words stay.
    running = slurm.parse_squeue("43|RUNNING|None|0:17|10:00|node1|node1|2026-12-05T09:00:01|\n", "43")
    assert (running.elapsed, running.time_limit) == ("00:00:17", "00:10:00")
    unlimited = slurm.parse_squeue("44|RUNNING|None|1-02:03:04|UNLIMITED|node1|node1|2026-12-05|\n", "44")
    assert (unlimited.elapsed, unlimited.time_limit) == ("1-02:03:04", "UNLIMITED")
    assert "GPUs" in queued.reason_in_words and not queued.finished
    # A requeued job has several allocation lines (sacct --duplicates), each submitted anew (Slurm resets
    # the submit time on requeue): the latest is the current one, "CANCELLED by 1500" read as CANCELLED.
    text = (
        "42|CANCELLED by 1500|None|00:00:09|00:10:00|0:15|node2|2026-12-05T09:05:00|/home/r/t|"
        "sbatch --parsable scripts/t-1.sh\n"
        "42|NODE_FAIL|None|00:00:31|00:10:00|1:0|node1|2026-12-05T09:00:01|/home/r/t|"
        "sbatch --parsable scripts/t-1.sh\n"
    )
    runs = slurm.accounted_states(text, "42")
    assert [run.state for run in runs] == ["NODE_FAIL", "CANCELLED"]
    ended = runs[-1]
    assert (ended.state, ended.exit_code, ended.nodes, ended.finished) == ("CANCELLED", "0:15", "node2", True)
    assert ended.script == "/home/r/t/scripts/t-1.sh"
    assert slurm.accounted_states(text, "4") == []
    assert slurm.parse_squeue("", "41") is None


SCRIPT = "/home/r/hpcbox/t/scripts/t-20261205T090001-ab12cd34.sh"


def test_a_job_is_told_from_another_given_its_id_by_its_batch_script():
    """Slurm gives an id again once its controller is rebuilt or its ids wrap; the batch script, whose
    name hpcbox makes for each submission, tells the jobs apart (a requeue keeps it)."""
    own = slurm.JobState(
        "7", "COMPLETED", script="/gpfs/home/r/hpcbox/t/scripts/t-20261205T090001-ab12cd34.sh"
    )
    assert own.is_of(SCRIPT)  # the same script seen through a home folder that is a link
    assert slurm.JobState("7", "COMPLETED").is_of(SCRIPT)  # sacct before 23.02 says no script
    other = slurm.JobState("7", "RUNNING", script="/home/r/x/scripts/x-20270101T000000-00000000.sh")
    assert not other.is_of(SCRIPT) and other.is_of("")
    # sacct --duplicates: this job's run, then the other job the id names since.
    text = (
        "7|COMPLETED|None|00:01:00|00:10:00|0:0|node1|2026-12-05T09:00:01|/home/r/hpcbox/t|"
        "sbatch --parsable scripts/t-20261205T090001-ab12cd34.sh\n"
        "7|RUNNING|None|00:00:10|00:10:00|0:0|node2|2027-01-01T00:00:00|/home/r/x|"
        "sbatch --wrap 'a | b' x-20270101T000000-00000000.sh\n"  # free text, the delimiter in it
    )
    runs = slurm.accounted_states(text, "7")
    assert [run.state for run in runs] == ["COMPLETED", "RUNNING"]
    assert [run.state for run in slurm._own(runs, "7", SCRIPT)] == ["COMPLETED"]
    with pytest.raises(slurm.IdReused) as reused:
        slurm._own(runs[1:], "7", SCRIPT)
    assert str(reused.value).startswith(
        "job 7 is no longer known to Slurm: its id now names another job "
        "(/home/r/x/x-20270101T000000-00000000.sh, submitted 2027-01-01T00:00:00), not this one "
        f"({SCRIPT})"
    )


def test_a_sweeps_id_naming_another_array_is_said_not_read_as_its_tasks():
    squeue = (
        "9_1|RUNNING|None|0:05|10:00|node1|2027-01-01T00:00:02|2027-01-01T00:00:00|/home/r/x/scripts/x-2.sh\n"
    )
    with pytest.raises(slurm.IdReused):
        slurm.parse_tasks("", squeue, "9", SCRIPT)
    mine = squeue.replace("/home/r/x/scripts/x-2.sh", SCRIPT)
    assert {index: task.state for index, task in slurm.parse_tasks("", mine, "9", SCRIPT).items()} == {
        1: "RUNNING"
    }


class AnsweringSlurm:
    """A login node whose squeue and sacct answer from fixed texts (as Slurm 24.11 prints them), keeping
    each command asked."""

    def __init__(self, squeue: str, sacct: str = "", restarts: str = "") -> None:
        self.answers = {"squeue": squeue, "sacct": sacct, "restarts": restarts}
        self.asked: list[list[str]] = []

    def run(self, argv, *, what: str, check: bool = True, **_: object) -> proc.Completed:
        self.asked.append(list(argv))
        kind = (
            "restarts"
            if any(a.startswith("--Format=") for a in argv)
            else "sacct"
            if "sacct" in argv
            else "squeue"
        )
        return proc.Completed(tuple(argv), 0, self.answers[kind], "")


def queued(job_id: str, state: str, reason: str = "None") -> str:
    return f"{job_id}|{state}|{reason}|0:05|10:00|node1|2026-12-05T17:00:05|2026-12-05T17:00:00|{SCRIPT}\n"


def accounted(job_id: str, state: str, exit_code: str = "0:0") -> str:
    return (
        f"{job_id}|{state}|None|00:00:30|00:10:00|{exit_code}|node1|2026-12-05T17:00:00|/home/r/x|"
        f"sbatch --parsable {SCRIPT}\n"
    )


def test_a_look_at_many_jobs_is_one_squeue_while_slurm_holds_them_all_unfinished():
    jobs_ = [slurm.Watched("5", SCRIPT), slurm.Watched("6", SCRIPT), slurm.Watched("7", SCRIPT, True, 3)]
    running = queued("5", "RUNNING") + queued("6", "PENDING", "Priority")
    running += "".join(queued(f"7_{task}", "RUNNING") for task in range(3))
    login = AnsweringSlurm(running)
    found = slurm.look(login, jobs_)  # type: ignore[arg-type]
    assert [argv[0] for argv in login.asked] == ["squeue"] and "--jobs=5,6,7" in login.asked[0]
    assert {key: state.state for key, state in found.items()} == {
        "5": "RUNNING", "6": "PENDING", "7_0": "RUNNING", "7_1": "RUNNING", "7_2": "RUNNING"
    }  # fmt: skip


def test_a_look_asks_sacct_once_for_the_jobs_squeue_has_seen_end_or_no_longer_holds():
    jobs_ = [slurm.Watched("5", SCRIPT), slurm.Watched("6", SCRIPT), slurm.Watched("7", SCRIPT, True, 3)]
    # 5 ended (squeue still lists it), 6 left squeue, task 7_2 is not listed yet
    login = AnsweringSlurm(
        queued("5", "COMPLETED") + queued("7_0", "RUNNING") + queued("7_1", "RUNNING"),
        accounted("5", "COMPLETED") + accounted("6", "FAILED", "1:0") + accounted("7_0", "RUNNING"),
    )
    found = slurm.look(login, jobs_)  # type: ignore[arg-type]
    assert len(login.asked) == 2 and "--jobs=5,6,7" in login.asked[1]  # one sacct for the three
    assert (found["5"].exit_code, found["6"].state, found["6"].exit_code) == ("0:0", "FAILED", "1:0")  # type: ignore[union-attr]
    assert {key for key in found if key.startswith("7_")} == {"7_0", "7_1"}  # 7_2: known to neither yet


def test_a_look_at_jobs_held_by_begintime_asks_how_often_each_was_requeued_in_one_call():
    jobs_ = [slurm.Watched("5", SCRIPT), slurm.Watched("6", SCRIPT)]
    login = AnsweringSlurm(
        queued("5", "PENDING", "BeginTime") + queued("6", "PENDING", "BeginTime"),
        restarts=f"{'5':<40}{'1':<12}\n{'6':<40}{'0':<12}\n",
    )
    found = slurm.look(login, jobs_)  # type: ignore[arg-type]
    assert len(login.asked) == 2 and "--jobs=5,6" in login.asked[1]
    assert [(found[job].requeued, found[job].waiting_for) for job in ("5", "6")] == [  # type: ignore[union-attr]
        (True, "requeued, to run again"), (False, "held")
    ]  # fmt: skip


def test_describe_explains_a_pending_reason_and_a_finished_job():
    pending = slurm.JobState("9", "PENDING", "Priority", "0:00", "10:00", "", "", "squeue")
    assert jobs.describe(pending) == (
        "job 9: PENDING, waiting behind jobs of higher priority (Priority: other jobs have higher priority; "
        "it will start when its turn comes), time limit 10:00"
    )
    unlimited = dataclasses.replace(pending, time_limit="UNLIMITED")
    assert jobs.describe(unlimited).endswith("it will start when its turn comes), no time limit")
    done = slurm.JobState("9", "COMPLETED", "None", "00:01:02", "00:10:00", "0:0", "node1", "sacct")
    assert jobs.describe(done) == "job 9: COMPLETED, elapsed 00:01:02 of 00:10:00, on node1, exit code 0:0"
    assert jobs.describe(dataclasses.replace(done, time_limit="UNLIMITED")) == (
        "job 9: COMPLETED, elapsed 00:01:02, no time limit, on node1, exit code 0:0"
    )
    preempted = dataclasses.replace(done, preempted_runs=2)
    assert jobs.describe(preempted) == (
        "job 9: COMPLETED, elapsed 00:01:02 of 00:10:00, on node1, exit code 0:0, "
        "preempted and requeued by Slurm (2 earlier runs PREEMPTED)"
    )


def test_a_preempted_jobs_runs_are_told_as_one_job_with_all_their_time():
    # sacct -X --duplicates of a job preempted once: Slurm requeued it, and requeued the run after its
    # grace time once more (it exited 0 then), which ended at once; the third ran to the end.
    text = "".join(
        f"9|{state}|None|{elapsed}|00:10:00|0:0|node1|2026-12-05T17:{minute}:00|/home/r/x|sbatch --parsable "
        f"{SCRIPT}\n"
        for state, elapsed, minute in (
            ("PREEMPTED", "00:01:40", "00"),
            ("PREEMPTED", "00:00:00", "02"),
            ("COMPLETED", "00:03:25", "03"),
        )
    )
    job = slurm.all_runs(slurm._own(slurm.accounted_states(text, "9"), "9", SCRIPT))
    assert (job.state, job.elapsed, job.runs, job.preempted_runs) == ("COMPLETED", "00:05:05", 3, 2)
    assert jobs.describe(job) == (
        "job 9: COMPLETED, elapsed 00:05:05 in its 3 runs, each given 00:10:00, on node1, exit code 0:0, "
        "preempted and requeued by Slurm (2 earlier runs PREEMPTED)"
    )
    [once] = slurm.accounted_states(text.splitlines(keepends=True)[-1], "9")
    assert slurm.all_runs([once]) == once


def test_a_job_slurm_requeued_waits_as_requeued_not_as_held_for_a_begin_time():
    # squeue gives a requeued job the reason BeginTime while it waits out the requeue delay; only its
    # RestartCnt (squeue --Format, padded to 20 columns) tells it from a --begin of its user's.
    line = "9|PENDING|BeginTime|0:00|10:00||2026-12-05T17:02:11|2026-12-05T17:02:00|/h/s.sh\n"
    pending = slurm.parse_squeue(line, "9")
    padded = (
        "9                                       2           \n12                                      N/A\n"
    )
    assert slurm.parse_restarts(padded) == {"9": 2} and slurm.parse_restarts("") == {}
    requeued = dataclasses.replace(pending, restarts=slurm.parse_restarts(padded)["9"])
    assert jobs.describe(requeued).startswith(
        "job 9: PENDING, requeued, to run again (BeginTime: Slurm requeued it (2 times so far) and holds it "
        "for its requeue delay before its next run), "
    )
    assert jobs.describe(pending).startswith(
        "job 9: PENDING, held (BeginTime: its --begin time has not come yet), "
    )
    assert not dataclasses.replace(requeued, state="RUNNING").requeued


def test_a_running_job_slurm_requeued_says_which_run_it_is():
    line = "9|RUNNING|None|0:08|10:00|node1|2026-12-05T17:02:21|2026-12-05T17:02:11|/h/s.sh\n"
    running = slurm.parse_squeue(line, "9")
    assert jobs.describe(running) == "job 9: RUNNING, elapsed 00:00:08 of 00:10:00, on node1"
    assert jobs.describe(dataclasses.replace(running, restarts=1)) == (
        "job 9: RUNNING, elapsed 00:00:08 of 00:10:00, on node1, its run 2 (Slurm requeued it once)"
    )
    assert jobs.describe(dataclasses.replace(running, restarts=3)).endswith(
        "its run 4 (Slurm requeued it 3 times)"
    )


def test_a_pending_job_says_what_it_waits_for_and_slurms_start_guess_as_a_guess():
    line = "52|PENDING|Resources|0:00|30:00||2026-12-05T12:30:00|2026-12-05T12:00:01|/h/s.sh\n"
    waiting = slurm.parse_squeue(line, "52")
    assert waiting.start_guess == "2026-12-05T12:30:00"
    assert jobs.describe(waiting) == (
        "job 52: PENDING, waiting for free resources (Resources: waiting for nodes with the requested CPUs, "
        "memory or GPUs to become free), Slurm guesses it starts at 2026-12-05T12:30:00 (its own estimate, "
        "not a promise), time limit 00:30:00"
    )
    # A running job's %S is when it started, not a guess; a pending one without an estimate says N/A.
    running = slurm.parse_squeue(line.replace("PENDING|Resources", "RUNNING|None"), "52")
    assert running.start_guess == "" and "guess" not in jobs.describe(running)
    assert slurm.parse_squeue(line.replace("2026-12-05T12:30:00", "N/A"), "52").start_guess == ""


@pytest.mark.parametrize(
    ("reason", "group"),
    [
        ("Resources", "waiting for free resources"),
        ("Priority", "waiting behind jobs of higher priority"),
        ("Dependency", "waiting for a dependency"),
        ("DependencyNeverSatisfied", "will not start as asked"),
        ("JobHeldUser", "held"),
        ("BeginTime", "held"),
        ("QOSMaxGRESPerUser", "at a limit of your account or QOS"),
        ("AssocGrpCpuLimit", "at a limit of your account or QOS"),  # not in the words table: by its kind
        ("JobArrayTaskLimit", "at a limit of your account or QOS"),
        ("QOSMaxWallDurationPerJobLimit", "will not start as asked"),
        ("AssocMaxNodePerJobLimit", "will not start as asked"),
        ("PartitionTimeLimit", "will not start as asked"),
        ("ReqNodeNotAvail, UnavailableNodes:node2", "a node or partition it needs is down"),
        ("NodeDown", "a node or partition it needs is down"),
        ("None", "not yet looked at by the scheduler"),
        ("SomethingSlurmAddsNext", ""),
    ],
)
def test_pending_reasons_are_grouped_by_what_the_user_can_do(reason, group):
    assert slurm.wait_group(reason) == group
    assert slurm.JobState("1", "PENDING", reason).waiting_for == group
    assert slurm.JobState("1", "RUNNING", reason).waiting_for == ""


def test_the_start_time_in_sbatch_test_onlys_answer_is_read_as_a_guess():
    answer = "sbatch: Job 5 to start at 2026-12-05T12:00:00 using 1 processors on nodes c1 in partition debug"
    assert slurm.test_only_start(answer) == "2026-12-05T12:00:00"
    assert slurm.test_only_start("sbatch: error: Batch job submission failed: Invalid account") == ""


def test_describe_says_no_none_for_a_job_not_yet_looked_at_or_never_placed():
    # squeue's reason None (no reason yet) and sacct's `None assigned` (cancelled before it started).
    waiting = slurm.parse_squeue("9|PENDING|None|0:00|10:00||N/A|2026-12-05T09:00:01|/h/s.sh\n", "9")
    assert jobs.describe(waiting) == "job 9: PENDING, not yet looked at by the scheduler, time limit 00:10:00"
    [never] = slurm.accounted_states(
        "9|CANCELLED by 1500|None|00:00:00|00:10:00|0:0|None assigned|2026-12-05T09:00:01|/h|sbatch s.sh\n",
        "9",
    )
    assert jobs.describe(never) == "job 9: CANCELLED, before it started"
    # With no --time, sacct says Partition_Limit of it (found as a user: it was told as
    # `elapsed 00:00:00 of Partition_Limit`, and its exit status 0:0 as if it had one)
    no_limit_asked = dataclasses.replace(never, time_limit="Partition_Limit")
    assert jobs.describe(no_limit_asked) == "job 9: CANCELLED, before it started"
    ran = dataclasses.replace(no_limit_asked, elapsed="00:00:04", nodes="node1")
    assert jobs.describe(ran) == (
        "job 9: CANCELLED, elapsed 00:00:04, its partition's time limit, on node1, exit code 0:0"
    )


def test_rsync_stats_are_parsed_with_thousands_separators():
    lines = ["Number of files: 1 (reg: 1)", "Total bytes sent: 501,234,567", "Total bytes received: 1,035"]
    assert ssh.parse_rsync_stats(lines) == ssh.Transfer(501_234_567, 1_035)


def test_rsync_stats_of_a_delta_say_what_was_literal_and_what_the_basis_had():
    # rsync 3.2's --stats of a delta against a basis (thousands separators as it prints them)
    lines = [
        "Total file size: 542,937,088 bytes",
        "Literal data: 2,376,704 bytes",
        "Matched data: 540,560,384 bytes",
        "Total bytes sent: 2,470,267",
        "Total bytes received: 394,514",
    ]
    assert ssh.parse_rsync_stats(lines) == ssh.Transfer(2_470_267, 394_514, 2_376_704, 540_560_384)


def test_progress_of_a_delta_counts_bytes_in_place_not_a_rate_and_the_end_once():
    shown: list[str] = []
    show = ssh.progress_printer(1000, shown.append, against_basis=True)
    show("500 50% 1.2GB/s 0:00:01")
    show("1000 100% 2.4GB/s 0:00:00")
    show("1000 100% 2.4GB/s 0:00:00 (xfr#1, to-chk=0/1)")
    assert shown == [
        "  500 of 1,000 bytes in place (50%), ETA 0:00:01",
        "  1000 of 1,000 bytes in place (100%), in 0:00:00",
    ]


def test_log_follow_command_is_valid_bash_and_quotes_the_path():
    nasty = dataclasses.replace(record("3"), log="/home/r/logs/it's $(date) x-3.out")
    for follow in (True, False):
        command = jobs.follow_command(nasty, follow)
        assert subprocess.run(["bash", "-n", "-c", command], check=False).returncode == 0
        assert "'/home/r/logs/it'\"'\"'s $(date) x-3.out'" in command


def test_the_ledger_records_the_logs_sbatch_writes():
    local = profiles.load_profile("local")

    def paths(**given):
        checked = resolve(local, ResourceRequest(job_name="fit", **given))
        script = render_sbatch(local, checked, JobInputs.defaults("trainer"))
        return jobs.log_paths(script, "/home/r/hpcbox/trainer", "77", "r")

    assert paths() == ("/home/r/hpcbox/trainer/logs/fit-77.out", None)
    assert paths(log="%x/%u-%j.out", error_log="/scratch/%x/%%-%j.err") == (
        "/home/r/hpcbox/trainer/fit/r-77.out",
        "/scratch/fit/%-77.err",
    )
    assert paths(array="0-3") == ("/home/r/hpcbox/trainer/logs/fit-77_*.out", None)


def test_logs_prints_every_log_there_is(tmp_path: Path):
    """The command `invoke logs` runs on the cluster, run here: the log, stderr's own, array tasks'."""
    (tmp_path / "fit-5.out").write_text("out\n")
    (tmp_path / "fit-5.err").write_text("err\n")
    for task in (0, 1):
        (tmp_path / f"sweep-9_{task}.out").write_text(f"task {task}\n")
    both = dataclasses.replace(record("5"), log=f"{tmp_path}/fit-5.out", error_log=f"{tmp_path}/fit-5.err")
    array = dataclasses.replace(record("9"), log=f"{tmp_path}/sweep-9_*.out")
    missing = dataclasses.replace(record("6"), log=f"{tmp_path}/it's-6.out")

    def run(job: jobs.JobRecord) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", jobs.follow_command(job, False)], capture_output=True, text=True)

    assert run(both).stdout == f"==> {tmp_path}/fit-5.out <==\nout\n\n==> {tmp_path}/fit-5.err <==\nerr\n"
    assert run(array).stdout.count("==> ") == 2 and "task 0\n" in run(array).stdout
    assert run(missing).stderr == f"hpcbox: no log yet at {tmp_path}/it's-6.out\n"


def test_following_an_array_ends_when_every_task_has_finished(tmp_path: Path):
    """squeue lists an array's tasks a line each: following its logs ends once none is left running."""
    states = tmp_path / "states"
    states.write_text("RUNNING\nCOMPLETED\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "squeue").write_text(f"#!/bin/sh\ncat {states}\n")
    (tmp_path / "bin" / "squeue").chmod(0o755)
    (tmp_path / "sweep-9_0.out").write_text("task 0\n")
    array = dataclasses.replace(record("9"), log=f"{tmp_path}/sweep-9_*.out")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    following = subprocess.Popen(
        ["sh", "-c", jobs.follow_command(array, True)], env=env, stdout=subprocess.PIPE, text=True
    )
    time.sleep(4)
    assert following.poll() is None  # one task still runs
    states.write_text("COMPLETED\nFAILED\n")
    output, _ = following.communicate(timeout=15)
    assert following.returncode == 0 and "task 0" in output


def test_following_goes_on_through_a_squeue_that_fails_and_ends_once_slurm_forgets_the_job(tmp_path: Path):
    """A squeue that fails (slurmctld busy) says nothing of the job: following goes on; it ends once
    squeue answers that the id is not known (a full run's follow had ended at a busy slurmctld)."""
    said, calls = tmp_path / "said", tmp_path / "calls"
    said.write_text("1\nslurm_load_jobs error: Socket timed out on send/recv operation\n")
    (tmp_path / "bin").mkdir()
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text(f'#!/bin/sh\necho >>{calls}\n{{ read -r code; cat; }} <{said}; exit "$code"\n')
    squeue.chmod(0o755)
    (tmp_path / "fit-5.out").write_text("epoch 1\n")
    job = dataclasses.replace(record("5"), log=f"{tmp_path}/fit-5.out")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    following = subprocess.Popen(
        ["sh", "-c", jobs.follow_command(job, True)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not calls.exists() or len(calls.read_text()) < 2:  # two looks, each failed
            assert time.monotonic() < deadline and following.poll() is None
            time.sleep(0.1)
        assert following.poll() is None
        said.write_text("1\nslurm_load_jobs error: Invalid job id specified\n")
        output, _ = following.communicate(timeout=30)
    finally:
        if following.poll() is None:
            following.kill()
    assert following.returncode == 0 and "epoch 1" in output


def test_following_asks_slurm_once_a_minute_after_the_first_and_at_once_when_the_exit_status_is_kept(
    tmp_path: Path,
):
    """A follow of hours costs Slurm a call a minute; its end is seen within seconds, by the exit status
    the job script keeps in the run folder as it ends. The clock is a stand-in `date`, squeue another."""
    clock, calls, states = tmp_path / "clock", tmp_path / "calls", tmp_path / "states"
    clock.write_text("1000\n")
    states.write_text("RUNNING\n")
    (tmp_path / "bin").mkdir()
    for name, body in (("squeue", f"echo >>{calls}; cat {states}"), ("date", f"cat {clock}")):
        (tmp_path / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / "bin" / name).chmod(0o755)
    (tmp_path / "fit-5.out").write_text("epoch 1\n")
    (tmp_path / "run").mkdir()
    job = dataclasses.replace(record("5"), log=f"{tmp_path}/fit-5.out", run_dir=f"{tmp_path}/run")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}

    def asked() -> int:
        return len(calls.read_text()) if calls.exists() else 0

    def until(condition, what: str) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline and following.poll() is None, what
            time.sleep(0.1)

    following = subprocess.Popen(
        ["sh", "-c", jobs.follow_command(job, True)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        until(lambda: asked() >= 2, "asked every few seconds in the first minute")
        clock.write_text("1100\n")  # past the first minute
        before = asked()
        until(lambda: asked() == before + 1, "asked once, a minute after the last")
        time.sleep(7)  # two turns of the follow's loop
        assert asked() == before + 1 and following.poll() is None
        (tmp_path / "run" / ".hpcbox-exit").write_text("0\n")
        states.write_text("COMPLETED\n")
        output, _ = following.communicate(timeout=15)
    finally:
        if following.poll() is None:
            following.kill()
    assert following.returncode == 0 and "epoch 1" in output and asked() == before + 2


def test_a_cancel_signals_the_batch_shell_only_once_the_script_has_set_its_traps(tmp_path: Path):
    """Before the job script has set its traps, TERM to its batch shell alone kills it unsaved and Slurm
    calls the job FAILED (a full run's cancel of a job that had just started): the line the script
    writes once they are set, in the log, is what `cancel` reads first. The rendered script's own line,
    written after its TERM trap, is what it looks for."""
    local = profiles.load_profile("local")
    script = render_sbatch(
        local, resolve(local, ResourceRequest(job_name="fit")), JobInputs.defaults("t")
    ).text
    lines = script.splitlines()
    said = next(index for index, line in enumerate(lines) if "node scratch $job_scratch" in line)
    assert said > lines.index("trap 'forward TERM' TERM")
    env = {**os.environ, "SLURM_JOB_ID": "77", "job_scratch": "/disk/scratch/r/x", "run_dir": "/r/runs/77"}
    written = subprocess.run(["bash", "-c", lines[said]], env=env, capture_output=True, text=True).stderr

    class Here:
        def run(self, command, *, what, check=True):
            return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=check)

    log = tmp_path / "fit-77.out"
    job = dataclasses.replace(record("77"), log=str(log))
    assert not jobs.script_started(Here(), job)  # no log yet
    log.write_text("")
    assert not jobs.script_started(Here(), job)
    log.write_text(written)
    assert jobs.script_started(Here(), job)
    (tmp_path / "sweep-9_1.out").write_text(written)
    assert jobs.script_started(Here(), dataclasses.replace(record("9"), log=f"{tmp_path}/sweep-9_*.out"))


def test_fetch_copies_the_results_and_every_log_there_is(tmp_path: Path, project):
    """The cluster is this machine: its commands run in sh, its downloads are copies."""
    remote = tmp_path / "cluster"
    (remote / "runs" / "9").mkdir(parents=True)
    (remote / "runs" / "9" / "metrics.jsonl").write_text("{}\n")
    (remote / "logs").mkdir()
    for task in (0, 1):
        (remote / "logs" / f"sweep-9_{task}.out").write_text(f"task {task}\n")
    (remote / "logs" / "sweep-9.err").write_text("err\n")
    job = dataclasses.replace(
        record("9"), run_dir=f"{remote}/runs/9", log=f"{remote}/logs/sweep-9_*.out",
        error_log=f"{remote}/logs/sweep-9.err",
    )  # fmt: skip
    downloaded = []
    commands = []

    class Here:
        def run(self, command, *, what, hint=""):
            commands.append(command)
            return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)

        def download_together(self, remote_paths: list[str], local: Path, *, in_place=False) -> ssh.Transfer:
            downloaded.append(list(remote_paths))
            return ssh.Transfer(1, 10)

    local, transfer = jobs.fetch(Here(), project, job)
    assert local == jobs.local_run_dir(project, job)
    assert downloaded == [
        [
            f"{remote.resolve()}/runs/9/",
            f"{remote}/logs/sweep-9_0.out",
            f"{remote}/logs/sweep-9_1.out",
            f"{remote}/logs/sweep-9.err",
        ]
    ]  # the results and every log in one transfer, however many tasks the array has
    assert transfer == ssh.Transfer(1, 10)
    assert len(commands) == 1  # whether there are results, and which logs: one look


STUB_SBATCH = """#!/bin/sh
echo "account=${SBATCH_ACCOUNT-unset} qos=${SBATCH_QOS-unset} script=$2" >"$STUB_SEEN"
echo 4711
"""


def test_submit_makes_the_log_folders_and_unsets_what_the_script_says(tmp_path: Path, monkeypatch):
    """The command `invoke submit` runs on the login node, run here with a stand-in sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(STUB_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    submit_dir = tmp_path / "it's here"
    submit_dir.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_SEEN": str(tmp_path / "seen"),
           "SBATCH_ACCOUNT": "remote-default", "SBATCH_QOS": "remote-qos"}  # fmt: skip

    class Here:
        def run(self, command, *, what, hint="", check=True, input_bytes=None):
            done = subprocess.run(["sh", "-c", command], input=input_bytes, env=env, capture_output=True)
            assert done.returncode == 0 or not check, done.stderr
            return proc.Completed(
                tuple(done.args), done.returncode, done.stdout.decode(), done.stderr.decode()
            )

    local = profiles.load_profile("local")
    checked = resolve(local, ResourceRequest(job_name="fit", account="mine", log="out/%x/%j.log"))
    script = render_sbatch(local, checked, JobInputs.defaults("trainer"))
    assert script.overriding_environment == ("SBATCH_ACCOUNT", "SBATCH_PARTITION")
    job_id = slurm.submit(
        Here(), str(submit_dir), "fit.sh", script.text, script.directories_to_create("me"),
        unset=script.overriding_environment,
    )  # fmt: skip
    assert job_id == "4711"
    assert (submit_dir / "scripts" / "fit.sh").read_text() == script.text
    assert (submit_dir / "out" / "fit").is_dir() and (submit_dir / "runs").is_dir()
    # The script's own --account wins; the QOS it leaves to the site comes from the environment.
    assert (tmp_path / "seen").read_text() == "account=unset qos=remote-qos script=scripts/fit.sh\n"

    # Refused: Slurm's own words in one line, and the script gone again.
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1\n"
    )
    with pytest.raises(HpcboxError, match=r"submit the job with sbatch: sbatch: error: .*Invalid account"):
        slurm.submit(Here(), str(submit_dir), "again.sh", script.text, script.directories_to_create("me"))
    assert not (submit_dir / "scripts" / "again.sh").exists()


def test_code_snapshot_is_reproducible_and_holds_only_the_code(tmp_path: Path):
    project = load_project(REPO)
    first, again = ship.code_snapshot(project), ship.code_snapshot(project)
    assert first == again
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first.archive))) as tar:
        names = tar.getnames()
    assert "hpctrain/train.py" in names and "hpctrain/__init__.py" in names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    assert len(names) == first.files


def test_dataset_is_addressed_by_content_and_keeps_its_archive_suffix(tmp_path: Path):
    archive = tmp_path / "digits.tar.gz"
    archive.write_bytes(b"not really a tarball")
    found = ship.dataset(archive, tmp_path / "cache")
    assert found.remote_name == hashlib.sha256(b"not really a tarball").hexdigest() + ".tar.gz"
    assert found.path == archive  # an archive is sent as it is: no copy in the cache, only its digest
    kept = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    assert len(kept) == 1 and kept[0].parent.name == SHA256_MEMO and kept[0].stat().st_size < 200
    with pytest.raises(HpcboxError, match=r"data: .* does not exist"):
        ship.dataset(tmp_path / "missing.tar", tmp_path / "cache")


def test_a_target_with_only_a_host_leaves_user_port_and_keys_to_ssh_config():
    argv = ssh.ssh_argv(ssh.Target("edi"), "true")
    joined = " ".join(argv)
    assert "IdentityFile" not in joined and "User=" not in joined and "Port=" not in joined
    assert "UserKnownHostsFile" not in joined
    assert "StrictHostKeyChecking=yes" in argv and f"ConnectTimeout={ssh.CONNECT_TIMEOUT_S}" in argv


def test_profile_login_gives_the_target_and_flags_win(project):
    from hpcbox.render.profiles import load_profile

    edi = load_profile("edi")
    target = jobs.connection_target(edi, project)
    assert (target.host, target.port, target.user) == (edi.login.host, None, edi.login.user)
    given = jobs.connection_target(edi, project, host="myalias", user="s123", port=2200)
    assert (given.host, given.port, given.user) == ("myalias", 2200, "s123")


def test_record_json_is_stable(project):
    text = record("8").to_json()
    assert jobs.JobRecord.from_json(text) == record("8")
    assert json.loads(text)["sif_sha256"] == "ab" * 32


# An ssh that fails its first $FAILS connections with $SAYS (counting them in $COUNT), then connects.
FLAKY_SSH = """#!/bin/sh
case " $* " in *" -O check "*) exit 255 ;; *" -O "*) exit 0 ;; esac
tries=$(($(cat "$COUNT" 2>/dev/null || echo 0) + 1))
echo "$tries" > "$COUNT"
if [ "$tries" -le "$FAILS" ]; then echo "$SAYS" >&2; exit 255; fi
exit 0
"""


@pytest.mark.parametrize(
    ("says", "fails", "attempts", "connects"),
    [
        ("kex_exchange_identification: Connection closed by remote host", 2, 3, True),
        ("kex_exchange_identification: read: Connection reset by peer", 9, 5, False),
        ("researcher@127.0.0.1: Permission denied (publickey).", 1, 1, False),
    ],
)
def test_a_connection_sshd_drops_before_the_key_exchange_is_tried_again(
    tmp_path: Path, monkeypatch, says: str, fails: int, attempts: int, connects: bool
):
    """sshd's MaxStartups drops connections when many arrive at once (20 submits did): those are worth
    another try, a refused key is not."""
    (tmp_path / "ssh").write_text(FLAKY_SSH)
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    monkeypatch.setenv("FAILS", str(fails))
    monkeypatch.setenv("SAYS", says)
    monkeypatch.setattr(ssh, "CONNECT_BACKOFF_S", 0.01)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its slots and sockets its own
    target = ssh.Target("127.0.0.1", 2222, "researcher")
    if connects:
        with ssh.Connection(target) as connection:
            assert connection.control_path.parent.is_dir()
    else:
        with pytest.raises(HpcboxError) as failed, ssh.Connection(target):
            pass
        assert says in failed.value.message
    assert int((tmp_path / "count").read_text()) == attempts


# --- where a job ran, and where a command about it goes ------------------------------------------


def test_an_address_reads_back_as_host_user_and_port():
    for target in (
        ssh.Target("login.example.org"),
        ssh.Target("edi", 2222, "s123"),
        ssh.Target("127.0.0.1", 40001, "researcher"),
        ssh.Target("::1", 2222, "me"),
        ssh.Target("fe80::1"),
    ):
        assert jobs.connect.parse_address(target.address) == (target.host, target.user, target.port)


def test_a_rehearsals_rerun_goes_to_the_rehearsal_and_a_flag_that_says_otherwise_is_refused():
    rehearsal = dataclasses.replace(
        record("12", cluster="edi"), via="local", host="researcher@127.0.0.1:40001"
    )
    assert jobs.place_of(rehearsal) == jobs.place_of(rehearsal, via="local") == jobs.Place(via="local")
    for flag, value in (("host", "login.inf.ed.ac.uk"), ("user", "s123"), ("port", 22)):
        with pytest.raises(FieldError) as refused:
            jobs.place_of(rehearsal, **{flag: value})
        assert refused.value.field == flag
        assert refused.value.message.startswith(f"{flag}: job 12 ran on the mini cluster (edi-via-local)")
        assert "\n" not in refused.value.message and "a rerun goes where its job ran" in refused.value.hint
    # `local` itself is the mini cluster too, unless it was sent elsewhere with --host
    assert jobs.place_of(record("13")) == jobs.Place()
    with pytest.raises(FieldError, match="host: job 13 ran on the mini cluster"):
        jobs.place_of(record("13"), host="gpu.example.org")
    elsewhere = dataclasses.replace(record("14"), host="researcher@gpu.example.org:2222")
    assert jobs.place_of(elsewhere) == jobs.Place(host="gpu.example.org", user="researcher", port=2222)


def test_a_sites_rerun_goes_to_the_login_node_it_ran_on_never_to_a_rehearsal():
    site = dataclasses.replace(record("12", cluster="edi"), host="s123@login.inf.ed.ac.uk")
    there = jobs.Place(host="login.inf.ed.ac.uk", user="s123")
    assert jobs.place_of(site) == there
    assert jobs.place_of(site, host="login.inf.ed.ac.uk", user="s123", port=22) == there  # agreeing flags
    with pytest.raises(FieldError) as refused:
        jobs.place_of(site, via="local")
    assert refused.value.field == "via"
    assert refused.value.message == (
        "via: job 12 ran on s123@login.inf.ed.ac.uk, not on the mini cluster (--via local)"
    )
    assert "submit them anew with --sweep and --via local" in refused.value.hint
    for flag, value in (("host", "login2.inf.ed.ac.uk"), ("user", "someone"), ("port", 2222)):
        with pytest.raises(FieldError) as refused:
            jobs.place_of(site, **{flag: value})
        assert refused.value.message == (
            f"{flag}: job 12 ran on s123@login.inf.ed.ac.uk; --{flag} {value} says otherwise"
        )
    # A target made from the place is the one the job was sent to.
    target = jobs.connection_target(profiles.load_profile("edi"), None, host=there.host, user=there.user)  # type: ignore[arg-type]
    assert target.address == site.host


def test_a_rerun_that_names_another_place_is_one_line_before_anything_is_built_or_sent(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.hpcbox]\nproject = "demo"\n')
    site = dataclasses.replace(
        record("12", cluster="edi"),
        host="s123@login.inf.ed.ac.uk",
        resources={"job_name": "sweep", "array": "0-1"},
        sweep=(("--lr", "0.1"), ("--lr", "0.2")),
    )
    jobs.Ledger(load_project(tmp_path)).add(site, "#!/bin/sh\n")
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", "submit", "--cluster=edi", "--resubmit-failed=12", "--via=local"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        "error: via: job 12 ran on s123@login.inf.ed.ac.uk, not on the mini cluster (--via local)"
    ), done.stderr
    assert len(done.stderr.splitlines()) == 2 and done.stdout == ""  # the line and its hint
    assert sorted(p.name for p in (tmp_path / ".hpcbox").iterdir()) == ["jobs"]  # nothing built


@pytest.mark.parametrize(("flag", "value"), [("host", "-oProxyCommand=touch /tmp/x"), ("user", "-lroot")])
def test_a_login_flag_that_ssh_would_read_as_an_option_is_refused(flag: str, value: str):
    with pytest.raises(FieldError) as refused:
        jobs.connection_target(profiles.load_profile("edi"), None, **{flag: value})  # type: ignore[arg-type]
    assert refused.value.field == flag and "begins with '-'" in refused.value.message
    with pytest.raises(FieldError):
        ssh.Target(**{"host": "edi", flag: value})  # and no Target is ever made of one


def test_the_master_connection_stays_for_the_next_command_for_a_bounded_idle_time_only(
    tmp_path: Path, monkeypatch
):
    """ControlPersist=yes kept a killed command's master (and a notebook's forward) logged in forever;
    the bound counts idle time only (tests/integration/test_ssh_master.py: against the real sshd)."""
    started: list[list[str]] = []

    def run(argv, **_):
        started.append(list(argv))
        return ssh.proc.Completed(tuple(argv), 0, "", "")

    monkeypatch.setattr(ssh.proc, "run", run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with ssh.Connection(ssh.Target("edi")) as connection:
        socket_path = connection.control_path
    [master] = started  # no master listened: one opened, and kept for the next command (no `-O exit`)
    assert "ControlMaster=yes" in master and "-f" in master
    assert [arg for arg in master if arg.startswith("ControlPersist=")] == [
        f"ControlPersist={ssh.CONTROL_PERSIST_S}"
    ]
    assert 60 <= ssh.CONTROL_PERSIST_S <= 600
    # The next command finds the master listening at its socket and starts nothing to ask it.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(socket_path))
        listening.listen()
        with ssh.Connection(ssh.Target("edi")) as again:
            assert again.control_path == socket_path
    assert started == [master]


def test_waiting_looks_every_quarter_second_at_first_then_every_tenth_of_the_wait_up_to_poll_s(monkeypatch):
    """A job of a few seconds is seen ending within a quarter of one, a longer one within a tenth of its
    run; a long one costs a look every poll_s."""
    from hpcbox.tools.slurm import JobState

    states = iter([*(["PENDING"] * 12), *(["RUNNING"] * 40), "COMPLETED"])
    clock = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds + 0.05  # each look itself takes a moment

    monkeypatch.setattr(slurm.time, "sleep", sleep)
    monkeypatch.setattr(slurm.time, "monotonic", lambda: clock[0])
    seen: list[str] = []
    found = slurm.poll(
        lambda: JobState("7", next(states)), "7", poll_s=2, on_change=lambda state: seen.append(state.state)
    )
    assert found.state == "COMPLETED" and seen == ["PENDING", "RUNNING", "COMPLETED"]
    waited = [sum(each + 0.05 for each in slept[:index]) for index in range(len(slept))]
    assert slept == pytest.approx([min(max(0.25, before / 10), 2) for before in waited])
    assert slept[:9] == [0.25] * 9 and 0.25 < slept[12] < 2 and slept[-3:] == [2, 2, 2]


def test_a_report_reads_the_latest_run_of_its_own_job_where_the_id_named_others():
    """`sacct --duplicates` of an id Slurm gave again: this job's two runs (requeued) and another job's,
    each an allocation line and its steps'; the allocations' own lines (`-X`) say whose each run is.
    Without --duplicates sacct shows the newest job's alone."""
    own = "/home/r/hpcbox/t|sbatch --parsable scripts/t-20261205T090001-ab12cd34.sh"
    allocations = slurm.accounted_runs(
        "".join(
            f"7|{state}|None|00:01:00|00:10:00|0:0|node1|{submitted}|{script}\n"
            for state, submitted, script in (
                ("REQUEUED", "2026-12-05T09:00:01", own),
                ("COMPLETED", "2026-12-05T09:03:00", own),
                # Another's, its SubmitLine of two lines (`sbatch --wrap`), the delimiter in it.
                ("RUNNING", "2027-01-01T00:00:00", "/home/r/x|sbatch --wrap 'a | b\nc' x.sh"),
            )
        )
    )
    assert [run.script for run in allocations][1:] == [
        "/home/r/hpcbox/t/scripts/t-20261205T090001-ab12cd34.sh", "/home/r/x/x.sh",
    ]  # fmt: skip
    fields = ("JobID", "State", "Submit")
    rows = slurm.parse_sacct(
        "7|REQUEUED|2026-12-05T09:00:01\n7.batch|CANCELLED|2026-12-05T09:00:01\n"
        "7|COMPLETED|2026-12-05T09:03:00\n7.batch|COMPLETED|2026-12-05T09:03:00\n7.0|COMPLETED|2026-12-05T09:03:02\n"
        "7|RUNNING|2027-01-01T00:00:00\n7.batch|RUNNING|2027-01-01T00:00:00\n",
        fields,
    )
    assert [(row["JobID"], row["State"]) for row in slurm.own_rows(rows, allocations, "7", SCRIPT)] == [
        ("7", "COMPLETED"), ("7.batch", "COMPLETED"), ("7.0", "COMPLETED"),
    ]  # fmt: skip
    with pytest.raises(slurm.IdReused, match=r"its id now names another job \(/home/r/x/x.sh"):
        slurm.own_rows(rows[5:], allocations[2:], "7", SCRIPT)


def test_watch_says_each_metrics_line_in_a_few_words():
    from hpcbox.jobs.fetch import figures

    epoch = {"event": "epoch", "time": 1.5, "epoch": 2, "epochs": 8, "phase": "all-layers", "lr": 0.05,
             "train_loss": 0.41234, "train_accuracy": 0.875, "val_loss": 0.3, "val_accuracy": 0.93125,
             "samples_per_s": 812.34, "resumed_at_step": None}  # fmt: skip
    assert figures(json.dumps(epoch)) == (
        "epoch 2/8: train_loss 0.4123, train_accuracy 0.875, val_loss 0.3, val_accuracy 0.9313, "
        "samples_per_s 812.3"
    )
    step = '{"event": "step", "epoch": 1, "step": 5, "loss": 1.98765}'
    assert figures(step) == "epoch 1 step 5: loss 1.988"
    assert figures('{"event": "start", "host": "node1", "resumed": null}') == "started on node1"
    assert (
        figures('{"event": "start", "host": "node2", "resumed": {"checkpoint": "ckpt-e0002-s000000.pt"}}')
        == "started on node2, resumed from ckpt-e0002-s000000.pt"
    )
    assert figures('{"event": "done", "val_accuracy": 0.9}') == "done: val_accuracy 0.9"
    # Another program's metrics: its numbers; a line that is not JSON, as it is.
    assert figures('{"event": "eval", "bleu": 27.125, "ok": true, "time": 3}') == "eval: bleu 27.12"
    assert figures('{"loss": 0.5}') == "loss 0.5"
    assert figures("not json") == "not json"


def test_watch_says_a_line_once_and_one_still_being_copied_when_it_is_whole(tmp_path: Path):
    from hpcbox.jobs.fetch import _say_new_figures

    metrics, said = tmp_path / "metrics.jsonl", []
    assert _say_new_figures(metrics, 0, said.append) == 0  # nothing copied yet
    metrics.write_text('{"event": "step", "epoch": 1, "step": 5, "loss": 2}\n{"event": "st')
    upto = _say_new_figures(metrics, 0, said.append)
    assert said == ["epoch 1 step 5: loss 2"]
    metrics.write_text(metrics.read_text() + 'ep", "epoch": 1, "step": 10, "loss": 1}\n')
    assert _say_new_figures(metrics, upto, said.append) == metrics.stat().st_size
    assert said == ["epoch 1 step 5: loss 2", "epoch 1 step 10: loss 1"]


class ThisMachine:
    """A login node that is this machine: its shell runs the commands, and its folders and files are
    copied where a download puts them."""

    def run(self, command, *, what, hint=""):
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)

    def download(self, remote_path: str, local: Path, *, in_place: bool = False, growing=()) -> ssh.Transfer:
        shutil.copytree(remote_path, local, dirs_exist_ok=True)
        return ssh.Transfer(1, 10)

    def download_together(self, remote_paths, local: Path, *, in_place: bool = False) -> ssh.Transfer:
        moved = ssh.Transfer(0, 0)
        for path in remote_paths:
            if path.endswith("/"):
                moved += self.download(path, local, in_place=in_place)
            else:
                shutil.copy2(path, local / Path(path).name)
        return moved


def test_watch_of_a_job_that_ended_before_it_copied_anything_says_so(project, tmp_path: Path):
    """Found as a user: a job cancelled while it waited, watched, ended with "no results yet" and a hint
    to look at its status, as if it might still come."""

    job = dataclasses.replace(record("7"), run_dir=str(tmp_path / "never-made"))
    with pytest.raises(HpcboxError) as refused:
        jobs.fetch_following(ThisMachine(), project, job, lambda: True, sleep=lambda _: None)
    assert refused.value.message == (
        "job 7 ended before it copied anything back (cancelled or failed while it waited or staged)"
    )
    assert refused.value.hint == "`hpcbox status -j 7` says how it ended"


def test_watch_of_a_sweep_says_each_tasks_figures_named(project, tmp_path: Path):
    """Found as a user: a watched sweep said nothing until it ended, its metrics being one a task; and
    then not which point a task ran, which its first line now says."""
    remote = tmp_path / "remote" / "runs" / "4"
    for task, loss in ((0, 0.5), (1, 0.25)):
        (remote / str(task)).mkdir(parents=True)
        (remote / str(task) / "metrics.jsonl").write_text(
            f'{{"event": "step", "epoch": 1, "step": 5, "loss": {loss}}}\n'
            f'{{"event": "step", "epoch": 1, "step": 6, "loss": {loss / 2}}}\n'
        )

    job = dataclasses.replace(
        record("4"), run_dir=str(remote), log=str(tmp_path / "none-*.out"), resources={"array": "0-1"},
        sweep=(("--lr", "1"), ("--lr", "2 3")),
    )  # fmt: skip
    said: list[str] = []
    jobs.fetch_following(ThisMachine(), project, job, lambda: True, on_line=said.append, sleep=lambda _: None)
    assert said == [
        "task 0 (--lr 1): epoch 1 step 5: loss 0.5",
        "task 0: epoch 1 step 6: loss 0.25",
        "task 1 (--lr '2 3'): epoch 1 step 5: loss 0.25",
        "task 1: epoch 1 step 6: loss 0.125",
    ]


def test_watch_rides_out_a_login_node_that_stops_answering_and_ends_with_the_job(project, tmp_path: Path):
    """A look whose rsync or Slurm finds the login node silent is taken again at the next look (the job
    runs on meanwhile), as a wait rides it out; what came meanwhile is said once it answers."""
    remote = tmp_path / "remote" / "runs" / "7"
    remote.mkdir(parents=True)
    (remote / "metrics.jsonl").write_text('{"event": "step", "epoch": 1, "step": 5, "loss": 2}\n')
    silent = ssh.Unreachable("cannot download: ssh: connect to host login port 22: Connection timed out")
    downloads: list[str] = []

    class Here(ThisMachine):
        def download(self, remote_path: str, local: Path, **options) -> ssh.Transfer:
            downloads.append(remote_path)
            if len(downloads) in (2, 3):
                raise silent
            return super().download(remote_path, local, **options)

    looks = iter([False, False, False, False, True])

    def ended() -> bool:  # the job trains on: a line more at each look
        with (remote / "metrics.jsonl").open("a") as metrics:
            metrics.write('{"event": "step", "epoch": 1, "step": 10, "loss": 1}\n')
        return next(looks)

    job = dataclasses.replace(record("7"), run_dir=str(remote), log=str(tmp_path / "none-*.out"))
    said: list[str] = []
    slept: list[float] = []
    jobs.fetch_following(Here(), project, job, ended, on_line=said.append, sleep=slept.append)
    assert len(downloads) == 5 and slept == [10.0] * 4  # two looks lost, then on to the end
    assert said == ["epoch 1 step 5: loss 2"] + ["epoch 1 step 10: loss 1"] * 5


class Counted(ThisMachine):
    """This machine as the login node, counting the commands run and the downloads made."""

    def __init__(self) -> None:
        self.commands = self.downloads = 0

    def run(self, command, *, what, hint=""):
        self.commands += 1
        return super().run(command, what=what, hint=hint)

    def download(self, remote_path: str, local: Path, **options) -> ssh.Transfer:
        self.downloads += 1
        return super().download(remote_path, local, **options)


def test_a_watch_look_that_finds_nothing_new_is_one_command_and_no_download(tmp_path: Path):
    remote, local = tmp_path / "remote", tmp_path / "local"
    login = Counted()
    assert jobs.fetch_changed(login, str(remote), local, None) == (None, ssh.Transfer(0, 0))  # not there yet
    (remote / "logs").mkdir(parents=True)
    (remote / "metrics.jsonl").write_text("1\n")
    seen, _ = jobs.fetch_changed(login, str(remote), local, None)
    assert (local / "metrics.jsonl").read_text() == "1\n" and login.downloads == 1
    commands = login.commands
    assert jobs.fetch_changed(login, str(remote), local, seen) == (seen, ssh.Transfer(0, 0))
    assert (login.commands, login.downloads) == (commands + 1, 1)


@pytest.mark.parametrize(
    "change",
    [
        lambda remote: (remote / "metrics.jsonl").write_text("1\n2\n"),  # grown
        lambda remote: (remote / "logs" / "new.txt").write_text("x"),  # a file added in a folder
        lambda remote: (remote / "metrics.jsonl").rename(remote / "renamed.jsonl"),
        lambda remote: os.utime(remote / "metrics.jsonl", ns=(0, 10**9)),  # rewritten to the same size
    ],
    ids=["grown", "added", "renamed", "rewritten"],
)
def test_a_watch_look_fetches_whatever_changed_in_the_run_folder(tmp_path: Path, change):
    remote, local = tmp_path / "remote", tmp_path / "local"
    (remote / "logs").mkdir(parents=True)
    (remote / "metrics.jsonl").write_text("1\n")
    login = Counted()
    seen, _ = jobs.fetch_changed(login, str(remote), local, None)
    change(remote)
    now, _ = jobs.fetch_changed(login, str(remote), local, seen)
    assert now != seen and login.downloads == 2


def test_watch_gives_up_on_a_login_node_silent_past_the_bound_saying_the_job_runs_on(
    project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("hpcbox.tools.slurm.UNREACHABLE_S", 0)

    class Silent:
        def run(self, command, *, what, hint=""):
            raise ssh.Unreachable("cannot look: ssh: connect to host login port 22: Connection timed out")

    with pytest.raises(ssh.Unreachable) as lost:
        jobs.fetch_following(Silent(), project, record("7"), lambda: False, sleep=lambda _: time.sleep(0.01))
    assert lost.value.message.startswith("job 7: no answer for 0 min while watching it (cannot look: ")
    assert lost.value.message.endswith("); the job runs on there")
