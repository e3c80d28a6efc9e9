"""Rendered job scripts on the mini cluster: real sbatch, slurmd, Apptainer and the trainer's SIF.

The `local` script is submitted the way a user would (over SSH, from the job's directory on the shared
/home) and runs `python -m hpctrain train` inside the trainer SIF on a compute node. After success, a
failing trainer, and `scancel`, the job's node scratch is gone and its results are on shared storage.
Every other profile's script meets a cluster shaped like its site in test_rehearsal.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbox.minicluster.spec import USER
from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand
from hpcbox.render import profiles
from hpcbox.render.resources import ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, JobScript, render_sbatch
from hpcbox.tools import slurm, ssh
from tests.fixtures.submitting import RESTING, TEN_RESTING_STEPS

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
HOME = "/home/researcher"
# The mini cluster's accounting knows one account; sites that require one get it.
ACCOUNT = "research"
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
NASTY_NAME = 'digits "quoted" #1 \\ it\'s $HOME'
TRAIN_ARGS = ("--epochs", "1", "--device", "cpu", "--workers", "0", "--steps-per-epoch", "5")
CPU_ONLY = ("--device", "cpu", "--workers", "0")


@dataclasses.dataclass(frozen=True)
class JobDir:
    """The job's directory on the cluster's shared /home, holding what `ship` would put there."""

    cluster: object
    path: str

    def sh(self, command: str, *, check: bool = True):
        return self.cluster.ssh(f"cd {shlex.quote(self.path)} && {command}", check=check)

    def submit(self, script: JobScript, name: str) -> str:
        text = shlex.quote(script.text)
        dirs = " ".join(shlex.quote(d) for d in script.directories_to_create(USER))
        done = self.sh(f"mkdir -p {dirs} && printf %s {text} > {name} && sbatch --parsable {name}")
        job_id = done.stdout.strip().split(";")[0]
        assert job_id.isdigit(), done
        return job_id


def sacct(cluster, job_id: str, fields: str) -> list[str]:
    out = cluster.ssh(["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", f"--format={fields}"]).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1].split("|") if lines else []


def wait_finished(cluster, job_id: str, timeout_s: float = 300) -> tuple[str, str]:
    """The job's final state and exit code from accounting, once the controller no longer runs or queues
    it: a job requeued after its node died has its first run's NODE_FAIL line in accounting while the
    controller already holds it PENDING, before slurmdbd has its next run's line (seen on CI)."""
    deadline = time.monotonic() + timeout_s
    row: list[str] = []
    while time.monotonic() < deadline:
        if not still_held(cluster, job_id):
            row = sacct(cluster, job_id, "State,ExitCode")
            if row and row[0].split()[0] in FINISHED:
                return row[0].split()[0], row[1]
        time.sleep(2)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s}s: {row}")


def still_held(cluster, job_id: str) -> bool:
    """Whether the controller still queues or runs the job, or cannot say (squeue failed)."""
    queued = cluster.ssh(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T"])
    if queued.returncode != 0:
        return "Invalid job id" not in queued.stderr  # gone from the controller's memory: finished
    state = queued.stdout.strip()
    return bool(state) and state.split()[0] not in slurm.FINISHED_STATES


def scratch_left(cluster, job_id: str) -> list[str]:
    """Job scratch directories still present on any compute node."""
    left = []
    for host in cluster.spec.compute_hosts:
        done = cluster.ask(host, ["sh", "-c", f"ls -d /disk/scratch/*/hpcbox-{job_id} 2>/dev/null || true"])
        left += [f"{host}:{line}" for line in done.stdout.split()]
    return left


def wait_scratch_gone(cluster, job_id: str, log: Callable[[], str] = lambda: "") -> None:
    """The exit trap (and on other nodes the janitor step) may finish after Slurm has marked the job.
    ``log`` reads the job's log, for the message where scratch stays."""
    deadline = time.monotonic() + 30
    while left := scratch_left(cluster, job_id):
        assert time.monotonic() < deadline, f"{left}\n{log()}"
        time.sleep(1)


def local_profile() -> profiles.ClusterProfile:
    return profiles.load_profile("local")


def render_local(
    request: ResourceRequest, args: tuple[str, ...] = (), command: ContainerCommand = EXAMPLE_TRAINER
) -> JobScript:
    profile = local_profile()
    checked = resolve(profile, request, ddp=command.ddp)
    return render_sbatch(profile, checked, JobInputs.defaults("trainer"), args, command)


@pytest.fixture(scope="module")
def job_dir(minicluster, trainer_sif, run_id) -> JobDir:
    return prepare_job_dir(minicluster, trainer_sif, run_id)


def prepare_job_dir(cluster, trainer_sif, run_id: str) -> JobDir:
    """SIF, code snapshot and dataset archive in ~/hpcbox/<run>/ on the cluster's shared /home."""
    target: ssh.Target = cluster.ssh_target()
    path = f"{HOME}/hpcbox/{run_id}"
    cluster.ssh(["mkdir", "-p", f"{path}/images", f"{path}/code", f"{path}/data"], check=True)
    ssh.copy_to(target, [Path(trainer_sif.path)], f"{path}/images/")
    cluster.ssh(
        ["mv", f"{path}/images/{Path(trainer_sif.path).name}", f"{path}/images/trainer.sif"], check=True
    )
    ssh.copy_to(target, [REPO / "src" / "hpctrain"], f"{path}/code/")
    # The dataset archive is made where it is used: inside the SIF, on a compute node.
    make_data = (
        f"cd {path} && srun --partition=cpu apptainer exec --bind {path}/code:/code:ro "
        "--env PYTHONPATH=/code images/trainer.sif python -m hpctrain make-data --out data/trainer.tar"
    )
    cluster.ssh(make_data, check=True)
    return JobDir(cluster, path)


def test_local_script_runs_the_trainer_in_apptainer_and_cleans_up(job_dir: JobDir):
    script = render_local(
        ResourceRequest(job_name=NASTY_NAME, partition="gpu", gpus=1, time="10"), TRAIN_ARGS
    )
    job_id = job_dir.submit(script, "ok.sh")
    state, exit_code = wait_finished(job_dir.cluster, job_id)
    log = job_dir.sh(f"cat logs/*-{job_id}.out", check=False).stdout
    assert (state, exit_code) == ("COMPLETED", "0:0"), log
    # sbatch read the quoted name exactly (asked of the controller: accounting stores " as `).
    shown = job_dir.cluster.ssh(["scontrol", "--oneliner", "show", "job", job_id], check=True).stdout
    assert shown.split("JobName=", 1)[1].split(" UserId=", 1)[0] == NASTY_NAME
    metrics = job_dir.sh(f"cat runs/{job_id}/metrics.jsonl").stdout
    assert metrics.strip(), log
    assert job_dir.sh(f"ls runs/{job_id}/checkpoints").stdout.strip()
    assert "the trainer exited with status 0" in log
    assert scratch_left(job_dir.cluster, job_id) == []


def test_a_finished_job_slurm_requeues_does_not_run_again_and_keeps_its_results(job_dir: JobDir):
    """Preemption's grace-time trap, by the requeue Slurm does then: a finished job started again
    (`scontrol requeue` takes one, as a preemption in its last seconds does) keeps what it wrote."""
    job_id = job_dir.submit(render_local(ResourceRequest(job_name="once", time="10"), TRAIN_ARGS), "once.sh")
    assert wait_finished(job_dir.cluster, job_id) == ("COMPLETED", "0:0")
    metrics = job_dir.sh(f"cat runs/{job_id}/metrics.jsonl").stdout
    job_dir.cluster.ssh(["scontrol", "requeue", job_id], check=True)
    # Its second run's line in accounting, not the first's: wait for the restart, then for its end.
    deadline = time.monotonic() + 120
    while sacct(job_dir.cluster, job_id, "Restarts")[:1] in ([], ["0"]):
        assert time.monotonic() < deadline, f"job {job_id} was never started again"
        time.sleep(1)
    assert wait_finished(job_dir.cluster, job_id) == ("COMPLETED", "0:0")
    log = job_dir.sh(f"cat logs/*-{job_id}.out", check=False).stdout
    assert f"hpcbox: job {job_id} finished in an earlier run (exit status 0): it is not run again" in log, log
    assert job_dir.sh(f"cat runs/{job_id}/metrics.jsonl").stdout == metrics
    assert scratch_left(job_dir.cluster, job_id) == []


def test_failing_trainer_leaves_no_scratch_and_keeps_its_log(job_dir: JobDir):
    script = render_local(ResourceRequest(job_name="fails"), ("--model", "no-such-model"))
    job_id = job_dir.submit(script, "fail.sh")
    state, exit_code = wait_finished(job_dir.cluster, job_id)
    log = job_dir.sh(f"cat logs/fails-{job_id}.out").stdout
    assert (state, exit_code) == ("FAILED", "2:0"), log
    assert "no-such-model" in log
    assert job_dir.sh(f"test -d runs/{job_id} && echo copied").stdout.strip() == "copied"
    assert scratch_left(job_dir.cluster, job_id) == []


def test_a_program_given_gpus_its_pytorch_cannot_use_does_not_start(job_dir: JobDir):
    """A program of one's own (not the example trainer, which checks for itself) in the cpu SIF: given a
    GPU, the job script's check stops it before it starts; without one, the same program runs."""
    program = ContainerCommand("program", "touch", ("{output_dir}/program-ran",), launcher="srun")
    given = job_dir.submit(
        render_local(ResourceRequest(job_name="gpu-check", partition="gpu", gpus=1), command=program), "g.sh"
    )
    cpu_only = job_dir.submit(render_local(ResourceRequest(job_name="no-gpu"), command=program), "n.sh")
    state, exit_code = wait_finished(job_dir.cluster, given)
    log = job_dir.sh(f"cat logs/gpu-check-{given}.out").stdout
    assert (state, exit_code) == ("FAILED", "1:0"), log
    stops = [line for line in log.splitlines() if line.startswith("hpcbox: this job was given")]
    assert len(stops) == 1 and "1 GPU, but its PyTorch (" in stops[0] and "is a CPU build" in stops[0], log
    assert "so it does not start; submit it in the cuda flavour" in stops[0]
    assert job_dir.sh(f"test -e runs/{given}/program-ran || echo absent").stdout.strip() == "absent"
    assert wait_finished(job_dir.cluster, cpu_only) == ("COMPLETED", "0:0")
    assert job_dir.sh(f"test -e runs/{cpu_only}/program-ran && echo ran").stdout.strip() == "ran"
    assert scratch_left(job_dir.cluster, given) == []


def test_scancel_copies_back_what_the_trainer_wrote_and_cleans_up(job_dir: JobDir):
    """Cancelled after its first checkpoint: the checkpoint and metrics reach shared storage.

    (Slurm's TERM on scancel also reaches Apptainer's FUSE daemon, so a trainer cannot count on writing
    one more checkpoint then; the time limit's USR1 goes to the batch shell alone and is forwarded.)
    """
    script = render_local(ResourceRequest(job_name="cancelled"), (*RESTING, "--device", "cpu"))
    job_id = job_dir.submit(script, "cancel.sh")
    cluster = job_dir.cluster
    deadline = time.monotonic() + 180
    probe = ["sh", "-c", f"ls /disk/scratch/*/hpcbox-{job_id}/out/checkpoints/ 2>/dev/null"]
    while not any(cluster.ask(host, probe).stdout.strip() for host in cluster.spec.compute_hosts):
        assert time.monotonic() < deadline, job_dir.sh(f"cat logs/cancelled-{job_id}.out", check=False).stdout
        time.sleep(1)
    cluster.ssh(["scancel", job_id], check=True)
    state, _ = wait_finished(cluster, job_id)
    assert state == "CANCELLED"
    wait_scratch_gone(cluster, job_id)
    log = job_dir.sh(f"cat logs/cancelled-{job_id}.out").stdout
    assert job_dir.sh(f"cat runs/{job_id}/metrics.jsonl", check=False).stdout.strip(), log
    assert job_dir.sh(f"ls runs/{job_id}/checkpoints", check=False).stdout.strip(), log
    assert "requeueing" not in log


def test_a_program_that_is_not_ddp_runs_once_per_task_with_stderr_apart(job_dir: JobDir):
    """launcher = "srun": Slurm's tasks, each in its own container and told its place; its own logs."""
    each_task = (
        'echo "task $SLURM_PROCID of $SLURM_NTASKS" >{output_dir}/task-$SLURM_PROCID; '
        'echo "err $SLURM_PROCID" >&2'
    )
    command = ContainerCommand("program", "bash", ("-c", each_task), launcher="srun")
    request = ResourceRequest(job_name="tasks", partition="cpu", ntasks_per_node=2, time="5",
                              log="tasklogs/%x/%j.out", error_log="tasklogs/%x/%j.err")  # fmt: skip
    script = render_local(request, command=command)
    job_id = job_dir.submit(script, "tasks.sh")
    state, exit_code = wait_finished(job_dir.cluster, job_id)
    out = job_dir.sh(f"cat tasklogs/tasks/{job_id}.out", check=False).stdout
    err = job_dir.sh(f"cat tasklogs/tasks/{job_id}.err", check=False).stdout
    assert (state, exit_code) == ("COMPLETED", "0:0"), out + err
    assert job_dir.sh(f"cat runs/{job_id}/task-0 runs/{job_id}/task-1").stdout == "task 0 of 2\ntask 1 of 2\n"
    assert sorted(line for line in err.splitlines() if line.startswith("err ")) == ["err 0", "err 1"], err
    assert "the trainer exited with status 0" in err
    assert scratch_left(job_dir.cluster, job_id) == []


# torchrun and its trainer peak near 550 MB a node, past the 500M a CPU Slurm gives by default here.
TWO_NODES = dict(partition="cpu", nodes=2, ntasks_per_node=1, mem="1G")


def metric_events(job_dir: JobDir, job_id: str, kind: str) -> list[dict]:
    lines = job_dir.sh(f"cat runs/{job_id}/metrics.jsonl").stdout.splitlines()
    return [record for record in map(json.loads, filter(None, lines)) if record["event"] == kind]


def test_two_nodes_train_one_ddp_run_in_apptainer(job_dir: JobDir):
    """2 nodes x 1 task: one torchrun per node, gloo across the nodes, ranks end with the same weights."""
    script = render_local(ResourceRequest(job_name="ddp", time="10", **TWO_NODES), TRAIN_ARGS)
    job_id = job_dir.submit(script, "ddp.sh")
    state, exit_code = wait_finished(job_dir.cluster, job_id)
    log = job_dir.sh(f"cat logs/ddp-{job_id}.out", check=False).stdout
    assert (state, exit_code) == ("COMPLETED", "0:0"), log
    assert sacct(job_dir.cluster, job_id, "NodeList") == ["node[1-2]"]
    start = metric_events(job_dir, job_id, "start")[-1]
    assert start["world_size"] == 2 and start["host"] == "node1", start  # rank 0 on the batch node
    done = metric_events(job_dir, job_id, "done")[-1]
    assert done["rank_weights_sha256"] == [done["weights_sha256"]] * 2, done
    assert job_dir.sh(f"ls runs/{job_id}/checkpoints").stdout.strip()
    assert scratch_left(job_dir.cluster, job_id) == [], log


def test_with_sif_on_scratch_each_node_runs_its_own_copy_of_the_sif(job_dir: JobDir):
    """Two nodes: each copies the SIF to its own scratch once, and its task runs that copy."""
    each_task = 'echo "task $SLURM_PROCID on $(hostname) runs $APPTAINER_CONTAINER"'
    command = ContainerCommand("program", "bash", ("-c", each_task), launcher="srun")
    request = ResourceRequest(job_name="sif-copy", time="5", sif_on_scratch=True, **TWO_NODES)
    script = render_local(request, command=command)
    job_id = job_dir.submit(script, "sif-copy.sh")
    state, exit_code = wait_finished(job_dir.cluster, job_id)
    log = job_dir.sh(f"cat logs/sif-copy-{job_id}.out", check=False).stdout
    assert (state, exit_code) == ("COMPLETED", "0:0"), log
    ran = sorted(line for line in log.splitlines() if line.startswith("task "))
    copy = rf"/disk/scratch/[^/]+/hpcbox-{job_id}/sif/trainer[.]sif"
    assert len(ran) == 2 and re.fullmatch(rf"task 0 on node1 runs {copy}", ran[0]), log
    assert re.fullmatch(rf"task 1 on node2 runs {copy}", ran[1]), log
    assert scratch_left(job_dir.cluster, job_id) == [], log


def test_a_job_stopped_by_its_time_limit_signal_is_requeued_and_completes_as_if_never_stopped(
    job_dir: JobDir,
):
    """The time limit's USR1 to the batch shell mid-training (sent by scancel as Slurm sends it at
    --signal=B:USR1@60, so that when it comes does not hang on this machine's speed; Slurm's own timer
    sends it in the tests below): the trainer checkpoints, the job requeues itself, the next run
    resumes and runs to COMPLETED, and its final figures are those of the same job never stopped."""
    # About 3.5 s an epoch of ten steps, nearly all of it at rest (the CPU it takes is the other lanes'):
    # the signal after the second leaves a minute of training to cut short (with 30 epochs of 1.2 s, the
    # polling over SSH was once slower than the rest of the job under the suite's lanes).
    training = ("--epochs", "20", *TEN_RESTING_STEPS, "--seed", "3", *CPU_ONLY)
    stopped = job_dir.submit(render_local(ResourceRequest(job_name="stopped", time="10"), training), "s.sh")
    whole = job_dir.submit(render_local(ResourceRequest(job_name="whole", time="10"), training), "w.sh")
    deadline = time.monotonic() + 240
    log = ""
    while '"epoch": 2,' not in log:
        assert time.monotonic() < deadline, log
        time.sleep(1)
        log = job_dir.sh(f"cat logs/stopped-{stopped}.out", check=False).stdout
    job_dir.cluster.ssh(["scancel", "--signal=USR1", "--batch", stopped], check=True)
    assert wait_finished(job_dir.cluster, stopped, timeout_s=400) == ("COMPLETED", "0:0")
    assert wait_finished(job_dir.cluster, whole, timeout_s=400) == ("COMPLETED", "0:0")
    log = job_dir.sh(f"cat logs/stopped-{stopped}.out").stdout
    assert f"requeueing job {stopped}" in log, log
    assert sacct(job_dir.cluster, stopped, "Restarts") == ["1"]
    starts = [json.loads(line) for line in log.splitlines() if line.startswith('{"event": "start"')]
    assert [bool(start["resumed"]) for start in starts] == [False, True], log
    assert metric_events(job_dir, stopped, "preempted")[0]["epoch"] < 20, log  # cut short, then resumed
    figures = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy")
    final = [
        {name: metric_events(job_dir, job, "epoch")[-1][name] for name in figures} for job in (stopped, whole)
    ]
    assert final[0] == final[1] and final[0]["epoch"] == 20, final
    wait_scratch_gone(job_dir.cluster, stopped)


@pytest.fixture(scope="module")
def time_driven_jobs(job_dir: JobDir) -> dict[str, str]:
    """The jobs that wait for their time limit, submitted together so that their minutes overlap (the
    test cluster's third CPU per node makes room for all four): job name → job id."""
    training = (*RESTING, "--device", "cpu")
    limited = render_local(ResourceRequest(job_name="limited", time="2"), training)
    ddp_limited = render_local(ResourceRequest(job_name="ddp-limited", time="2", **TWO_NODES), training)
    each_task = 'trap "" USR1; echo "task $SLURM_PROCID" >{output_dir}/task-$SLURM_PROCID; exec sleep 600'
    command = ContainerCommand("program", "bash", ("-c", each_task), launcher="srun")
    overtime = render_local(ResourceRequest(job_name="overtime", time="1", **TWO_NODES), command=command)
    bounded = render_local(ResourceRequest(job_name="bounded", time="2", max_restarts=1), training)
    jobs = (("limited", limited), ("ddp-limited", ddp_limited), ("overtime", overtime), ("bounded", bounded))
    return {name: job_dir.submit(script, f"{name}.sh") for name, script in jobs}


def log_of(job_dir: JobDir, name: str, job_id: str) -> Callable[[], str]:
    """What reads the log of job ``job_id`` named ``name``."""
    return lambda: job_dir.sh(f"cat logs/{name}-{job_id}.out", check=False).stdout


def resumed_then_cancelled(job_dir: JobDir, name: str, job_id: str) -> str:
    """Waits until the requeued run has resumed, then cancels the job and waits for it to end: its log."""
    deadline = time.monotonic() + 240
    log = ""
    while '"resumed": {' not in log:
        assert time.monotonic() < deadline, log
        time.sleep(3)
        log = job_dir.sh(f"cat logs/{name}-{job_id}.out", check=False).stdout
    job_dir.cluster.ssh(["scancel", job_id], check=True)
    wait_finished(job_dir.cluster, job_id)
    return log


def test_time_limit_checkpoints_requeues_and_resumes(job_dir: JobDir, time_driven_jobs):
    """--signal=B:USR1 before the limit: checkpoint, copy back, requeue; the next run resumes from it."""
    job_id = time_driven_jobs["limited"]
    log = resumed_then_cancelled(job_dir, "limited", job_id)
    assert f"requeueing job {job_id}" in log
    assert job_dir.sh(f"ls runs/{job_id}/checkpoints").stdout.strip(), log
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "limited", job_id))


def test_two_node_time_limit_checkpoints_requeues_and_resumes(job_dir: JobDir, time_driven_jobs):
    """USR1 reaches every rank through srun and torchrun: one checkpoint, requeue, both nodes resume."""
    job_id = time_driven_jobs["ddp-limited"]
    log = resumed_then_cancelled(job_dir, "ddp-limited", job_id)
    assert f"requeueing job {job_id}" in log
    assert "the workers checkpointed; exiting 75" in log
    # The copy-back renames whole files into place, so even a copy cut short by KillWait after the final
    # scancel leaves the metrics the requeue copied back, preempted line included.
    preempted = metric_events(job_dir, job_id, "preempted")
    # Rank 0 (which writes the metrics) names the signal a rank caught, its own or rank 1's where that
    # was seen first in the step's all-ranks check: USR1 came through srun and torchrun.
    assert preempted and preempted[0]["signal"] == "SIGUSR1", log
    assert "srun: error: node1: task 0: Exited with exit code 75" in log, log
    assert "srun: error: node2: task 1: Exited with exit code 75" in log, log
    # The resumed run's start line, from rank 0's output in the job log (the job is cancelled while it runs).
    starts = [json.loads(line) for line in log.splitlines() if line.startswith('{"event": "start"')]
    resumed = next(event for event in starts if event["resumed"])
    assert resumed["world_size"] == 2
    assert resumed["resumed"]["checkpoint"] == preempted[0]["checkpoint"]
    # Cancelled while both nodes train: Slurm starts no new step then, and the janitor step each node
    # ran since the start removes the other node's scratch.
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "ddp-limited", job_id))


# Sends signal $3 (0: none) to the first process on this node whose command line matches $1, that
# catches USR1 (bit 9 of SigCgt) and has $2 in its environment: its pid, or exit 1 after 5 minutes. Run
# as root in the node's container: the phase a test wants is made, not waited for.
STOP_WHEN_READY = r"""
for _ in $(seq 3000); do
    for pid in $(pgrep --full "$1"); do
        caught=$(awk '/^SigCgt/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
        if [[ -n $caught ]] && (( (16#$caught >> 9) & 1 )) && grep -qzx -- "$2" "/proc/$pid/environ"; then
            kill -s "$3" "$pid" && echo "$pid" && exit 0
        fi
    done
    sleep 0.1
done
exit 1
"""
AGENT = "^([^ ]*/)?python[0-9.]* -m hpctrain[.]torchrun "
WORKER = "^([^ ]*/)?python[0-9.]* -u -m hpctrain train "  # torchrun starts each worker so


def stop_when_ready(cluster, host: str, pattern: str, environ: str, signal: str = "STOP") -> str:
    """Stops (or sends ``signal``, "0" for none) the job's process on ``host`` matching ``pattern``
    once it catches USR1: its pid."""
    done = cluster.exec(host, ["bash", "-c", STOP_WHEN_READY, "stop", pattern, environ, signal])
    assert done.returncode == 0, done
    return done.stdout.strip()


# Waits (30 s at most) until USR1 is pending in process $1 ($2 = 1) or no longer is ($2 = 0).
USR1_PENDING = r"""
for _ in $(seq 3000); do
    pending=0
    for mask in $(awk '/^(SigPnd|ShdPnd):/ {print $2}' "/proc/$1/status"); do
        if (( (16#$mask >> 9) & 1 )); then pending=1; fi
    done
    if [[ $pending == "$2" ]]; then exit 0; fi
    sleep 0.01
done
exit 1
"""


def usr1_pending(cluster, host: str, pid: str, pending: bool) -> None:
    """Once USR1 is pending in ``pid`` on ``host`` (a stopped process holds it), or once it is not."""
    done = cluster.exec(host, ["bash", "-c", USR1_PENDING, "usr1", pid, str(int(pending))])
    assert done.returncode == 0, (host, pid, pending, done)


def requeued_and_resumed(job_dir: JobDir, name: str, job_id: str) -> tuple[str, list[dict]]:
    """The log once the requeued run has resumed (the job is then cancelled), and its start events."""
    log = resumed_then_cancelled(job_dir, name, job_id)
    assert f"requeueing job {job_id}" in log, log
    starts = [json.loads(line) for line in log.splitlines() if line.startswith('{"event": "start"')]
    return log, starts


def test_two_nodes_signalled_while_one_is_not_yet_in_the_rendezvous_stop_together_and_requeue(
    job_dir: JobDir,
):
    """The time limit's USR1 while node1's torchrun waits in the rendezvous and node2's has not joined
    (it is stopped there, then let go): each holds the signal, starts its workers all the same and
    tells them at once, and the ranks stop together at their first step: 75, requeue, resume."""
    training = (*RESTING, "--device", "cpu")
    job_id = job_dir.submit(
        render_local(ResourceRequest(job_name="rdzv", time="10", **TWO_NODES), training), "rdzv.sh"
    )
    cluster = job_dir.cluster
    try:
        agent = stop_when_ready(cluster, "node2", AGENT, f"HPCBOX_JOB={job_id}")
        waiting = stop_when_ready(cluster, "node1", AGENT, f"HPCBOX_JOB={job_id}")
        cluster.ssh(["scancel", "--signal=USR1", "--batch", job_id], check=True)
        # The batch shell passes USR1 on to each node's torchrun, both held stopped; node1's takes it
        # while it waits in the rendezvous (as Python runs its handler before its next line, it holds
        # it before any worker starts), and only then does node2's go on.
        usr1_pending(cluster, "node1", waiting, pending=True)
        usr1_pending(cluster, "node2", agent, pending=True)
        cluster.exec("node1", ["kill", "-CONT", waiting])
        usr1_pending(cluster, "node1", waiting, pending=False)
        cluster.exec("node2", ["kill", "-CONT", agent])
        log, starts = requeued_and_resumed(job_dir, "rdzv", job_id)
    finally:
        cluster.ssh(["scancel", job_id])
    held = "hpctrain.torchrun: SIGUSR1 came as the workers started; they stop at their first step"
    assert log.count(held) == 2, log
    assert "srun: error: node1: task 0: Exited with exit code 75" in log, log
    assert "srun: error: node2: task 1: Exited with exit code 75" in log, log
    preempted = metric_events(job_dir, job_id, "preempted")
    assert (preempted[0]["epoch"], preempted[0]["step"]) == (1, 0), preempted  # nothing trained
    assert [start["world_size"] for start in starts] == [2, 2], log
    assert starts[-1]["resumed"]["checkpoint"] == preempted[0]["checkpoint"], log
    wait_scratch_gone(cluster, job_id, log_of(job_dir, "rdzv", job_id))


def signalled_with_node2_stopped(job_dir: JobDir, name: str, pattern: str) -> tuple[str, str, list[dict]]:
    """A two-node training job whose node2 process matching ``pattern`` is stopped in its third epoch,
    then given the time limit's USR1: its id, and its log and start events once it has resumed."""
    training = (*RESTING, "--device", "cpu")
    job_id = job_dir.submit(
        render_local(ResourceRequest(job_name=name, time="10", **TWO_NODES), training), f"{name}.sh"
    )
    cluster = job_dir.cluster
    try:
        deadline = time.monotonic() + 600
        while '"epoch": 2,' not in (log := log_of(job_dir, name, job_id)()):
            assert time.monotonic() < deadline, log
            time.sleep(1)
        stop_when_ready(cluster, "node2", pattern, f"HPCBOX_JOB={job_id}")
        cluster.ssh(["scancel", "--signal=USR1", "--batch", job_id], check=True)
        log, starts = requeued_and_resumed(job_dir, name, job_id)
    finally:
        cluster.ssh(["scancel", job_id])
    return job_id, log, starts


def test_two_nodes_with_a_rank_that_cannot_stop_end_in_time_and_resume_from_the_last_checkpoint(
    job_dir: JobDir,
):
    """The time limit's USR1 while a rank cannot answer (node2's worker stopped mid-training, as one
    stuck writing or waiting for a peer that is gone): rank 0 waits for it in a collective, so neither
    checkpoints; half the margin after the signal each node's torchrun ends its workers and exits 75,
    and the job is requeued before its limit and resumes from its last whole (epoch) checkpoint."""
    job_id, log, starts = signalled_with_node2_stopped(job_dir, "stuck", WORKER)
    ended = "the workers did not stop within 30 s of SIGUSR1; ending them and exiting 75"
    assert log.count(ended) == 2, log
    # No rank could checkpoint at the signal. (The run it resumed in is cancelled as the test ends, and
    # checkpoints at that TERM: its event may be there already, after the resumed start.)
    before_resuming = [
        event for event in metric_events(job_dir, job_id, "preempted") if event["time"] < starts[-1]["time"]
    ]
    assert not before_resuming, log
    resumed = starts[-1]["resumed"]
    assert resumed["step"] == 0 and resumed["epoch"] >= 1, log  # an epoch's checkpoint
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "stuck", job_id))


def test_two_nodes_with_a_torchrun_that_cannot_stop_are_requeued_and_resume_from_the_last_checkpoint(
    job_dir: JobDir,
):
    """The time limit's USR1 while node2's torchrun itself is stopped mid-training (its rank is not): the
    ranks checkpoint together and node1's torchrun exits 75, node2's cannot, and srun kills it after its
    --wait, so the step ends killed (137): the job is requeued all the same, not failed, and resumes from
    the checkpoint written at the signal."""
    job_id, log, starts = signalled_with_node2_stopped(job_dir, "agent", AGENT)
    assert log.count("hpctrain.torchrun: the workers checkpointed; exiting 75") == 1, log  # node1's alone
    assert "srun: error: node2: task 1: Killed" in log, log
    assert "hpcbox: the trainer was killed (status 137) after the time limit's or preemption's" in log, log
    preempted = metric_events(job_dir, job_id, "preempted")
    assert preempted and starts[-1]["resumed"]["checkpoint"] == preempted[0]["checkpoint"], log
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "agent", job_id))


def test_a_job_requeued_max_restarts_times_stops_there_and_keeps_its_checkpoints(
    job_dir: JobDir, time_driven_jobs
):
    """--max-restarts 1 on real Slurm: requeued at its first time limit, and at its second it ends with
    its checkpoints on shared storage and the command that carries on, instead of requeueing for ever."""
    job_id = time_driven_jobs["bounded"]
    state, exit_code = wait_finished(job_dir.cluster, job_id, timeout_s=600)
    log = job_dir.sh(f"cat logs/bounded-{job_id}.out", check=False).stdout
    assert f"requeueing job {job_id} (restart 1 of at most 1)" in log
    assert f"job {job_id} has been requeued 1 times (--max-restarts)" in log, log
    assert (state, exit_code) == ("FAILED", "75:0"), log  # the trainer's "checkpointed" status
    assert sacct(job_dir.cluster, job_id, "Restarts") == ["1"]
    starts = [json.loads(line) for line in log.splitlines() if line.startswith('{"event": "start"')]
    assert [bool(start["resumed"]) for start in starts] == [False, True], log  # two runs, the second resumed
    assert metric_events(job_dir, job_id, "preempted"), log
    assert job_dir.sh(f"ls runs/{job_id}/checkpoints").stdout.strip(), log
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "bounded", job_id))


def test_two_node_job_past_its_time_limit_keeps_its_output_and_leaves_no_scratch(
    job_dir: JobDir, time_driven_jobs
):
    """A program that ignores USR1 runs into the time limit: TIMEOUT, yet what it wrote and its log reach
    shared storage, and neither node keeps scratch (no new step can start then: the janitor's work)."""
    job_id = time_driven_jobs["overtime"]
    state, _ = wait_finished(job_dir.cluster, job_id)
    log = job_dir.sh(f"cat logs/overtime-{job_id}.out", check=False).stdout
    assert state == "TIMEOUT", log
    wait_scratch_gone(job_dir.cluster, job_id, log_of(job_dir, "overtime", job_id))
    # Rank 0 runs on the batch node, whose scratch is copied back.
    assert job_dir.sh(f"cat runs/{job_id}/task-0").stdout == "task 0\n", log
    assert "the trainer exited with status" in log, log  # the batch shell outlived its program


@pytest.mark.parametrize(
    ("request_", "command"),
    [
        (ResourceRequest(job_name="logs", log="out/%x/%u-%j.log", error_log="out/%x/%j.err",
                         extra=("--mem-per-cpu=100M",)), EXAMPLE_TRAINER),
        (ResourceRequest(job_name="tasks", partition="gpu", gpus=1, ntasks_per_node=2, time="5"),
         ContainerCommand("program", "fit", launcher="srun")),
        (ResourceRequest(job_name="ddp", partition="gpu", gpus=2, time="5"), EXAMPLE_TRAINER),
    ],
)  # fmt: skip
def test_scripts_with_their_own_logs_and_launchers_pass_sbatch_test_only(minicluster, request_, command):
    script = render_local(request_, command=command)
    answer = slurm.test_only(minicluster.ssh_target(), script.text)
    assert "to start at" in answer, answer


def test_test_only_reports_what_the_cluster_refuses(minicluster):
    """What the profile cannot know (here: nodes smaller than it claims) Slurm still catches."""
    from hpcbox.errors import HpcboxError

    local = local_profile()
    claims_more = dataclasses.replace(local.partition("gpu"), gpus_per_node=8, default=True)
    profile = dataclasses.replace(local, partitions=(claims_more,))
    script = render_sbatch(
        profile, resolve(profile, ResourceRequest(job_name="too-many", gpus=8)), JobInputs.defaults("trainer")
    )
    with pytest.raises(HpcboxError) as caught:
        slurm.test_only(minicluster.ssh_target(), script.text)
    assert "sbatch --test-only" in caught.value.message
    # 8 DDP processes, one per claimed GPU, on nodes of 2 CPUs: refused at once (EnforcePartLimits).
    assert "More processors requested than permitted" in caught.value.message
