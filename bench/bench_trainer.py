"""The example trainer on CPU (the small CNN on the digits): DataLoader workers, and what the container
runtime itself costs.

Workers: builds (or reuses) the cpu trainer image, writes the digits archive with `make-data`, then
trains with `--workers 0` and with the default worker count (SLURM_CPUS_PER_TASK, else the CPUs this
container may use, minus one), alternating the two so that load from other processes hits both alike.

The container's cost: the same training (same arguments, data and code) inside `apptainer exec` of the
SIF `hpcbox submit` ships to the `local` cluster (the cpu environment image at its compression, the code
bound in at /code as a job binds it) next to that environment image run directly with `docker run`.
Apptainer runs as an ordinary user in a container set up as the mini cluster's compute nodes are (the
helper image's Apptainer, FUSE, no --privileged; squashfuse mounts the SIF), started with the same
`--cpuset-cpus` as the `docker run` side, so that both see the same CPUs; srun, SSH and staging stay out.
The two alternate, ROUNDS_RUNTIME rounds after one untimed run of each; each ratio is the median of
the rounds' own ratios. Also `true` in each (the runtime's own start) and `python -c 'import torch'`
(the start plus reading PyTorch's files: through squashfuse from the SIF, through overlay2 in Docker).
The Apptainer side is timed on the node, as a user there waits for it; the Docker side from the host.

The first epoch of every run is warm-up (worker start, allocator) and left out; the epoch rows are
medians over the other epochs of what the trainer itself reports in metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from hpcbox.build.image import ENVIRONMENT, build_image
from hpcbox.project.config import load_project
from hpcbox.render.profiles import load_profile
from hpcbox.sif.convert import build_sif
from hpcbox.sif.helper import ensure_helper
from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4
BATCH_SIZE = 64
ROUNDS = 2
# Data-bound = the training process waits for batches a large share of its time.
WAIT_TARGET = 0.25
# Apptainer against Docker: timed rounds of each (after one untimed run of each), and of `true`.
ROUNDS_RUNTIME = 6
ROUNDS_START = 7
ROUNDS_IMPORT = 5
DOCKER = "/usr/bin/docker"
# The ordinary user Apptainer runs as (the mini cluster's `researcher`), on the Docker side too.
NODE_USER, NODE_UID = "researcher", 1500
# Everything the node container needs for an unprivileged Apptainer with FUSE (docs: PLATFORM facts).
NODE_OPTIONS = (
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined", "--device", "/dev/fuse",
)  # fmt: skip


def run() -> list[dict]:
    client = docker.client()
    return _workers_rows(client) + _runtime_rows()


def _run(client, ref: str, scratch: Path, *argv: str) -> None:
    container = client.containers.run(
        ref,
        list(argv),
        volumes={str(scratch): {"bind": "/scratch", "mode": "rw"}},
        user=None if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}",
        environment={"HOME": "/tmp"},
        name=f"hpcboxbench-trainer-{os.urandom(3).hex()}",
        detach=True,
    )
    try:
        status = container.wait(timeout=900)["StatusCode"]
        if status != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {status}: {container.logs().decode()[-2000:]}")
    finally:
        container.remove(force=True)


def _train(client, ref: str, scratch: Path, name: str, workers: str | None) -> list[dict]:
    argv = [
        "python",
        "-m",
        "hpctrain",
        "train",
        "--data-dir",
        "/scratch/data",
        "--output-dir",
        f"/scratch/{name}",
    ]
    argv += ["--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE)]
    if workers is not None:
        argv += ["--workers", workers]
    _run(client, ref, scratch, *argv)
    lines = (scratch / name / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [r for r in records if r["event"] == "epoch" and r["epoch"] > 1] + [
        r for r in records if r["event"] == "start"
    ]


def _workers_rows(client) -> list[dict]:
    image = build_image(load_project(REPO), offline=True, say=lambda _line: None, on_line=lambda _line: None)
    measured: dict[str, list[dict]] = {"0": [], "default": []}
    default_workers = None
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-trainer-") as tmp:
        scratch = Path(tmp)
        scratch.chmod(0o777)
        _run(
            client,
            image.ref,
            scratch,
            "python",
            "-m",
            "hpctrain",
            "make-data",
            "--out",
            "/scratch/digits.tar",
        )
        with tarfile.open(scratch / "digits.tar") as archive:
            archive.extractall(scratch / "data", filter="data")
        (scratch / "data").chmod(0o755)
        for round_number in range(ROUNDS):
            for label, workers in (("0", "0"), ("default", None)):
                records = _train(client, image.ref, scratch, f"{label}-{round_number}", workers)
                measured[label] += [r for r in records if r["event"] == "epoch"]
                if workers is None:
                    default_workers = next(r["workers"] for r in records if r["event"] == "start")

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in measured[label])

    setting = f"small CNN, digits 8x8, batch {BATCH_SIZE}, CPU; median of epochs 2-{EPOCHS} x {ROUNDS} runs"
    speed_default, speed_zero = median("default", "samples_per_s"), median("0", "samples_per_s")
    return [
        {
            "metric": "cnn_cpu_samples_per_s_default_workers",
            "value": speed_default,
            "unit": "samples/s",
            "target": None,
            "note": f"{setting}; default workers = {default_workers}",
        },
        {
            "metric": "cnn_cpu_samples_per_s_0_workers",
            "value": speed_zero,
            "unit": "samples/s",
            "target": None,
            "note": setting,
        },
        {
            "metric": "samples_per_s_ratio_default_to_0_workers",
            "value": round(speed_default / speed_zero, 3),
            "unit": "ratio",
            "target": None,
            "note": "side by side in one run, alternating",
        },
        {
            "metric": "data_wait_fraction_0_workers",
            "value": median("0", "data_wait_fraction"),
            "unit": "fraction of train time",
            "target": None,
            "note": "loading and transforming in the training process",
        },
        {
            "metric": "data_wait_fraction_default_workers",
            "value": median("default", "data_wait_fraction"),
            "unit": "fraction of train time",
            "target": f"< {WAIT_TARGET} (not data-bound)",
            "note": f"default workers = {default_workers}",
        },
    ]


# --- the container runtime's own cost: apptainer exec of the SIF against docker run of the image -------


def _train_argv(name: str) -> list[str]:
    return [
        "python", "-m", "hpctrain", "train", "--data-dir", "/scratch/data",
        "--output-dir", f"/scratch/{name}", "--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE),
    ]  # fmt: skip


def _checked(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


class _Sides:
    """The two ways to run one command on the same CPUs: `docker run` of the environment image, and
    `apptainer exec` of its SIF by an ordinary user in a node container; each returns its wall seconds."""

    def __init__(self, image: str, sif: Path, work: Path, cpus: str) -> None:
        self.image, self.sif, self.cpus = image, sif, cpus
        self.scratch, self.code = work / "scratch", work / "code"
        self.node = f"hpcboxbench-trainer-node-{os.urandom(3).hex()}"
        _checked([
            DOCKER, "run", "-d", "--name", self.node, "--network", "none", f"--cpuset-cpus={cpus}",
            *NODE_OPTIONS, "-v", f"{sif.parent}:/sifs:ro", "-v", f"{self.scratch}:/disk/scratch",
            "-v", f"{self.code}:/code:ro", ensure_helper(say=lambda _line: None, on_line=lambda _line: None),
            "sleep", "infinity",
        ])  # fmt: skip
        _checked([
            DOCKER, "exec", self.node, "sh", "-c",
            f"chmod 666 /dev/fuse && useradd --create-home --uid {NODE_UID} {NODE_USER}",
        ])  # fmt: skip

    def docker(self, argv: list[str]) -> float:
        """`docker run --rm` as a user types it, timed from here to its exit."""
        started = time.perf_counter()
        _checked([
            DOCKER, "run", "--rm", "--network", "none", f"--cpuset-cpus={self.cpus}",
            "-u", f"{NODE_UID}:{NODE_UID}", "-e", "HOME=/tmp", "-v", f"{self.scratch}:/scratch",
            "-v", f"{self.code}:/code:ro", "-e", "PYTHONPATH=/code", "-w", "/scratch", self.image, *argv,
        ])  # fmt: skip
        return time.perf_counter() - started

    def apptainer(self, argv: list[str]) -> float:
        """`apptainer exec` with the binds a job uses, timed on the node (as a user there waits for it)."""
        command = shlex.join([
            "apptainer", "exec", "--bind", "/disk/scratch:/scratch", "--bind", "/code:/code:ro",
            "--env", "PYTHONPATH=/code", "--pwd", "/scratch", f"/sifs/{self.sif.name}", *argv,
        ])  # fmt: skip
        script = f"a=$(date +%s%N); {command} >/dev/null || exit $?; b=$(date +%s%N); echo $((b - a))"
        as_user = ["-u", NODE_USER, "-w", f"/home/{NODE_USER}"]
        out = _checked([DOCKER, "exec", *as_user, self.node, "sh", "-c", script])
        return int(out.split()[-1]) / 1e9

    def close(self) -> None:
        subprocess.run([DOCKER, "rm", "-f", self.node], capture_output=True, check=False)


def _sides(round_number: int) -> tuple[str, str]:
    """Which side goes first: alternating by round, so that drift in the machine's load hits both."""
    return ("docker", "apptainer") if round_number % 2 == 0 else ("apptainer", "docker")


def _runtime_rows() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    project = load_project(REPO)
    environment = build_image(
        project, flavour="cpu", offline=True, target=ENVIRONMENT, say=quiet, on_line=quiet
    )
    compression = load_profile("local").apptainer.compression
    cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    epochs: dict[str, list[float]] = {"docker": [], "apptainer": []}  # each run's median epoch
    walls: dict[str, list[float]] = {"docker": [], "apptainer": []}
    starts: dict[str, list[float]] = {"docker": [], "apptainer": []}
    imports: dict[str, list[float]] = {"docker": [], "apptainer": []}
    loads = []
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-runtime-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        sif = build_sif(environment, compression=compression, cache=work / "sifs", say=quiet, on_line=quiet)
        (work / "sifs").chmod(0o755)
        sif.path.chmod(0o644)
        (work / "scratch").mkdir(mode=0o777)
        (work / "scratch").chmod(0o777)
        shutil.copytree(REPO / "src" / "hpctrain", work / "code" / "hpctrain",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        sides = _Sides(environment.ref, sif.path, work, cpus)
        try:
            sides.docker(["python", "-m", "hpctrain", "make-data", "--out", "/scratch/digits.tar"])
            with tarfile.open(work / "scratch" / "digits.tar") as archive:
                archive.extractall(work / "scratch" / "data", filter="data")
            for path in (work / "scratch" / "data", *(work / "scratch" / "data").rglob("*")):
                path.chmod(0o755 if path.is_dir() else 0o644)
            run_on = {"docker": sides.docker, "apptainer": sides.apptainer}
            for side, runner in run_on.items():  # untimed: page cache, Apptainer's first use by the user
                runner(_train_argv(f"warm-{side}"))
            for round_number in range(ROUNDS_START):
                for side in _sides(round_number):
                    starts[side].append(run_on[side](["true"]))
            for round_number in range(ROUNDS_IMPORT):
                for side in _sides(round_number):
                    imports[side].append(run_on[side](["python", "-c", "import torch"]))
            for round_number in range(ROUNDS_RUNTIME):
                loads.append(f"{os.getloadavg()[0]:.1f}")
                for side in _sides(round_number):
                    name = f"{side}-{round_number}"
                    walls[side].append(run_on[side](_train_argv(name)))
                    lines = (work / "scratch" / name / "metrics.jsonl").read_text().splitlines()
                    records = [json.loads(line) for line in lines]
                    epochs[side].append(
                        statistics.median(
                            r["epoch_time_s"] for r in records if r["event"] == "epoch" and r["epoch"] > 1
                        )
                    )
        finally:
            sides.close()
            # What the trainer wrote as the node's user; the temporary folder goes with it.
            subprocess.run(
                [DOCKER, "run", "--rm", "-v", f"{work / 'scratch'}:/s", "-u", "0",
                 environment.ref, "find", "/s", "-mindepth", "1", "-delete"],
                capture_output=True, check=False,
            )  # fmt: skip

    def paired(values: dict[str, list[float]]) -> float:
        # Each apptainer run over the docker run of its own round; the median of those.
        return round(
            statistics.median(a / d for a, d in zip(values["apptainer"], values["docker"], strict=True)), 3
        )

    def shown(values: list[float]) -> str:
        return ", ".join(f"{value:.2f}" for value in values)

    same = f"both on CPUs {cpus} (--cpuset-cpus), default workers, batch {BATCH_SIZE}"
    where = (
        f"the {compression} SIF `hpcbox submit` ships to `local`, run by hpcbox's Apptainer helper image "
        "as an ordinary user with FUSE (squashfuse), in a container set up as the mini cluster's nodes"
    )
    of_rounds = f"median of {ROUNDS_RUNTIME} runs alternating with the other side"
    median = statistics.median
    rows = [
        ("epoch, docker run of the cpu environment image", median(epochs["docker"]), "s",
         f"each run's median of epochs 2-{EPOCHS}; {of_rounds}; {same}; runs {shown(epochs['docker'])}"),
        ("epoch, apptainer exec of its SIF", median(epochs["apptainer"]), "s",
         f"{where}; runs {shown(epochs['apptainer'])}"),
        ("epoch: apptainer / docker", paired(epochs), "ratio",
         f"the container runtime's cost in an epoch; median of each round's ratio; "
         f"1-min load {', '.join(loads)}"),
        (f"whole run ({EPOCHS} epochs), docker run", median(walls["docker"]), "s",
         f"`docker run --rm` timed from the host; runs {shown(walls['docker'])}"),
        (f"whole run ({EPOCHS} epochs), apptainer exec", median(walls["apptainer"]), "s",
         f"`apptainer exec` timed on the node; runs {shown(walls['apptainer'])}"),
        ("whole run: apptainer / docker", paired(walls), "ratio", "start, imports, data, epochs"),
        ("start: docker run --rm IMAGE true", median(starts["docker"]), "s",
         f"median of {ROUNDS_START}, alternating; runs {shown(starts['docker'])}"),
        ("start: apptainer exec SIF true", median(starts["apptainer"]), "s",
         f"median of {ROUNDS_START}; runs {shown(starts['apptainer'])}"),
        ("start: apptainer / docker", paired(starts), "ratio", None),
        ("python -c 'import torch', docker run", median(imports["docker"]), "s",
         f"median of {ROUNDS_IMPORT}, alternating; start included; runs {shown(imports['docker'])}"),
        ("python -c 'import torch', apptainer exec", median(imports["apptainer"]), "s",
         f"median of {ROUNDS_IMPORT}; files read through squashfuse; runs {shown(imports['apptainer'])}"),
        ("import torch: apptainer / docker", paired(imports), "ratio", None),
    ]  # fmt: skip
    return [
        {"metric": metric, "value": round(value, 3) if unit == "s" else value, "unit": unit, "target": None,
         "note": note}
        for metric, value, unit, note in rows
    ]  # fmt: skip
