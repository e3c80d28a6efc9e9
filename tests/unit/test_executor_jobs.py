"""hpcbox.submitit's jobs after submit, without a cluster: each task of an array is a job of its own
(state, wait, result, cancel, log), a job is found again from its folder and pickles, waits have no cap
and back off, and submitit's parameters are each honoured or refused. Slurm here is an in-memory
stand-in behind the `hpcbox.Job` methods the executor calls (watch, state, task, fetch, cancel,
log_text), its watch's look the stand-in's; tests/integration/test_executor.py proves the same on the
mini cluster."""

from __future__ import annotations

import gc
import itertools
import math
import operator
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import pytest

from hpcbox import api
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.jobs.fetch import NoResults, local_run_dir
from hpcbox.jobs.watch import MAX_INTERVAL_S, Watch
from hpcbox.ledger import JobRecord
from hpcbox.project.config import load_project
from hpcbox.submitit.executor import (
    JOB_FILE,
    SLURM_NAMES,
    Executor,
    Job,
    SubmittedCalls,
    UncompletedJobError,
    hpcbox_resources,
)
from hpcbox.tools import slurm
from hpcbox.tools.slurm import JobState


class StandInSlurm:
    """A cluster's Slurm and shared storage, in memory and in a folder: each task's state as squeue and
    sacct would give it, the run folders and logs the job script writes, and what was asked of it."""

    def __init__(self, storage: Path, tasks: int) -> None:
        self.storage = storage
        self.states: dict[int, str] = dict.fromkeys(range(tasks), "PENDING")
        self.reads = 0  # looks at the array's states (one squeue, and one sacct, on a real cluster)
        self.watch = Watch(self.read)
        self.fetches = 0
        self.cancelled: list[str] = []
        self.events: list = []  # what happens on the cluster before each of the next reads, in turn

    def read(self, records) -> slurm.Looked:
        """One look at the array, as `jobs.look` answers it: each task's state by `7_TASK`."""
        assert [record.job_id for record in records] == ["7"]
        self.reads += 1
        if self.events:
            self.events.pop(0)()
        return {f"7_{task}": JobState(f"7_{task}", state) for task, state in self.states.items()}

    def run(self, task: int, log: str) -> None:
        self.states[task] = "RUNNING"
        (self.storage / "logs").mkdir(parents=True, exist_ok=True)
        (self.storage / "logs" / f"calls-7_{task}.out").write_text(log)

    def finish(self, task: int, value: object, state: str = "COMPLETED") -> None:
        """The task ends: the runner's result in its run folder (none unless COMPLETED), its log."""
        if state == "COMPLETED":
            run_dir = self.storage / "runs" / "7" / str(task)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "result.pkl").write_bytes(pickle.dumps(("success", value), protocol=4))
        (self.storage / "logs").mkdir(parents=True, exist_ok=True)
        with (self.storage / "logs" / f"calls-7_{task}.out").open("a") as log:
            log.write(f"task {task} {state.lower()}\n")
        self.states[task] = state


class StandInJob:
    """What `hpcbox.Job` answers, from a `StandInSlurm`: an array job, or one of its tasks."""

    def __init__(self, cluster: StandInSlurm, site: api.Site, record: JobRecord) -> None:
        self.cluster, self.site, self.record = cluster, site, record

    @property
    def job_id(self) -> str:
        return self.record.job_id

    def task(self, index: int) -> StandInJob:
        return StandInJob(self.cluster, self.site, self.record.of_task(index))

    @property
    def watch(self) -> Watch:
        self.cluster.watch.add(self.record)
        return self.cluster.watch

    def state(self) -> JobState:
        assert self.record.task is not None, "the executor reads an array's states all at once"
        if self.record.task not in self.cluster.states:  # as `jobs.state` says it
            raise HpcboxError(f"job {self.job_id} is known to neither squeue nor sacct on edi")
        return JobState(self.job_id, self.cluster.states[self.record.task])

    def cancel(self) -> JobState:
        self.cluster.cancelled.append(self.job_id)
        self.cluster.states[self.record.task] = "CANCELLED"
        return self.state()

    def log_text(self) -> str | None:
        log = Path(self.record.log)
        return log.read_text() if log.is_file() else None

    def fetch(self) -> Path:
        """As rsync brings the run folder and each task's log into runs/<cluster>/<job>/."""
        self.cluster.fetches += 1
        local = local_run_dir(self.site.project, self.record)
        run_dir = Path(self.record.run_dir)
        if not run_dir.is_dir():
            raise NoResults(f"job {self.job_id} has no results in {run_dir} yet")
        shutil.copytree(run_dir, local, dirs_exist_ok=True)
        for log in Path(self.record.log).parent.glob(Path(self.record.log).name):
            shutil.copyfile(log, local / log.name)
        return local


@pytest.fixture
def project(tmp_path: Path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "calls"\n')
    return load_project(root)


def array_record(storage: Path, tasks: int) -> JobRecord:
    return JobRecord(
        job_id="7", cluster="edi", host="me@login.edi:22", submitted_at="2026-12-05T10:00:00+00:00",
        submit_dir=str(storage), script=str(storage / "scripts" / "calls.sh"),
        log=str(storage / "logs" / "calls-7_*.out"), run_dir=str(storage / "runs" / "7"), sif="s.sif",
        sif_sha256="ab" * 32, image="hpcbox/calls-environment:0123456789ab", code_revision="0123abc",
        code_snapshot="cd" * 32, dataset_sha256="ef" * 32,
        resources={"job_name": "add", "array": f"0-{tasks - 1}%256"}, trainer_args=(),
        sweep=tuple((str(task),) for task in range(tasks)),
    )  # fmt: skip


@pytest.fixture
def three(project, tmp_path: Path):
    """An array of three calls of `operator.add`, submitted: the stand-in Slurm and its three jobs."""
    cluster = StandInSlurm(tmp_path / "cluster", 3)
    site = api.Site("edi", project=project)
    call_dir = tmp_path / "calls" / "call-0123456789ab"
    call_dir.mkdir(parents=True)
    for task in range(3):
        (call_dir / f"call-{task}.pkl").write_bytes(pickle.dumps((operator.add, (task, 10), {}), protocol=4))
    calls = SubmittedCalls(StandInJob(cluster, site, array_record(cluster.storage, 3)), call_dir)  # type: ignore[arg-type]
    return cluster, [Job._of(calls, task) for task in range(3)]


def test_a_cancelled_task_is_that_task_alone_and_the_others_return(three):
    cluster, jobs = three
    for task in range(3):
        cluster.run(task, f"task {task} started\n")
    jobs[1].cancel()
    assert cluster.cancelled == ["7_1"]
    assert [job.state for job in jobs] == ["RUNNING", "CANCELLED", "RUNNING"]
    assert [job.done() for job in jobs] == [False, True, False]
    cluster.finish(0, 10)
    assert jobs[0].result() == 10  # while task 2 still runs
    assert not jobs[2].done()
    cluster.finish(2, 12)
    assert jobs[2].result() == 12
    with pytest.raises(UncompletedJobError, match=r"job 7_1 ended CANCELLED without a result"):
        jobs[1].result()
    assert isinstance(jobs[1].exception(), UncompletedJobError)
    assert jobs[0].exception() is None and jobs[0].results() == [10]


def test_a_tasks_log_is_read_live_while_it_runs_and_from_the_fetched_copy_once_it_ended(three):
    cluster, jobs = three
    assert jobs[2].stdout() is None  # pending: no log yet
    cluster.run(2, "epoch 1\n")
    assert jobs[2].stdout() == "epoch 1\n"  # on the cluster, the job still running
    assert cluster.fetches == 0
    cluster.finish(2, 12)
    jobs[2].wait()  # seen ended
    assert jobs[2].stdout() == "epoch 1\ntask 2 completed\n"
    assert jobs[2].paths.stdout.read_text() == jobs[2].stdout()  # the fetched copy
    assert jobs[0].stdout() is None and jobs[0].stderr() is None


def test_tasks_waited_on_in_turn_read_the_arrays_states_once_and_fetch_those_that_ended_together(three):
    cluster, jobs = three
    for task in range(3):
        cluster.finish(task, task + 10)
    assert [job.result() for job in jobs] == [10, 11, 12]
    assert (cluster.reads, cluster.fetches) == (1, 1)  # the first read saw all three ended


def test_as_completed_yields_tasks_as_they_end_asking_slurm_at_most_once_a_round(three):
    """submitit's own `helpers.as_completed` over the three tasks: a round's `done()`s share the
    watch's look (a round here is 0.2 s; the watch looks as its schedule says, never more than once a
    round)."""
    from submitit.helpers import as_completed

    cluster, jobs = three
    for task in range(3):
        cluster.run(task, "")
    nothing = lambda: None  # noqa: E731
    cluster.events = [nothing, lambda: cluster.finish(2, 12), lambda: cluster.finish(0, 10), nothing]
    cluster.events.append(lambda: cluster.finish(1, 11))
    rounds = 0

    def done(job: Job, done=Job.done) -> bool:
        nonlocal rounds
        rounds += job is jobs[0] or (job is jobs[1] and jobs[0].done())  # each round's first look
        return done(job)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Job, "done", done)
        assert [job.task_id for job in as_completed(jobs, poll_frequency=0.2)] == [2, 0, 1]
    assert cluster.reads == 5 < rounds  # one for each change, not one a task or a round
    assert [job.result() for job in jobs] == [10, 11, 12]


def test_a_task_that_ended_after_the_last_fetch_is_fetched_again(three):
    cluster, jobs = three
    cluster.finish(0, 10)
    cluster.run(1, "")
    assert jobs[0].result() == 10
    cluster.finish(1, 11)
    assert jobs[1].result() == 11
    assert cluster.fetches == 2


def test_a_wait_has_no_cap_and_backs_off_to_a_minute_between_looks(three, monkeypatch: pytest.MonkeyPatch):
    """Slurm's clock is a counter here: the task ends after 30 hours of looks."""
    cluster, jobs = three
    slept: list[float] = []

    class Clock:
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)
            self.now += seconds
            if self.now > 30 * 3600:
                cluster.finish(0, 10)

    clock = Clock()
    monkeypatch.setattr(slurm, "time", clock)
    cluster.watch = Watch(cluster.read, clock=clock.monotonic, sleep=clock.sleep)
    cluster.run(0, "")
    assert jobs[0].result() == 10
    assert slept[0] == slurm.FIRST_POLL_S and max(slept) == pytest.approx(MAX_INTERVAL_S)
    assert all(later >= earlier - 1e-6 for earlier, later in itertools.pairwise(slept))  # never sooner
    assert cluster.reads == len(slept) + 1  # one array-wide read per look


def test_a_task_slurm_does_not_list_is_said_so_not_waited_on_as_pending(three):
    cluster, jobs = three
    cluster.run(0, "")
    del cluster.states[2]  # forgotten (accounting off), or unreachable
    assert jobs[0].state == "RUNNING"
    with pytest.raises(HpcboxError, match="job 7_2 is known to neither squeue nor sacct"):
        jobs[2].wait()


def test_paths_and_submission_are_submitits(three):
    _, jobs = three
    paths = jobs[1].paths
    call_dir = paths.folder
    assert paths.submitted_pickle == call_dir / "call-1.pkl"
    assert paths.result_pickle.parts[-3:] == ("7", "1", "result.pkl")
    assert paths.stdout == paths.stderr and paths.stdout.name == "calls-7_1.out"
    assert paths.submission_file.name == "edi-7.sh"  # the ledger's copy of the job script
    call = jobs[1].submission()
    assert (call.function, call.args, call.kwargs) == (operator.add, (1, 10), {})


def test_cancel_at_deletion_cancels_an_unfinished_task_only_where_asked(three):
    cluster, jobs = three
    cluster.run(0, "")
    cluster.run(1, "")
    first, second = jobs[0], jobs[1].cancel_at_deletion()
    jobs.clear()
    del first
    gc.collect()
    assert cluster.cancelled == []
    del second
    gc.collect()
    assert cluster.cancelled == ["7_1"]


def test_a_job_is_found_again_from_its_folder_and_pickles_as_that(three, project, tmp_path: Path):
    _, jobs = three
    jobs[2]._call.save()
    folder = tmp_path / "calls"
    assert (folder / "call-0123456789ab" / JOB_FILE).is_file()
    for found in (Job(folder, "7_2"), pickle.loads(pickle.dumps(jobs[2]))):
        assert found.job_id == "7_2" and found.task_id == 2
        assert found._call.job.record == jobs[2]._call.job.record
        assert found._call.job.site.where == "edi" and found._call.job.site.project.root == project.root
        assert found.submission().args == (2, 10)
    from submitit.core.utils import DelayedSubmission

    from hpcbox.submitit.plugin import HpcboxJob

    through_submitit = pickle.loads(pickle.dumps(HpcboxJob(jobs[2])))  # submitit's Job, no watcher
    assert through_submitit.job_id == "7_2"
    assert isinstance(through_submitit.submission(), DelayedSubmission)
    assert through_submitit.submission().args == (2, 10)
    with pytest.raises(HpcboxError, match="job 8: no call folder in"):
        Job(folder, "8_0")
    with pytest.raises(HpcboxError, match="job 7 is an array job"):
        Job(folder, "7")
    with pytest.raises(HpcboxError, match="job 7_3: job 7 has tasks 0-2"):
        Job(folder, "7_3")


def test_every_slurm_parameter_of_submitits_is_honoured_or_refused_by_name():
    from submitit.slurm.slurm import _get_default_parameters

    assert set(_get_default_parameters()) <= set(SLURM_NAMES)
    assert hpcbox_resources({
        "slurm_partition": "gpu", "slurm_account": "a1", "slurm_qos": "short", "slurm_time": 90,
        "slurm_mem": "16G", "slurm_gres": "gpu:a100:2", "slurm_cpus_per_task": 8,
        "slurm_max_num_timeout": 3, "slurm_array_parallelism": 4, "slurm_constraint": "ib",
        "slurm_exclusive": True, "slurm_additional_parameters": {"mail_type": "END", "begin": "now+1hour"},
        "slurm_use_srun": True, "slurm_stderr_to_stdout": True, "slurm_setup": [],
    }) == {
        "partition": "gpu", "account": "a1", "qos": "short", "time": "90", "mem": "16G", "gpus": 2,
        "gpu_type": "a100", "cpus": 8, "max_restarts": 3, "array_parallelism": 4,
        "extra": ("--constraint=ib", "--exclusive", "--mail-type=END", "--begin=now+1hour"),
    }  # fmt: skip
    assert hpcbox_resources({"slurm_gres": "lscratch:10"}) == {"extra": ("--gres=lscratch:10",)}
    for key, value, said in (
        ("slurm_setup", ["module load cuda"], "runs in the project's container"),
        ("slurm_srun_args", ["--cpu-bind=none"], "its own srun line"),
        ("slurm_signal_delay_s", 120, "asks for the time limit's signal itself"),
        ("slurm_use_srun", False, "starts every call with srun"),
        ("slurm_gres", "gpu:a100", "gpu:N or gpu:TYPE:N"),
        ("slurm_partiton", "gpu", "no such parameter (a typo? allowed: "),
    ):
        with pytest.raises(FieldError, match=re.escape(said)) as refused:
            hpcbox_resources({key: value})
        assert refused.value.field == key


def test_arrays_are_throttled_as_submitits_unless_told(project, tmp_path: Path):
    executor = Executor(tmp_path / "calls", "edi", project=project)
    assert "array_parallelism" not in executor.parameters  # submit throttles at DEFAULT_ARRAY_PARALLELISM
    executor.update_parameters(slurm_array_parallelism=8)
    assert executor.parameters["array_parallelism"] == 8


def auto_parameters(folder: Path, cluster: str, **parameters):
    """What submitit's AutoExecutor hands its executor for ``parameters``, and what it warns."""
    import submitit

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            auto = submitit.AutoExecutor(folder, cluster=cluster)
            auto.update_parameters(**parameters)
        except (NameError, ValueError, AssertionError) as error:
            return type(error).__name__, str(error).splitlines()[0], []
    return "ok", auto._executor.parameters, sorted(str(warning.message) for warning in warned)


def forget_plugins() -> None:
    from submitit.core import plugins

    plugins._get_plugins.cache_clear()
    plugins.get_executors.cache_clear()


@pytest.mark.parametrize(
    "parameters",
    [
        {"partition": "gpu", "mem_gb": 4, "timeout_min": 30},
        {"slurm_partition": "gpu", "account": "a1", "qos": "short", "time": 5, "mem": "4G"},
        {"gpus": 2, "gpu_type": "a100"},  # no executor's: refused
        {"setup": ["echo hi"]},
    ],
)
@pytest.mark.parametrize("cluster", ["slurm", "local"])
def test_installing_hpcbox_changes_nothing_for_submitits_own_executors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str, parameters: dict
):
    """submitit's AutoExecutor with hpcbox's plugin installed and without it (its entry points not
    read), for the same parameters: the same parameters handed on, the same warnings, the same errors."""
    from submitit.core import plugins

    # SlurmExecutor looks for srun on PATH when it is made; nothing here runs it.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    forget_plugins()
    try:
        assert "hpcbox" in plugins.get_executors()
        with_hpcbox = auto_parameters(tmp_path / "with", cluster, **parameters)
        monkeypatch.setattr(plugins, "_iter_submitit_entrypoints", lambda: [])
        forget_plugins()
        assert "hpcbox" not in plugins.get_executors()
        assert auto_parameters(tmp_path / "without", cluster, **parameters) == with_hpcbox
    finally:
        monkeypatch.undo()
        forget_plugins()


def test_submitits_autoexecutor_hands_hpcbox_its_prefixed_and_slurm_names(project, tmp_path: Path):
    import submitit

    auto = submitit.AutoExecutor(
        tmp_path / "auto", cluster="hpcbox", hpcbox_cluster="edi", hpcbox_project=str(project.root)
    )
    auto.update_parameters(timeout_min=30, hpcbox_slurm_partition="gpu", hpcbox_qos="short")
    assert auto._executor._hpcbox.parameters == {"time": "30", "partition": "gpu", "qos": "short"}
    with pytest.raises(FieldError, match="partiton: no such parameter"):
        auto.update_parameters(hpcbox_partiton="gpu")
    # Found as a user: the cluster given with the resources was "no such parameter", with 70 names
    # that do not include it; it is the executor's own, said as such with the way to give it.
    with pytest.raises(FieldError) as refused:
        auto.update_parameters(timeout_min=5, hpcbox_cluster="local")
    assert str(refused.value) == (
        "cluster: is the executor's own (where its jobs go, what they run in), given once as it is made "
        '(Executor(folder, cluster=...), or through submitit AutoExecutor(folder, cluster="hpcbox", '
        "hpcbox_cluster=...))"
    )
    assert auto._executor._hpcbox.parameters["time"] == "30"  # nothing of the refused call was taken


def test_a_tasks_state_is_read_among_its_arrays_and_its_log_as_it_stands(tmp_path: Path):
    """`hpcbox.Job.task(i)` over a connection whose remote side is this machine, with squeue as Slurm
    answers `squeue --array` for an array whose task 1 waits on its throttle (sacct knows none yet)."""
    from hpcbox import jobs
    from tests.unit.test_prune import LocalConnection

    home, bin_dir, storage = tmp_path / "home", tmp_path / "bin", tmp_path / "cluster"
    for folder in (home, bin_dir, storage / "logs"):
        folder.mkdir(parents=True)
    running = "7_0|RUNNING|None|0:05|10:00|n1|2026-12-05T10:00:05|2026-12-05T10:00:00|/s/scripts/calls.sh"
    waiting = "|PENDING|JobArrayTaskLimit|0:00|10:00|(null)|N/A|2026-12-05T10:00:00|/s/scripts/calls.sh"
    # Without --array, squeue folds the tasks that wait into one line: `7_[1]`.
    (bin_dir / "squeue").write_text(
        f"#!/bin/sh\ncase \" $* \" in *' --array '*) task=7_1 ;; *) task='7_[1]' ;; esac\n"
        f"printf '%s\\n' '{running}' \"$task\"'{waiting}'\n"
    )
    (bin_dir / "sacct").write_text("#!/bin/sh\nexit 0\n")
    for program in ("squeue", "sacct"):
        (bin_dir / program).chmod(0o755)
    connection = LocalConnection(home, bin_dir)
    array = array_record(storage, 3)
    task = array.of_task(1)
    found = jobs.state(connection, task)  # type: ignore[arg-type]
    assert (found.job_id, found.state, found.reason) == ("7_1", "PENDING", "JobArrayTaskLimit")
    with pytest.raises(HpcboxError, match="job 7_2 is known to neither squeue nor sacct"):
        jobs.state(connection, array.of_task(2))  # type: ignore[arg-type]  # never taken for pending
    assert jobs.log_text(connection, task) is None  # type: ignore[arg-type]
    (storage / "logs" / "calls-7_1.out").write_text("epoch 1\n")
    assert jobs.log_text(connection, task) == "epoch 1\n"  # type: ignore[arg-type]


def test_a_wait_rides_out_a_login_node_that_stops_answering_then_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
):
    """`slurm.poll` over a read that finds the login node gone for a while (ssh.Unreachable), with
    Slurm's clock a counter: back within UNREACHABLE_S, the wait goes on to the job's end; gone for
    longer, one line saying so, the job left running."""
    from hpcbox.tools import ssh

    class Clock:
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    def read_while(answering_after_s: float):
        def read() -> JobState:
            if clock.now < answering_after_s:
                raise ssh.Unreachable("failed to ask squeue about job 9: Connection refused")
            return JobState("9", "COMPLETED")

        return read

    clock = Clock()
    monkeypatch.setattr(slurm, "time", clock)
    found = slurm.poll(read_while(slurm.UNREACHABLE_S - 60), "9", timeout_s=math.inf, poll_s=MAX_INTERVAL_S)
    assert found.state == "COMPLETED"
    clock.now = 0.0
    with pytest.raises(ssh.Unreachable) as given_up:
        slurm.poll(read_while(math.inf), "9", timeout_s=math.inf, poll_s=MAX_INTERVAL_S)
    assert given_up.value.message.startswith("job 9: no answer for 15 min while waiting on it (failed to ")
    assert given_up.value.message.endswith("Connection refused); the job runs on there")


def test_a_login_node_that_does_not_answer_is_unreachable_and_one_that_refuses_is_not(tmp_path: Path):
    """Real ssh, to a port here nothing listens on: Unreachable, which a wait rides out."""
    from hpcbox.tools import proc, ssh

    port = proc.free_local_port()  # nothing listens there
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    target = ssh.Target("127.0.0.1", port, "nobody", key_path=tmp_path / "key", known_hosts=known_hosts)
    with pytest.raises(ssh.Unreachable, match="Connection refused"), ssh.Connection(target):
        pass
    # Where the target's owner knows what a login node that does not answer means (a mini cluster's
    # stopped containers), its hint is the one given.
    told = ssh.Target(**{**vars(target), "unreachable_hint": "start it again"})
    with pytest.raises(ssh.Unreachable) as unreachable, ssh.Connection(told):
        pass
    assert unreachable.value.hint == "start it again"
    assert not ssh.not_answering("Permission denied (publickey).")
    assert not ssh.not_answering("Host key verification failed.")


def test_sbatch_options_from_several_updates_add_up_and_a_later_one_replaces_its_own(project, tmp_path: Path):
    executor = Executor(tmp_path / "calls", "edi", project=project)
    executor.update_parameters(slurm_constraint="a100", slurm_exclusive=False)
    executor.update_parameters(slurm_exclude="n1", extra=("--begin=now",))
    executor.update_parameters(slurm_constraint="h100")
    assert executor.parameters["extra"] == ("--exclude=n1", "--begin=now", "--constraint=h100")
