"""A job is itself, not its id (issue 59): a mini cluster made again numbers its jobs from 1 again, and
nothing of an earlier job 1 (its ledger record, its fetched results) is replaced or mixed with the new
one's; every command about the earlier job says where it ran and where its results are; `cluster.down`
names the jobs whose results would go with the cluster. All through the CLI, as a user types it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox.render.sbatch import SCRIPT_STARTED
from tests.fixtures.cluster import free_port
from tests.fixtures.submitting import RESTING, Setup, ctrl_c_as_in_a_terminal, with_own_ledger
from tests.integration.test_submit import SHORT, invoke, sweep_project

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def setup(project_setup: Setup, run_id: str, tmp_path_factory) -> Setup:
    """A project with a ledger of its own, pointed at this module's cluster (made and removed here)."""
    own = with_own_ledger(project_setup, tmp_path_factory, "identity-project")
    return Setup(
        own.project_dir, own.data, own.sif_cache, {**own.env, "HPCBOX_MINICLUSTER": f"{run_id}-ident"}
    )


@pytest.fixture(scope="module")
def spec(setup: Setup, minicluster_state: Path) -> Iterator[object]:
    from hpcbox import minicluster as mc

    made = mc.ClusterSpec(name=setup.env["HPCBOX_MINICLUSTER"], nodes=1, port=free_port())
    try:
        yield made
    finally:
        mc.down(made.name, minicluster_state)


def submitted(setup: Setup) -> tuple[str, str]:
    """`hpcbox submit` of a short training: (job id, what it said on stderr)."""
    done = invoke(
        setup, "submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10",
        "--", *SHORT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1], done.stderr


def completed(setup: Setup, job: str) -> None:
    """`status --follow` says job ``job``'s state each time it changes and returns once it has ended:
    COMPLETED, and nothing ended before that line."""
    followed = invoke(setup, "status", "-j", job, "--follow")
    assert followed.returncode == 0, followed.stderr
    job_id = job.split("-")[0]
    said = [line.split(", ")[0].removeprefix(f"job {job_id}: ") for line in followed.stdout.splitlines()]
    assert said and said[-1] == "COMPLETED", followed.stdout
    assert not set(said[:-1]) & {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, followed.stdout
    status = invoke(setup, "status", "-j", job)
    assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout + status.stderr


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, by its path there, with its content's sha256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_cluster_made_again_never_mixes_its_job_1_with_the_old_one(setup: Setup, spec, minicluster_state):
    from hpcbox import minicluster as mc

    project = setup.project().root
    first = mc.up(spec, minicluster_state)
    fetched_job, _ = submitted(setup)
    kept_job, _ = submitted(setup)
    assert (fetched_job, kept_job) == ("1", "2")  # a fresh cluster's first jobs
    completed(setup, fetched_job)
    completed(setup, kept_job)
    fetch = invoke(setup, "fetch", "-j", fetched_job)
    assert fetch.returncode == 0, fetch.stderr
    old_results = tree(project / "runs" / "local" / "1")
    assert "metrics.jsonl" in old_results
    ledger = project / ".hpcbox" / "jobs"
    old_records = tree(ledger)

    # Job 2's results are on the cluster alone: removing it is refused, naming the job and its project.
    refused = invoke(setup, "cluster.down", f"--name={spec.name}")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: cluster {spec.name} holds the results of job 2 of {project}, never fetched: removing it "
        "loses them",
        f"  hint: fetch them first (`hpcbox fetch -j 2` in {project}), or pass --force",
    ]
    assert mc.find(spec.name, minicluster_state) == first
    forced = invoke(setup, "cluster.down", f"--name={spec.name}", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"loses the results of job 2 of {project}, never fetched" in forced.stdout

    again = mc.up(spec, minicluster_state)
    assert again.incarnation.id != first.incarnation.id
    life = rf"mini cluster {spec.name} as brought up at {re.escape(first.incarnation.up_at)}, removed at \S+"
    said = {
        fetched_job: rf"job 1 ran on {life}; its results were fetched to runs/local/1",
        kept_job: rf"job 2 ran on {life}; its results were never fetched and went with it",
    }
    for job, line in said.items():
        for command in ("status", "logs", "fetch", "report", "cancel"):
            if (command, job) == ("logs", fetched_job):
                continue  # its log came home with its results: below
            done = invoke(setup, command, "-j", job)
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert re.fullmatch(rf"error: {line}", done.stderr.splitlines()[0]), (command, done.stderr)
    # The fetched job's log is read from the copy its fetch brought home, and said to be.
    fetched_log = list((project / "runs" / "local" / "1").glob("*.out"))
    assert len(fetched_log) == 1, old_results
    shown = invoke(setup, "logs", "-j", fetched_job)
    assert shown.returncode == 0, shown.stderr
    assert re.fullmatch(rf"hpcbox: {said[fetched_job]}; its log as fetched there:", shown.stderr.strip())
    assert re.search(SCRIPT_STARTED, shown.stdout, re.M) and shown.stdout == fetched_log[0].read_text()
    listed = invoke(setup, "jobs")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert len(rows) == 2 and all(
        re.search(line, row) for row, line in zip(rows, said.values(), strict=True)
    ), rows

    # The new cluster's job 1: its own record and run folder; the old ones as they were.
    new_job, told = submitted(setup)
    assert new_job == "1"
    assert re.search(
        rf"^hpcbox: job 1's results go to runs/local/1-2 here: an earlier {said['1']}$", told, re.M
    ), told
    completed(setup, new_job)
    fetch = invoke(setup, "fetch", "-j", new_job)
    assert fetch.returncode == 0, fetch.stderr
    assert fetch.stdout.strip() == str(project / "runs" / "local" / "1-2")
    assert "metrics.jsonl" in tree(project / "runs" / "local" / "1-2")
    assert tree(project / "runs" / "local" / "1") == old_results
    assert {name: digest for name, digest in tree(ledger).items() if name in old_records} == old_records
    assert sorted(set(tree(ledger)) - set(old_records)) == ["local-1-2.json", "local-1-2.sh"]
    status = invoke(setup, "status", "-j", new_job)
    assert status.returncode == 0 and status.stdout.startswith("job 1: COMPLETED"), status.stderr
    # By its run's name, the new job 1 is `1-2`, and the old one's line is still its own.
    assert invoke(setup, "status", "-j", "1-2").stdout == status.stdout
    listed = invoke(setup, "jobs").stdout.splitlines()
    assert re.search(said[fetched_job], listed[0]) and "job 1: COMPLETED" in listed[2], listed
    forced = invoke(setup, "cluster.down", f"--name={spec.name}")
    assert forced.returncode == 0, forced.stderr  # its one job's results fetched: nothing to lose


def test_a_cluster_whose_containers_stopped_comes_back_with_its_jobs_and_results(
    setup: Setup, spec, minicluster_state, docker_engine
):
    """The machine restarted and stopped the cluster's containers: `cluster.up` replaced it, and the
    results of its jobs never fetched went with it (`cluster.down` refuses exactly that). Now `cluster.up`
    starts the same containers again, Slurm's state, accounting and run folders as they were, even when
    asked for other settings: the replacement is then refused while a job's results were never fetched,
    and the fetch it points to reaches them. The cluster
    goes at the end, whatever happened: the module's later tests start from a cluster of their own."""
    from hpcbox import minicluster as mc

    try:
        stopped_and_started_again(setup, spec, minicluster_state, docker_engine)
    finally:
        mc.down(spec.name, minicluster_state)


def stopped_and_started_again(setup: Setup, spec, minicluster_state, docker_engine) -> None:
    from hpcbox import minicluster as mc

    project = setup.project().root
    cluster = mc.up(spec, minicluster_state)
    job, _ = submitted(setup)
    run = run_of(setup, job)  # `<id>-<n>` after the test above made the cluster again
    completed(setup, run)
    label = {"label": f"io.hpcbox.minicluster={spec.name}"}
    made = {c.name: c.id for c in docker_engine.containers.list(all=True, filters=label)}
    # The controller stopped as Docker stops a container when the machine shuts down (TERM: slurmctld
    # saves its state), the others killed. A slurmctld killed outright forgets the changes of its last
    # seconds, as at any site (a job that had just ended comes back RUNNING: a full run saw it).
    cluster.node_container("controller").stop(timeout=30)
    for container in docker_engine.containers.list(filters=label):
        container.kill()
    for container in docker_engine.containers.list(all=True, filters=label):
        container.wait(timeout=60)

    down = invoke(setup, "cluster.status", f"--name={spec.name}")
    assert down.returncode == 1
    assert down.stderr.splitlines()[0] == (
        f"error: cluster {spec.name} is not up: its accounting, controller, node1, login containers are not "
        "running"
    ), down.stderr
    unreachable = invoke(setup, "status", "-j", run)
    assert unreachable.returncode == 1
    hinted = re.search(r"`(hpcbox cluster\.up [^`]*)` starts its containers again", unreachable.stderr)
    assert hinted, unreachable.stderr
    start_again = shlex.split(hinted.group(1))[1:]
    assert start_again == ["cluster.up", f"--name={spec.name}", "--nodes=1", f"--port={spec.port}"]

    # Other settings asked of the stopped cluster: it is started again (its own containers, its own
    # Slurm) before the replacement is refused, so the fetch the refusal sends the user to can reach it
    # (it could not: the hint led back here, and only --force, losing the results, got out).
    other = invoke(setup, "cluster.up", f"--name={spec.name}", f"--port={spec.port}", "--nodes=2")
    assert other.returncode == 1
    assert other.stdout.splitlines() == [
        f"cluster {spec.name} differs (nodes 1 -> 2): started again before it is replaced, so that what it "
        "holds can be asked for and fetched",
        f"cluster {spec.name}: starting its stopped containers again (accounting, controller, node1, login), "
        "its jobs kept",
    ], other.stdout
    assert other.stderr.splitlines() == [
        f"error: cluster {spec.name} holds the results of job {run} of {project}, never fetched: "
        "replacing it (nodes 1 -> 2) loses them",
        f"  hint: fetch them first (`hpcbox fetch -j {run}` in {project}), or pass --force",
    ]
    assert {c.name: c.id for c in docker_engine.containers.list(filters=label)} == made
    assert mc.find(spec.name, minicluster_state).incarnation == cluster.incarnation
    fetch = invoke(setup, "fetch", "-j", run)  # as the refusal says
    assert fetch.returncode == 0, fetch.stderr
    assert "metrics.jsonl" in tree(Path(fetch.stdout.strip()))

    again = invoke(setup, *start_again)  # as `status`'s hint said, with the cluster's own settings
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"cluster {spec.name} is already up\n"), again.stdout
    status = invoke(setup, "status", "-j", run)
    assert status.stdout.startswith(f"job {job}: COMPLETED"), status.stdout + status.stderr
    # Slurm's own state came back too: it goes on numbering jobs after the last one.
    after, _ = submitted(setup)
    assert int(after) == int(job) + 1, (job, after)
    completed(setup, run_of(setup, after))


def run_of(setup: Setup, job_id: str) -> str:
    """The run of the last job ``job_id`` submitted from the project (as `-j` takes it)."""
    from hpcbox.ledger import Ledger

    return Ledger(setup.project()).find(job_id).run


def final_epoch(project: Path, run: str) -> dict[str, object]:
    """The last epoch's figures in a fetched run's metrics.jsonl."""
    lines = (project / "runs" / "local" / run / "metrics.jsonl").read_text().splitlines()
    epochs = [json.loads(line) for line in lines if '"event": "epoch"' in line]
    return {
        name: epochs[-1][name]
        for name in ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy")
    }


def test_a_cancelled_job_resumed_from_ends_with_the_figures_of_a_run_never_stopped(
    setup: Setup, spec, minicluster_state
):
    """Issue 59: the report said "rerun to resume", and the rerun started again at epoch 1. `submit
    --resume-from JOB` starts from JOB's last checkpoint, copied on the cluster (nothing sent again),
    with its arguments; the report of a cancelled job gives exactly that command."""
    from hpcbox import minicluster as mc

    mc.up(spec, minicluster_state)
    project = setup.project().root
    training = (
        "--epochs",
        "8",
        "--steps-per-epoch",
        "10",
        "--workers",
        "0",
        "--seed",
        "3",
        "--step-pause",
        "0.1",
    )
    base = ["submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10"]
    stopped, whole = (
        invoke(setup, *base, f"--job-name={name}", "--", *training) for name in ("stopped", "whole")
    )
    assert stopped.returncode == whole.returncode == 0, stopped.stderr + whole.stderr
    # Each job's run: its id, or `<id>-<n>` on this cluster made again after the test above.
    stopped_id, whole_id = (run_of(setup, done.stdout.split()[-1]) for done in (stopped, whole))
    # Followed until its second epoch, then Ctrl-C: following stops, the job goes on.
    follower = subprocess.Popen(
        [sys.executable, "-m", "hpcbox", "logs", "-j", stopped_id, "--follow"], cwd=setup.project_dir,
        env={**os.environ, **setup.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    assert follower.stdout is not None
    seen = next((line for line in iter(follower.stdout.readline, "") if '"epoch": 2,' in line), "")
    follower.send_signal(signal.SIGINT)
    _, interrupted = follower.communicate(timeout=60)
    assert seen and follower.returncode == 130, interrupted
    assert interrupted.splitlines()[-1] == (
        f"hpcbox: stopped following job {stopped_id}; it goes on (`hpcbox logs -j {stopped_id} --follow` "
        "follows it again)"
    )
    cancelled = invoke(setup, "cancel", "-j", stopped_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    report = invoke(setup, "report", "-j", stopped_id)
    assert report.returncode == 0, report.stderr
    assert ": CANCELLED by researcher" in report.stdout.splitlines()[0], report.stdout  # a name, not a uid
    advice = re.search(r"resume from its last checkpoint: `([^`]+)`", report.stdout)
    assert advice, report.stdout
    command = shlex.split(advice[1])
    assert (
        command[:4] == ["hpcbox", "submit", "--cluster=local", "--resume-from"] and command[4] == stopped_id
    )
    assert re.fullmatch(r"--time=\d\d:\d\d:\d\d", command[5]) and len(command) == 6, command

    resumed = invoke(setup, *command[1:], f"--data={setup.data}", "--flavour=cpu", "--offline")
    assert resumed.returncode == 0, resumed.stderr
    assert f"hpcbox: resuming job {stopped_id} with its arguments: {shlex.join(training)}" in resumed.stderr
    # Its resource options too, each given now taken instead.
    assert (
        f"hpcbox: with job {stopped_id}'s resource options --job-name=stopped, and {command[5]} given now\n"
    ) in resumed.stderr
    assert "sent 0 bytes (nothing new)" in resumed.stderr  # its checkpoints were copied there, not sent
    resumed_id = run_of(setup, resumed.stdout.split()[-1])
    for job in (resumed_id, whole_id):
        completed(setup, job)
        assert invoke(setup, "fetch", "-j", job).returncode == 0
    log = (project / "runs" / "local" / resumed_id / "metrics.jsonl").read_text()
    starts = [json.loads(line) for line in log.splitlines() if '"event": "start"' in line]
    assert [bool(start["resumed"]) for start in starts] == [False, True], log
    assert final_epoch(project, resumed_id) == final_epoch(project, whole_id)
    assert final_epoch(project, resumed_id)["epoch"] == 8
    ledger = json.loads((project / ".hpcbox" / "jobs" / f"local-{resumed_id}.json").read_text())
    assert ledger["resumes"] == stopped_id and ledger["resources"]["job_name"] == "stopped"


def test_a_sweep_whose_cluster_was_made_again_reruns_exactly_its_failed_points(
    setup: Setup, project_setup: Setup, spec, minicluster_state, tmp_path: Path, run_id: str
):
    """Issue 59: `--resubmit-failed` on a sweep Slurm no longer knew said "every task completed" and
    reran nothing. Each point's run folder keeps its exit status; with its cluster made again, the
    fetched results tell which points failed, and exactly those run again."""
    from hpcbox import minicluster as mc

    project_dir = sweep_project(project_setup, tmp_path / "sweep")
    gate = f"/home/researcher/{run_id}-gate"
    gated = (1, 3)
    points = "".join(
        f"[[points]]\nindex = {n}\n" + (f'needs = "{gate}"\n' if n in gated else "") for n in range(4)
    )
    (project_dir / "sweep.toml").write_text(points)
    swept = Setup(project_dir, setup.data, setup.sif_cache, setup.env)
    mc.up(spec, minicluster_state)
    first = invoke(
        swept, "submit", "--cluster=local", f"--data={setup.data}", "--time=5", "--sweep=sweep.toml"
    )
    assert first.returncode == 0, first.stderr
    sweep = run_of(swept, first.stdout.split()[-1])
    followed = invoke(swept, "logs", "-j", sweep, "--follow")
    assert followed.returncode == 0, followed.stderr
    status = invoke(swept, "status", "-j", sweep).stdout.splitlines()
    assert status[0].endswith(": 4 array tasks: 2 COMPLETED, 2 FAILED"), status
    # A task by its id, wherever a job id goes (`status` names them so): its own state, log and report.
    job_id = sweep.split("-")[0]
    task = invoke(swept, "status", "-j", f"{sweep}_1")
    assert task.stdout.startswith(f"job {job_id}_1: FAILED"), task.stdout + task.stderr
    log = invoke(swept, "logs", "-j", f"{sweep}_1")
    assert f"{gate} is not there yet" in log.stdout
    # Its program failed at its start, its results copied back whole: the log ends saying so and no more
    # (every such job's log ended "hpcbox: copying results to ... failed", which was not so).
    said = [line for line in log.stdout.splitlines() if line.startswith("hpcbox: ")]
    assert said[-1] == "hpcbox: the trainer exited with status 1", log.stdout
    assert "is not there yet" not in invoke(swept, "logs", "-j", f"{sweep}_0").stdout
    report = invoke(swept, "report", "-j", sweep)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"sweep {job_id}: 4 points: 2 COMPLETED, 2 FAILED", report.stdout
    assert [line.split(":")[0] for line in lines[1:5]] == [
        "  task 0 (--index 0)", f"  task 1 (--index 1 --needs {gate})", "  task 2 (--index 2)",
        f"  task 3 (--index 3 --needs {gate})",
    ]  # fmt: skip
    assert lines[2].split(": ")[1].startswith("FAILED") and lines[1].split(": ")[1].startswith("COMPLETED")
    point = invoke(swept, "report", "-j", f"{sweep}_1")
    assert point.returncode == 0 and point.stdout.startswith(f"job {job_id}_1 "), point.stdout + point.stderr
    assert invoke(swept, "fetch", "-j", sweep).returncode == 0
    removed = invoke(swept, "cluster.down", f"--name={spec.name}")  # every result fetched: not refused
    assert removed.returncode == 0, removed.stderr

    again = mc.up(spec, minicluster_state)
    again.ssh(["touch", gate], check=True)
    rerun = invoke(
        swept, "submit", "--cluster=local", f"--data={setup.data}", "--time=5", f"--resubmit-failed={sweep}"
    )
    assert rerun.returncode == 0, rerun.stderr
    life = rf"job {re.escape(sweep)} ran on mini cluster {spec.name} as brought up at \S+, removed at \S+"
    read = rf"{life}; its results were fetched to runs/local/{re.escape(sweep)}: which points failed is read"
    assert re.search(
        rf"^hpcbox: {read} from its results fetched to runs/local/{re.escape(sweep)}$", rerun.stderr, re.M
    )
    assert f"2 of 4 tasks of job {sweep.split('-')[0]} again: 1,3" in rerun.stderr, rerun.stderr
    second = run_of(swept, rerun.stdout.split()[-1])
    followed = invoke(swept, "status", "-j", second, "--follow")  # its tasks' lines now and at their end
    assert followed.returncode == 0, followed.stderr
    status = invoke(swept, "status", "-j", second).stdout.splitlines()
    assert status[0].endswith(": 2 array tasks: 2 COMPLETED"), status
    assert followed.stdout.splitlines()[-len(status) :] == status, followed.stdout
    fetched = Path(invoke(swept, "fetch", "-j", second).stdout.strip())
    assert sorted(int(found.parent.name) for found in fetched.glob("*/point.json")) == [1, 3]


def controller_rebuilt(cluster) -> None:
    """Slurm's controller started again without its saved state, as a site rebuilds one: it numbers
    jobs from FirstJobId again while accounting keeps every job it had (as after MaxJobId, too). It is
    frozen before its state goes, so it saves none on its way out, then killed: the container stops."""
    controller = cluster.node_container("controller")
    controller.exec_run(
        [
            "sh",
            "-c",
            'p=$(pidof slurmctld) && kill -STOP "$p" && rm -rf /var/lib/slurm/slurmctld/* && kill -KILL "$p"',
        ]
    )
    controller.wait(timeout=60)
    controller.start()


def remote_files(cluster, folder: str) -> str:
    """Every file under ``folder`` on the cluster, with its sha256."""
    listed = cluster.ssh(
        f"cd {shlex.quote(folder)} && find . -type f -exec sha256sum {{}} + | sort", check=True
    )
    return listed.stdout


def test_an_id_slurm_gives_again_is_never_taken_for_the_earlier_job(setup: Setup, spec, minicluster_state):
    """Issue 59 at a real site: the same cluster, its controller rebuilt, gives job 1 again while
    accounting keeps the earlier job 1. What hpcbox says and does about the earlier job is about it
    alone (its batch script tells them apart), and a later job 1 neither resumes from nor writes into
    the earlier one's run folder."""
    from hpcbox import minicluster as mc
    from hpcbox.ledger import Ledger

    mc.down(spec.name, minicluster_state)
    cluster = mc.up(spec, minicluster_state)
    job, _ = submitted(setup)
    assert job == "1"  # a fresh cluster's first
    earlier = run_of(setup, job)
    earlier = (
        earlier if "-" in earlier else f"{earlier}-1"
    )  # the first job 1's run, once later ones have theirs
    completed(setup, earlier)
    run_dir = Ledger(setup.project()).find(earlier).run_dir
    kept = remote_files(cluster, run_dir)
    assert "metrics.jsonl" in kept

    controller_rebuilt(cluster)
    refused_job, _ = submitted(setup)
    assert refused_job == "1"
    refused = run_of(setup, refused_job)
    followed = invoke(setup, "logs", "-j", refused, "--follow")
    said = [line for line in followed.stdout.splitlines() if line.startswith("hpcbox: ")]
    assert (
        f"hpcbox: {run_dir} holds the results of an earlier job 1 (Slurm gave its id again): they are "
        "left as they are, and this job stops; move that folder aside and submit again" in said
    ), followed.stdout
    assert remote_files(cluster, run_dir) == kept
    assert invoke(setup, "status", "-j", refused).stdout.startswith("job 1: FAILED")
    assert invoke(setup, "status", "-j", earlier).stdout.startswith("job 1: COMPLETED")

    # Once more, with the earlier folder moved aside as the job said: the later job 1 runs, and
    # cancelling the earlier job 1 cancels nothing of it.
    controller_rebuilt(cluster)
    cluster.ssh(["mv", run_dir, f"{run_dir}.earlier"], check=True)
    running = invoke(
        setup, "submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10",
        "--", *RESTING,
    )  # fmt: skip
    assert running.returncode == 0 and running.stdout.split()[-1] == "1", running.stderr
    later = run_of(setup, "1")
    assert len({earlier, refused, later}) == 3
    cancelled = invoke(setup, "cancel", "-j", earlier)
    assert cancelled.stderr.strip() == "hpcbox: job 1 has already ended: COMPLETED", cancelled.stderr
    assert cancelled.stdout.startswith("job 1: COMPLETED"), cancelled.stdout
    report = invoke(setup, "report", "-j", earlier)
    assert report.returncode == 0 and "COMPLETED" in report.stdout, report.stderr
    assert invoke(setup, "status", "-j", refused).stdout.startswith("job 1: FAILED")
    still = invoke(setup, "status", "-j", later)
    assert re.match(r"job 1: (PENDING|RUNNING)", still.stdout), still.stdout + still.stderr
    stopped = invoke(setup, "cancel", "-j", later)
    assert stopped.returncode == 0 and "CANCELLED" in stopped.stdout, stopped.stdout + stopped.stderr
