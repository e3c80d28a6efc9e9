"""`Site` over `hpcbox.testing.MockTransport`: hpcbox's own code from the call down to each command line
a login node is given, a login node in memory answering as Slurm would (squeue, sacct and scancel over a
table of tasks). What a call sends, and how often, in milliseconds; test_executor.py and test_submit.py
prove the same on the mini cluster."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path

import pytest

from hpcbox import api, jobs
from hpcbox.errors import HpcboxError
from hpcbox.jobs import notebook as notebooks
from hpcbox.ledger import JobRecord
from hpcbox.project.config import load_project
from hpcbox.testing.transport import MockTransport, Reply
from hpcbox.tools import ssh

SUBMIT_DIR = "/home/me/hpcbox/jobs/calls"
SCRIPT = f"{SUBMIT_DIR}/scripts/calls.sh"
HELD = ("PENDING", "RUNNING")


class SlurmInMemory:
    """A login node's squeue, sacct and scancel over ``states`` (`7_TASK` → state), answering in the
    formats hpcbox asks for; ``asked`` counts each program's calls. ``silent`` more calls raise
    `ssh.Unreachable`, as a connection to a login node that stopped answering does."""

    def __init__(self, tasks: int, state: str = "RUNNING") -> None:
        self.states = {f"7_{task}": state for task in range(tasks)}
        self.asked: Counter[str] = Counter()
        self.silent = 0
        self.after_look: list[str] = []  # each next look's change: every task's state, in turn

    def __call__(self, line: str) -> Reply | str:
        if self.silent:
            self.silent -= 1
            raise ssh.Unreachable("connect to me@login.edi:22 failed: Connection timed out")
        argv = shlex.split(line)
        program = argv[2] if argv[0] == "timeout" else argv[0]
        self.asked[program] += 1
        if program == "squeue":
            return self._squeue(_option(argv, "--jobs").split(","))
        if program == "sacct":
            return self._sacct(_option(argv, "--jobs").split(","))
        if argv[:3] == ["scancel", "--batch", "--signal=TERM"]:  # the job script saves and ends it
            self.states[argv[3]] = "CANCELLED"
            return ""
        if program == "grep":  # the job script's started line, in the task's log
            return Reply()
        if line.startswith("for kept in"):  # the run folders' exit statuses: none kept
            return ""
        raise AssertionError(f"no login node answers {line}")

    def _squeue(self, ids: list[str]) -> str:
        answer = "".join(
            f"{task}|{state}|None|0:42|10:00|{'node1' if state == 'RUNNING' else ''}|N/A|"
            f"2026-12-06T10:00:00|{SCRIPT}\n"
            for task, state in self.states.items()
            if state in HELD and task.partition("_")[0] in ids
        )
        if self.after_look:
            self.states = dict.fromkeys(self.states, self.after_look.pop(0))
        return answer

    def _sacct(self, ids: list[str]) -> str:
        return "".join(
            f"{task}|{state}|None|0:42|10:00|0:0|node1|2026-12-06T10:00:00|{SUBMIT_DIR}|"
            "sbatch --parsable scripts/calls.sh\n"
            for task, state in self.states.items()
            if state not in HELD and task.partition("_")[0] in ids
        )


def _option(argv: list[str], name: str) -> str:
    return next(word.split("=", 1)[1] for word in argv if word.startswith(f"{name}="))


@pytest.fixture
def site(tmp_path: Path):
    """Site `edi` of a project of this test's own (its ledger, and its watch: one per login and
    project in the process), reached at a login in memory."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "calls"\n')
    return lambda slurm: api.Site(
        "edi", login=ssh.Target("login.edi", 22, "me"), project=load_project(root), say=lambda _: None,
        transport=MockTransport(slurm),
    )  # fmt: skip


def sent(site: api.Site, tasks: int) -> api.Job:
    """An array of ``tasks`` tasks, as `submit` records it in the project's ledger."""
    record = JobRecord(
        job_id="7", cluster="edi", host="me@login.edi:22", submitted_at="2026-12-06T10:00:00+00:00",
        submit_dir=SUBMIT_DIR, script=SCRIPT, log=f"{SUBMIT_DIR}/logs/calls-7_*.out",
        run_dir=f"{SUBMIT_DIR}/runs/7", sif="s.sif", sif_sha256="ab" * 32,
        image="hpcbox/calls-environment:0123456789ab", code_revision="0123abc", code_snapshot="cd" * 32,
        dataset_sha256="ef" * 32, resources={"array": f"0-{tasks - 1}%256"}, trainer_args=(),
        sweep=tuple((str(task),) for task in range(tasks)),
    )  # fmt: skip
    jobs.Ledger(site.project).add(record, "#!/bin/bash\n")
    return site.job("7")


def test_a_running_tasks_cancel_asks_that_tasks_batch_shell_alone_to_save_and_stop(site):
    slurm = SlurmInMemory(3)
    here = site(slurm)
    transport = here.transport
    ended = sent(here, 3).task(1).cancel()
    assert (ended.job_id, ended.state) == ("7_1", "CANCELLED")
    assert [line for line in transport.commands if line.startswith("scancel")] == [
        "scancel --batch --signal=TERM 7_1"
    ]
    assert slurm.states == {"7_0": "RUNNING", "7_1": "CANCELLED", "7_2": "RUNNING"}


def test_a_wait_on_a_thousand_tasks_asks_one_squeue_a_look_for_them_all(site):
    slurm = SlurmInMemory(1000, "PENDING")
    slurm.after_look = ["RUNNING", "COMPLETED"]
    job = sent(site(slurm), 1000)
    assert job.wait(timeout_s=60).state == "COMPLETED"
    assert slurm.asked["squeue"] == job.watch.looks == 3  # pending, running, then ended: sacct's
    assert slurm.asked["sacct"] == 1


def test_a_login_that_stops_answering_during_a_wait_is_ridden_out(site):
    slurm = SlurmInMemory(2)
    slurm.after_look = ["COMPLETED"]
    job = sent(site(slurm), 2)
    assert job.task(0).state().state == "RUNNING"
    slurm.silent = 3
    assert job.wait(timeout_s=60).state == "COMPLETED"
    assert slurm.silent == 0


def test_a_state_read_while_the_login_does_not_answer_says_so_in_one_error(site):
    slurm = SlurmInMemory(2)
    slurm.silent = 1
    with pytest.raises(HpcboxError, match=r"^connect to me@login\.edi:22 failed"):
        sent(site(slurm), 2).state()


class NotebookLogin(SlurmInMemory):
    """Job 7, a notebook RUNNING on node1 (``state``), whose Jupyter has written its runtime file there."""

    def __init__(self, state: str = "RUNNING") -> None:
        super().__init__(0)
        self.states = {"7": state}

    def __call__(self, line: str) -> Reply | str:
        if line.startswith("srun --jobid=7 --overlap"):
            return json.dumps({"port": 8888, "token": "ab" * 24})
        return super().__call__(line)


def notebook_job(site: api.Site) -> api.Job:
    """Notebook job 7, as `hpcbox notebook` records it."""
    record = JobRecord(
        job_id="7", cluster="edi", host="me@login.edi:22", submitted_at="2026-12-06T10:00:00+00:00",
        submit_dir=SUBMIT_DIR, script=SCRIPT, log=f"{SUBMIT_DIR}/logs/calls-7.out",
        run_dir=f"{SUBMIT_DIR}/runs/7", sif="s.sif", sif_sha256="ab" * 32,
        image="hpcbox/calls-notebook:0123456789ab", code_revision="0123abc", code_snapshot="cd" * 32,
        dataset_sha256="ef" * 32, resources={}, trainer_args=(), notebook=True,
    )  # fmt: skip
    jobs.Ledger(site.project).add(record, "#!/bin/bash\n")
    return site.job("7")


# A MockTransport forwards no port: the forward to Jupyter fails, as one to a node the login node cannot
# reach does.
def test_a_notebook_its_own_command_sent_but_cannot_reach_is_ended_before_the_failure_is_raised(site):
    slurm = NotebookLogin()
    here = site(slurm)
    said, shown = [], []
    with here.connect() as connection, pytest.raises(HpcboxError, match="forwards no ports"):
        record = notebook_job(here).record
        notebooks.serve(connection, here.profile, record, sent_here=True, say=said.append, show=shown.append)
    assert slurm.states == {"7": "CANCELLED"}  # by its batch shell, which saves what the notebook wrote
    assert "hpcbox: ending notebook job 7: it cannot be reached from here" in said
    assert shown == []


def test_a_notebook_attached_to_that_cannot_be_reached_is_left_running(site):
    slurm = NotebookLogin()
    job = notebook_job(site(slurm))
    with pytest.raises(HpcboxError, match="forwards no ports"):
        job.attach_notebook(show=lambda url: pytest.fail(f"shown {url}"))
    assert slurm.states == {"7": "RUNNING"}
    assert not [line for line in job.site.transport.commands if line.startswith("scancel")]


def test_a_notebook_that_ended_before_its_own_command_reached_it_is_not_cancelled(site):
    slurm = NotebookLogin("FAILED")
    here = site(slurm)
    said = []
    with here.connect() as connection, pytest.raises(HpcboxError, match=r"notebook job 7 ended \(FAILED\)"):
        notebooks.serve(connection, here.profile, notebook_job(here).record, sent_here=True, say=said.append)
    assert not [line for line in here.transport.commands if line.startswith("scancel")]
    assert not [line for line in said if "ending notebook job" in line]
