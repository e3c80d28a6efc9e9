"""The trainer (src/hpctrain), black-box, inside the real cpu trainer image.

torch lives only in the image, so every check runs `python -m hpctrain ...` in a container with a
scratch directory bind-mounted at /scratch, and reads what the trainer leaves there: metrics.jsonl,
checkpoints, exit codes. Runs are small (digits, 16-sample batches, 3 epochs) and share one
uninterrupted baseline run, which the interrupted and the corrupted-checkpoint runs must reproduce
bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.test_curves import read

pytestmark = pytest.mark.integration

SCRATCH = "/scratch"
EXIT_REQUEUE = 75
EXIT_USAGE = 2
# The baseline: 1438 training images / 16 = 90 steps per epoch, a step line every 10.
TRAIN_ARGS = ("--epochs", "3", "--batch-size", "16", "--seed", "7", "--log-interval", "10")
RUN_TIMEOUT_S = 300
SPEED = "train/samples_per_s"


@dataclass(frozen=True)
class Finished:
    exit_code: int
    stdout: str
    stderr: str


class TrainerRunner:
    """Runs the trainer image with `workdir` mounted at /scratch; every container is removed."""

    def __init__(self, client, image_ref: str, workdir: Path, prefix: str) -> None:
        self.client, self.image_ref, self.workdir, self.prefix = client, image_ref, workdir, prefix
        self.count = 0
        # As root on the host, run as the image's own user (uid 1000) in a world-writable dir;
        # otherwise as the host user, so the host can clean up what the trainer wrote.
        self.user = None if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        if self.user is None:
            workdir.chmod(0o777)

    def start(self, *argv: str, env: dict[str, str] | None = None, read_only: Path | None = None):
        self.count += 1
        volumes = {str(self.workdir): {"bind": SCRATCH, "mode": "rw"}}
        if read_only is not None:
            volumes[str(read_only)] = {"bind": "/readonly", "mode": "ro"}
        return self.client.containers.run(
            self.image_ref,
            list(argv),
            name=f"{self.prefix}-trainer-{self.count}-{os.urandom(2).hex()}",
            volumes=volumes,
            user=self.user,
            # One thread, as a one-CPU Slurm job has it (the job script sets OMP_NUM_THREADS): PyTorch's
            # default of one per core spins when the suite's other lanes hold the cores, and took twice
            # the CPU time for the same run.
            environment={"HOME": "/tmp", "OMP_NUM_THREADS": "1", **(env or {})},
            detach=True,
        )

    def finish(self, container, timeout: float = RUN_TIMEOUT_S) -> Finished:
        try:
            exit_code = container.wait(timeout=timeout)["StatusCode"]
            return Finished(
                exit_code,
                container.logs(stdout=True, stderr=False).decode(),
                container.logs(stdout=False, stderr=True).decode(),
            )
        finally:
            container.remove(force=True)

    def copy(self, source: Path, name: str) -> Path:
        """A copy of an output directory under the scratch dir, writable by the container user."""
        target = self.workdir / name
        shutil.copytree(source, target)
        if self.user is None:  # copied as root: hand it back to the container's user
            for path in (target, *target.rglob("*")):
                os.chown(path, 1000, 1000)
        return target

    def run(self, *argv: str, env: dict[str, str] | None = None, read_only: Path | None = None) -> Finished:
        return self.finish(self.start(*argv, env=env, read_only=read_only))

    def train(self, output: str, *extra: str, env: dict[str, str] | None = None) -> Finished:
        return self.run(*self.train_argv(output, *extra), env=env)

    @staticmethod
    def train_argv(output: str, *extra: str) -> tuple[str, ...]:
        data, out = f"{SCRATCH}/data", f"{SCRATCH}/{output}"
        return (
            "python",
            "-m",
            "hpctrain",
            "train",
            "--data-dir",
            data,
            "--output-dir",
            out,
            *TRAIN_ARGS,
            *extra,
        )


def events(output_dir: Path, kind: str | None = None) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if kind is None or r["event"] == kind]


def epoch_results(output_dir: Path) -> dict[int, tuple[float, float, float, float]]:
    """Per epoch, the numbers that must not depend on interruptions (a re-run epoch overwrites)."""
    return {
        e["epoch"]: (e["train_loss"], e["train_accuracy"], e["val_loss"], e["val_accuracy"])
        for e in events(output_dir, "epoch")
    }


def curves(output_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's curves as TensorBoard reads them, but the one that times the run (samples/s)."""
    return {tag: points for tag, points in read(output_dir / "tensorboard").items() if tag != SPEED}


def assert_ok(result: Finished, expected: int = 0) -> None:
    assert result.exit_code == expected, (
        f"exit {result.exit_code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def trainer(trainer_image, docker_engine, run_id, tmp_path_factory) -> TrainerRunner:
    """A runner over a scratch dir holding the digits archive (from make-data) extracted into data/."""
    runner = TrainerRunner(docker_engine, trainer_image.ref, tmp_path_factory.mktemp("trainer"), run_id)
    assert_ok(runner.run("python", "-m", "hpctrain", "make-data", "--out", f"{SCRATCH}/digits.tar"))
    with tarfile.open(runner.workdir / "digits.tar") as archive:
        archive.extractall(runner.workdir / "data", filter="data")
    if runner.user is None:
        (runner.workdir / "data").chmod(0o755)
    return runner


@pytest.fixture(scope="module")
def baseline(trainer: TrainerRunner) -> Path:
    """One uninterrupted run; its weights digest is what every resumed run must end with."""
    assert_ok(trainer.train("baseline"))
    return trainer.workdir / "baseline"


def test_make_data_writes_one_reproducible_archive_of_shards(trainer: TrainerRunner) -> None:
    with tarfile.open(trainer.workdir / "digits.tar") as archive:
        names = archive.getnames()
    assert "manifest.json" in names
    assert all("/" not in name for name in names), names  # extracts straight into --data-dir
    assert sum(name.endswith("-images.npy") for name in names) >= 3  # sharded, not one file per image
    manifest = json.loads((trainer.workdir / "data" / "manifest.json").read_text())
    assert manifest["classes"] == [str(d) for d in range(10)]
    assert manifest["image_shape"] == [8, 8, 1]
    assert manifest["splits"]["train"]["count"] + manifest["splits"]["val"]["count"] == 1797

    again = trainer.run("python", "-m", "hpctrain", "make-data", "--out", f"{SCRATCH}/again.tar")
    assert_ok(again)
    assert (trainer.workdir / "again.tar").read_bytes() == (trainer.workdir / "digits.tar").read_bytes()

    before = (trainer.workdir / "digits.tar").stat().st_mtime_ns
    refused = trainer.run("python", "-m", "hpctrain", "make-data", "--out", f"{SCRATCH}/digits.tar")
    assert_ok(refused, EXIT_USAGE)
    assert "already exists" in refused.stderr
    assert (trainer.workdir / "digits.tar").stat().st_mtime_ns == before


def test_training_reaches_held_out_accuracy_and_reports_per_epoch(baseline: Path) -> None:
    epochs = events(baseline, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    for epoch in epochs:
        assert epoch["samples_per_s"] > 0
        assert epoch["epoch_time_s"] > 0
        assert 0 <= epoch["data_wait_fraction"] <= 1
        assert epoch["train_loss"] > 0
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    done = events(baseline, "done")[-1]
    assert done["val_accuracy"] > 0.9, done
    assert len(done["weights_sha256"]) == 64
    start = events(baseline, "start")[0]
    assert start["device"] == "cpu" and start["resumed"] is None
    # The curves, as TensorBoard reads them: on the step axis (90 steps an epoch), the figures of the
    # metrics (as 32-bit floats), and a step's loss every 10 steps.
    drawn = read(baseline / "tensorboard")
    assert [step for step, _ in drawn["val/accuracy"]] == [90, 180, 270] == [step for step, _ in drawn[SPEED]]
    for name in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"):
        tag = name.replace("_", "/", 1) if name != "lr" else "train/lr"
        assert [value for _, value in drawn[tag]] == pytest.approx([e[name] for e in epochs], rel=1e-6)
    assert [step for step, _ in drawn["train/step_loss"]] == list(range(10, 271, 10))
    assert [value for _, value in drawn["train/step_loss"]] == pytest.approx(
        [e["loss"] for e in events(baseline, "step")],
        abs=1e-6,  # metrics.jsonl rounds to 6 places
    )
    # One checkpoint per epoch, the newest two kept.
    assert sorted(p.name for p in (baseline / "checkpoints").iterdir()) == [
        "ckpt-e0002-s000000.pt",
        "ckpt-e0003-s000000.pt",
    ]


def _wait_for_step(output_dir: Path, container, epoch: int) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(e["epoch"] == epoch for e in events(output_dir, "step")):
            return
        container.reload()
        if container.status == "exited":
            pytest.fail(f"trainer exited before epoch {epoch}:\n{container.logs().decode()[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"no step of epoch {epoch} within {RUN_TIMEOUT_S} s")


def test_sigusr1_mid_epoch_checkpoints_exits_75_and_resume_matches_uninterrupted(
    trainer: TrainerRunner, baseline: Path
) -> None:
    output = trainer.workdir / "interrupted"
    container = trainer.start(*trainer.train_argv("interrupted"))
    _wait_for_step(output, container, epoch=2)
    container.kill(signal="SIGUSR1")
    interrupted = trainer.finish(container)

    assert_ok(interrupted, EXIT_REQUEUE)
    preempted = events(output, "preempted")[-1]
    assert preempted["signal"] == "SIGUSR1"
    assert preempted["epoch"] >= 2 and 0 < preempted["step"] < 90, preempted  # mid-epoch, not at a boundary
    assert (output / "checkpoints" / preempted["checkpoint"]).is_file()
    assert not events(output, "done")

    resumed = trainer.train("interrupted")
    assert_ok(resumed)
    start = events(output, "start")[-1]
    assert start["resumed"]["checkpoint"] == preempted["checkpoint"]
    assert start["resumed"]["step"] == preempted["step"]
    assert events(output, "done")[-1]["weights_sha256"] == events(baseline, "done")[-1]["weights_sha256"]
    assert epoch_results(output) == epoch_results(baseline)
    # Two event files, one set of curves: the same points as the run never stopped.
    assert len(list((output / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert curves(output) == curves(baseline)


def test_truncated_checkpoint_is_ignored_for_the_previous_valid_one(
    trainer: TrainerRunner, baseline: Path
) -> None:
    output = trainer.copy(baseline, "truncated")
    newest = output / "checkpoints" / "ckpt-e0003-s000000.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    result = trainer.train("truncated")
    assert_ok(result)
    warnings = [line for line in result.stderr.splitlines() if "ckpt-e0003-s000000.pt" in line]
    assert warnings and "ignoring unreadable checkpoint" in warnings[0]
    assert events(output, "start")[-1]["resumed"]["checkpoint"] == "ckpt-e0002-s000000.pt"
    # Epoch 3 is trained again from epoch 2's checkpoint and lands on the very same weights.
    assert events(output, "epoch")[-1]["epoch"] == 3
    assert events(output, "done")[-1]["weights_sha256"] == events(baseline, "done")[-1]["weights_sha256"]
    # Epoch 3's steps are drawn once, from the run that trained them again.
    assert curves(output) == curves(baseline)


def test_torchrun_two_gloo_processes_train_and_agree_on_weights(trainer: TrainerRunner) -> None:
    # hpctrain.torchrun is torch.distributed.run, made to work with Debian's libuv-less PyTorch build.
    launcher = (
        "python",
        "-m",
        "hpctrain.torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hpctrain",
    )
    argv = trainer.train_argv("ddp", "--epochs", "2", "--steps-per-epoch", "15", "--workers", "0")
    result = trainer.run(*launcher, *argv[3:])
    assert_ok(result)
    output = trainer.workdir / "ddp"
    assert events(output, "start")[0]["world_size"] == 2
    assert [e["epoch"] for e in events(output, "epoch")] == [1, 2]  # rank 0 alone writes metrics
    digests = events(output, "done")[-1]["rank_weights_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1], digests


def test_gloo_process_groups_are_torn_down_without_deadlock(trainer: TrainerRunner) -> None:
    # The intermittent 2-process exit hang: rank 0 stuck in destroy_process_group (issue 11).
    iterations = 100
    script = trainer.workdir / "gloo_teardown_loop.py"
    shutil.copy(Path(__file__).parent / "scripts" / script.name, script)
    result = trainer.run("python", f"{SCRATCH}/{script.name}", str(iterations))
    assert_ok(result)
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome == {"exit_codes": [0, 0], "iterations": [iterations, iterations]}, result.stderr[-3000:]


TWO_PROCESSES = (
    *("python", "-m", "hpctrain.torchrun", "--standalone", "--nproc-per-node", "2"),
    *("-m", "hpctrain"),
)


def test_torchrun_passes_usr1_to_every_process_which_checkpoint_once_and_exit_75(
    trainer: TrainerRunner,
) -> None:
    """Signalled as a job step's launcher is: the agent (PID 1 here) alone gets USR1."""
    argv = (*TWO_PROCESSES, *trainer.train_argv("ddp-interrupted", "--workers", "0")[3:])
    container = trainer.start(*argv)
    output = trainer.workdir / "ddp-interrupted"
    _wait_for_step(output, container, epoch=2)
    container.kill(signal="SIGUSR1")
    interrupted = trainer.finish(container)

    assert_ok(interrupted, EXIT_REQUEUE)
    preempted = events(output, "preempted")
    assert len(preempted) == 1 and preempted[0]["signal"] == "SIGUSR1", preempted
    assert preempted[0]["epoch"] >= 2 and 0 < preempted[0]["step"] < 45, preempted
    assert (output / "checkpoints" / preempted[0]["checkpoint"]).is_file()
    assert not events(output, "done")

    resumed = trainer.run(*argv)
    assert_ok(resumed)
    assert events(output, "start")[-1]["resumed"]["step"] == preempted[0]["step"]
    uninterrupted = trainer.run(*TWO_PROCESSES, *trainer.train_argv("ddp-whole", "--workers", "0")[3:])
    assert_ok(uninterrupted)
    whole = events(trainer.workdir / "ddp-whole", "done")[-1]
    done = events(output, "done")[-1]
    assert done["rank_weights_sha256"] == whole["rank_weights_sha256"] == [whole["weights_sha256"]] * 2
    assert epoch_results(output) == epoch_results(trainer.workdir / "ddp-whole")


def test_torchrun_signalled_while_it_starts_still_starts_its_workers_which_stop_at_their_first_step(
    trainer: TrainerRunner,
) -> None:
    """USR1 while the agent still imports torch (seconds on a busy node: a short job's time limit can
    come then): held, and the workers start all the same and are told at once, so they stop together
    at their first step and the agent exits 75. An agent that exited before starting its workers would
    leave another node's workers waiting for peers that never come (issue 38: one node exited 75, the
    other's ranks were killed, no requeue). Sent once /proc shows the agent catches USR1, as a job
    script's is sent at any moment; the agent is not PID 1 here (PID 1 ignores uncaught signals)."""
    argv = [*TWO_PROCESSES, *trainer.train_argv("early", "--workers", "0")[3:]]
    driver = (
        "import signal, subprocess, sys, time\n"
        "agent = subprocess.Popen(sys.argv[1:])\n"
        "catches = lambda: int(open(f'/proc/{agent.pid}/status').read().split('SigCgt:')[1].split()[0], 16)\n"
        "while not catches() >> (signal.SIGUSR1 - 1) & 1:\n"
        "    time.sleep(0.005)\n"
        "agent.send_signal(signal.SIGUSR1)\n"
        "sys.exit(agent.wait())\n"
    )
    result = trainer.run("python", "-c", driver, *argv)
    assert_ok(result, EXIT_REQUEUE)
    assert "hpctrain.torchrun: SIGUSR1 came as the workers started; they stop at their first step" in (
        result.stderr
    )
    assert "the workers checkpointed; exiting 75" in result.stderr
    output = trainer.workdir / "early"
    assert events(output, "start")[0]["world_size"] == 2
    preempted = events(output, "preempted")
    assert len(preempted) == 1 and (preempted[0]["epoch"], preempted[0]["step"]) == (1, 0), preempted
    assert not events(output, "step"), "no step should have been trained"
    resumed = trainer.run(*argv)
    assert_ok(resumed)
    assert events(output, "start")[-1]["resumed"]["checkpoint"] == preempted[0]["checkpoint"]


# Finds the worker of rank 1 by its environment (the image has no procps), sends it the signal named
# by argv[1], prints its pid.
SIGNAL_RANK_1 = """
import os, signal, sys
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    if b"RANK=1" in environ and b"TORCHELASTIC_RUN_ID" in b" ".join(environ):
        os.kill(int(pid), getattr(signal, sys.argv[1]))
        print(pid)
        sys.exit(0)
sys.exit("no worker of rank 1")
"""


def test_a_stop_signal_rank_1_alone_caught_is_the_one_rank_0_names_in_the_metrics(
    trainer: TrainerRunner,
) -> None:
    """Found in a full run: where rank 1 caught the job's signal first, rank 0 (which writes the
    metrics) named the signal "peer", and the two-node preemption test, which asserts the signal, failed.
    Rank 1 alone is sent SIGTERM here: every rank stops at the same step, and rank 0 names SIGTERM."""
    argv = (*TWO_PROCESSES, *trainer.train_argv("rank-1-signalled", "--workers", "0")[3:])
    container = trainer.start(*argv)
    output = trainer.workdir / "rank-1-signalled"
    _wait_for_step(output, container, epoch=2)
    signalled = container.exec_run(["python", "-c", SIGNAL_RANK_1, "SIGTERM"])
    assert signalled.exit_code == 0 and signalled.output.decode().strip().isdigit(), signalled.output
    finished = trainer.finish(container)
    assert_ok(finished, EXIT_REQUEUE)
    preempted = events(output, "preempted")
    assert len(preempted) == 1 and preempted[0]["signal"] == "SIGTERM", preempted
    assert (output / "checkpoints" / preempted[0]["checkpoint"]).is_file()


def test_torchrun_ends_workers_that_do_not_stop_in_time_and_exits_75_with_the_last_whole_checkpoint(
    trainer: TrainerRunner,
) -> None:
    """A rank that cannot answer the time limit's signal (stopped here, as one waiting in a collective
    for a peer that is gone or stuck writing would be): HPCTRAIN_STOP_WITHIN_S after the signal the
    agent kills its workers and exits 75, so the job is requeued, and the run resumes from the last
    checkpoint written whole (epoch 1's, or epoch 2's where epoch 2 ended before rank 1 was stopped),
    not from a half-written one."""
    argv = (*TWO_PROCESSES, *trainer.train_argv("stuck", "--workers", "0")[3:])
    container = trainer.start(*argv, env={"HPCTRAIN_STOP_WITHIN_S": "5"})
    output = trainer.workdir / "stuck"
    _wait_for_step(output, container, epoch=2)
    # Rank 1's worker, stopped: rank 0 then waits for it in the next step's collective.
    stopped = container.exec_run(["python", "-c", SIGNAL_RANK_1, "SIGSTOP"])
    assert stopped.exit_code == 0 and stopped.output.decode().strip().isdigit(), stopped.output
    stopped_at = time.monotonic()
    container.kill(signal="SIGUSR1")
    finished = trainer.finish(container)
    took = time.monotonic() - stopped_at
    assert_ok(finished, EXIT_REQUEUE)
    assert "the workers did not stop within 5 s of SIGUSR1; ending them and exiting 75" in finished.stderr
    assert took < 60, took
    assert not events(output, "preempted"), "no rank could have written a checkpoint"
    # The checkpoints written whole, as their files say (a save ends in a rename; its event is written
    # only after every rank's barrier, which a stopped rank 1 never reaches).
    whole = sorted(path.name for path in (output / "checkpoints").glob("ckpt-*.pt"))
    assert whole and whole[-1] in ("ckpt-e0001-s000000.pt", "ckpt-e0002-s000000.pt"), whole
    resumed = trainer.run(*argv)
    assert_ok(resumed)
    assert events(output, "start")[-1]["resumed"]["checkpoint"] == whole[-1]
    assert [e["epoch"] for e in events(output, "epoch")][-1] == 3


def test_a_worker_signalled_before_its_handlers_are_in_place_checkpoints_instead_of_dying(
    trainer: TrainerRunner,
) -> None:
    """Slurm signals every process of a step, and the agent passes USR1 on as soon as it has started
    its workers: a worker may not catch USR1 yet, and the default action would kill it (the agent then
    fails, with no requeue). Each worker here waits 3 s before it runs the trainer's module, and is
    signalled in that time; the agent starts workers with the job signals blocked, the signal waits, and
    the trainer takes it once its handlers are in place. (Not a shell that waits: dash and bash clear
    the signal mask they start with.)"""
    wait_then_train = (
        "import runpy, sys, time; time.sleep(3); sys.argv[0] = 'hpctrain'; "
        "runpy.run_module('hpctrain', run_name='__main__', alter_sys=True)"
    )
    late_worker = ("--no-python", "python", "-c", wait_then_train)
    argv = [*TWO_PROCESSES[:-2], *late_worker, *trainer.train_argv("at-birth", "--workers", "0")[3:]]
    driver = (
        "import os, signal, subprocess, sys, time\n"
        "agent = subprocess.Popen(sys.argv[1:])\n"
        "def waiting_workers():\n"
        "    found = set()\n"
        "    for entry in filter(str.isdigit, os.listdir('/proc')):\n"
        "        try:\n"
        "            stat = open(f'/proc/{entry}/stat').read()\n"
        "            command = open(f'/proc/{entry}/cmdline', 'rb').read().split(b'\\0')\n"
        "        except OSError:\n"
        "            continue\n"
        "        if int(stat.rsplit(')', 1)[1].split()[1]) == agent.pid and command[1:2] == [b'-c']:\n"
        "            found.add(int(entry))\n"
        "    return found\n"
        "signalled = set()\n"
        "while len(signalled) < 2 and agent.poll() is None:\n"
        "    for pid in waiting_workers() - signalled:\n"
        "        os.kill(pid, signal.SIGUSR1)\n"
        "        signalled.add(pid)\n"
        "    time.sleep(0.01)\n"
        "print(f'signalled {len(signalled)} workers before they ran the trainer', file=sys.stderr)\n"
        "sys.exit(agent.wait())\n"
    )
    result = trainer.run("python", "-c", driver, *argv)
    assert "signalled 2 workers before they ran the trainer" in result.stderr, result.stderr[-3000:]
    assert_ok(result, EXIT_REQUEUE)
    output = trainer.workdir / "at-birth"
    preempted = events(output, "preempted")
    assert len(preempted) == 1 and preempted[0]["signal"] == "SIGUSR1", preempted
    assert (output / "checkpoints" / preempted[0]["checkpoint"]).is_file()
    assert not events(output, "done")


def test_resnet18_trains_head_first_then_all_layers(trainer: TrainerRunner) -> None:
    result = trainer.train(
        "resnet", "--model", "resnet18", "--epochs", "2", "--steps-per-epoch", "3", "--workers", "0"
    )
    assert_ok(result)
    frozen, unfrozen = events(trainer.workdir / "resnet", "epoch")
    assert (frozen["phase"], unfrozen["phase"]) == ("frozen-backbone", "all-layers")
    assert frozen["trainable_parameters"] == 512 * 10 + 10  # the new fc head only
    assert unfrozen["trainable_parameters"] > 11_000_000
    assert events(trainer.workdir / "resnet", "done")


@pytest.mark.parametrize(
    ("extra", "env", "expected"),
    [
        (("--data-dir", f"{SCRATCH}/missing"), {}, "--data-dir /scratch/missing does not exist"),
        (("--data-dir", f"{SCRATCH}/empty"), {}, "'train' split is empty"),
        (("--model", "vgg99"), {}, "unknown value 'vgg99'"),
        (("--batch-size", "0"), {}, "--batch-size (env BATCH_SIZE) must be >= 1"),
        ((), {"LR": "-1"}, "--lr (env LR) must be > 0"),
        ((), {"WORKERS": "many"}, "--workers (env WORKERS): cannot read 'many'"),
        (("--output-dir", "/readonly/out"), {}, "is not writable"),
        (("--device", "cuda"), {}, "--device cuda: torch sees no CUDA device"),
        # A job Slurm gave a GPU, in the cpu image: it would hold the GPU and train on the CPU.
        ((), {"SLURM_GPUS_ON_NODE": "1"}, "is a CPU build: it would train on the CPU while holding them"),
        # ... even on the mini cluster's placeholders: with them only a CUDA build may go on on the CPU.
        ((), {"SLURM_GPUS_ON_NODE": "2", "HPCBOX_PLACEHOLDER_GPUS": "1"}, "given 2 GPUs, but its PyTorch"),
    ],
    ids=[
        "missing-data",
        "empty-data",
        "unknown-model",
        "batch-flag",
        "lr-env",
        "workers-env",
        "read-only",
        "cuda",
        "gpus-given-cpu-build",
        "placeholder-gpus-cpu-build",
    ],
)
def test_bad_input_is_one_line_and_no_training(
    trainer: TrainerRunner, tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    empty = trainer.workdir / "empty"
    if not empty.exists():
        empty.mkdir()
        manifest = json.loads((trainer.workdir / "data" / "manifest.json").read_text())
        manifest["splits"]["train"] = {"count": 0, "shards": []}
        (empty / "manifest.json").write_text(json.dumps(manifest))
    output = f"bad-{os.urandom(3).hex()}"
    argv = (*trainer.train_argv(output), *extra)  # later flags win
    result = trainer.run(*argv, env=env, read_only=tmp_path)

    assert_ok(result, EXIT_USAGE)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), result.stderr
    assert expected in lines[0]
    assert not events(trainer.workdir / output), "bad input must stop before training"
    assert not list((tmp_path).iterdir())


def test_a_job_given_gpus_it_cannot_use_stops_unless_told_to_use_the_cpu(trainer: TrainerRunner) -> None:
    # The decision for each case, in the image's own torch: a CUDA build that sees fewer GPUs than it
    # was given stops at a site, and goes on on the CPU, saying so, only on the mini cluster's placeholders.
    decide = (
        "import torch\n"
        "from hpctrain import HpctrainError\n"
        "from hpctrain.distributed import device_for_given_gpus as decide\n"
        "for case in [(0, None, 0, False), (1, '12.8', 1, False), (2, '12.8', 4, False),\n"
        "             (1, '12.8', 0, True),\n"
        "             (1, '12.8', 0, False), (2, '12.8', 1, True), (1, None, 0, True)]:\n"
        "    try:\n"
        "        print(decide(*case))\n"
        "    except HpctrainError as exc:\n"
        "        print('stop:', exc.message.replace(torch.__version__, 'VERSION'))\n"
    )
    result = trainer.run("python", "-c", decide)
    assert_ok(result)
    assert result.stdout.splitlines() == [
        "None",
        "cuda",
        "cuda",
        "cpu",
        "stop: this job was given 1 GPU, but PyTorch sees 0",
        "cpu",
        "stop: this job was given 1 GPU, but its PyTorch (VERSION) is a CPU build: it would train on the CPU "
        "while holding them",
    ], result.stdout
    assert result.stderr.count("placeholders") == 2, result.stderr
    # Told to use the CPU, a job given a GPU trains there (one epoch is enough to see it start).
    output = f"cpu-{os.urandom(3).hex()}"
    told = trainer.run(
        *trainer.train_argv(output), "--epochs", "1", "--device", "cpu", env={"SLURM_GPUS_ON_NODE": "1"}
    )
    assert_ok(told)
    assert any(event["event"] == "done" for event in events(trainer.workdir / output)), told.stderr


def test_help_documents_flags_environment_and_exit_codes(trainer: TrainerRunner) -> None:
    result = trainer.run("python", "-m", "hpctrain", "train", "--help")
    assert_ok(result)
    text = " ".join(result.stdout.split())
    for documented in (
        "--epochs",
        "EPOCHS",
        "--batch-size",
        "BATCH_SIZE",
        "SLURM_CPUS_PER_TASK",
        "75",
        "SIGUSR1",
    ):
        assert documented in text
