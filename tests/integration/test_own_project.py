"""A researcher's own project, not hpcbox's: `hpcbox init` → lock → build → submit on the mini cluster
→ fetch, through the `hpcbox` command; and hpcbox installed with nothing but `pip install .`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcbox import jobs
from hpcbox import minicluster as mc
from hpcbox.project.config import load_project
from hpcbox.tools import docker
from tests.fixtures.cluster import free_port
from tests.fixtures.submitting import (
    ctrl_c_as_in_a_terminal,
    picks_node1,
    running_in_preemptible,
    runs_in_accounting,
    started_within_grace,
    user_signal_profile,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# The project's own training script: argparse, a module of its own, a PyPI package Debian lacks
# (tabulate) and one Debian's cpu flavour provides (numpy).
TRAIN = """\
import argparse
import json
from pathlib import Path

import numpy
from tabulate import tabulate

from scaling import scale


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--factor", type=float, default=1.0)
    parser.add_argument("--track", action="store_true", help="log its steps to W&B and MLflow")
    args = parser.parse_args()
    # Its data where a dataset was staged; without one (an empty folder), numbers of its own.
    given = args.data / "numbers.txt"
    numbers = numpy.loadtxt(given) if given.exists() else numpy.arange(1, 11)
    result = {"mean": scale(float(numbers.mean()), args.factor), "numpy": numpy.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result))
    print(tabulate([[key, value] for key, value in result.items()]))
    if args.track:
        track(result["mean"], args.factor)


def track(mean, factor):
    # Five steps logged to W&B (offline: no account) and to MLflow, each by its own library, where
    # the job's environment says (WANDB_DIR, MLFLOW_TRACKING_URI).
    import mlflow
    import wandb

    run = wandb.init(project="mean-project", mode="offline", config={"factor": factor})
    with mlflow.start_run(run_name="mean"):
        mlflow.log_param("factor", factor)
        for step in range(5):
            run.log({"loss": mean / (step + 1)}, step=step)
            mlflow.log_metric("loss", mean / (step + 1), step=step)
    run.finish()


if __name__ == "__main__":
    main()
"""


def hpcbox(project: Path, *args: str, env: dict[str, str], timeout: float = 900):
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *args],
        cwd=project,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"hpcbox {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


# The same project's sweep, as Hydra applications are written: a config folder, a task function that
# writes into its output folder and returns a value, run as a script.
SWEEP = """\
import json
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from scaling import scale


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    scaled = scale(cfg.lr, cfg.factor)
    out = Path(HydraConfig.get().runtime.output_dir)
    if "seconds" in cfg:  # a long point: a step a second, its progress kept in its output folder
        done, starts = out / "done.txt", out / "starts.txt"
        first = int(done.read_text()) if done.exists() else 0
        starts.write_text((starts.read_text() if starts.exists() else "") + f"{first}\\n")
        for step in range(first, cfg.seconds):
            time.sleep(1)
            done.write_text(str(step + 1))
        return float(len(starts.read_text().split()))
    (out / "result.json").write_text(json.dumps({"lr": cfg.lr, "scaled": scaled}))
    return scaled


if __name__ == "__main__":
    main()
"""


# W&B's and MLflow's own readers (`wandb leet inspect`, MlflowClient) over the runs a job wrote, as they
# came home: run in the project's own environment image with no network, as on a laptop offline. Each
# run's losses by step, and MLflow's parameter.
READ_TRACKED = """\
import json
import subprocess
import sys
from pathlib import Path

import mlflow

home = Path(sys.argv[1])
(run_file,) = home.glob("wandb/offline-run-*/run-*.wandb")
records = subprocess.run(
    ["wandb", "leet", "inspect", "--json", str(run_file)], capture_output=True, text=True, check=True
).stdout.splitlines()
histories = [json.loads(line)["history"]["item"] for line in records if '"type":"history"' in line]
(run_id,) = [json.loads(line)["run"]["run_id"] for line in records if '"type":"run"' in line]
client = mlflow.MlflowClient(tracking_uri=(home / "mlruns").as_uri())
(run,) = client.search_runs(["0"])
print(json.dumps({
    "wandb_run": run_id,
    "wandb": {item["_step"]: item["loss"] for item in histories},
    "mlflow": {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, "loss")},
    "factor": run.data.params["factor"],
}))
"""


@dataclass(frozen=True)
class OwnProject:
    root: Path
    env: dict[str, str]
    initialised: str  # what `hpcbox init` and `hpcbox lock --pip-only` said
    locked: str


@pytest.fixture(scope="module")
def own_project(run_id: str, minicluster, minicluster_state: Path, tmp_path_factory) -> Iterator[OwnProject]:
    """A researcher's project, `hpcbox init`-ed and locked once; its image (built by whichever test
    submits first) is removed at the end."""
    root = tmp_path_factory.mktemp("own") / "mean-project"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "sweep.py").write_text(SWEEP)
    (root / "conf").mkdir()
    (root / "conf" / "config.yaml").write_text("lr: 0.1\nfactor: 10\n")
    (root / "scaling.py").write_text("def scale(value, factor):\n    return value * factor\n")
    # hydra-core's antlr4-python3-runtime is on PyPI as source alone: built in the image's builder stage.
    # W&B and MLflow: their runs written in a job and read back here (test_wandb_and_mlflow_...).
    (root / "requirements.txt").write_text(
        "numpy\ntabulate==0.9.0\nhydra-core==1.3.2\nwandb==0.31.0\nmlflow-skinny==3.18.0\n"
    )
    (root / "data" / "numbers.txt").write_text("1\n2\n3\n4\n")
    env = {
        "HPCBOX_IMAGE_REPOSITORY": f"{run_id}/own-project",
        "HPCBOX_MINICLUSTER": minicluster.name,
        "HPCBOX_MINICLUSTER_STATE": str(minicluster_state),
        "HPCBOX_CACHE": str(tmp_path_factory.mktemp("own-cache")),
    }
    initialised = hpcbox(root, "init", "--args=--data {data_dir} --out {output_dir}", env=env)
    locked = hpcbox(root, "lock", "--pip-only", env=env)
    try:
        yield OwnProject(root, env, initialised.stdout, locked.stderr)
    finally:
        for image in docker.client().images.list(name=f"{run_id}/own-project*"):
            for tag in image.tags:
                docker.remove_image(tag)


@pytest.mark.cluster
def test_own_project_init_lock_build_submit_fetch(own_project: OwnProject):
    project, env = own_project.root, own_project.env
    assert 'code = ["scaling.py", "sweep.py", "train.py"]' in (project / "pyproject.toml").read_text()
    cpu_lock = (project / "docker/lock/cpu-requirements.txt").read_text()
    cuda_lock = (project / "docker/lock/cuda-requirements.txt").read_text()
    assert "tabulate==0.9.0" in cpu_lock and "\nnumpy==" not in cpu_lock, own_project.locked  # Debian's numpy
    assert "tabulate==0.9.0" in cuda_lock and "\nnumpy==" in cuda_lock
    # A checkout with a change not committed: the submit says in one line that no commit holds what runs.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *command], cwd=project, check=True, capture_output=True)
    (project / "scaling.py").write_text((project / "scaling.py").read_text() + "# changed, not committed\n")
    submitted = hpcbox(
        project, "submit", "--cluster=local", "--offline", "--data=data", "--time=10",
        "--", "--factor", "10", env=env,
    )  # fmt: skip
    job_id = submitted.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), submitted.stdout
    dirty = re.search(
        r"^hpcbox: the code has changes not committed \(recorded as [0-9a-f]{7,}-dirty\)",
        submitted.stderr,
        re.M,
    )
    assert dirty, submitted.stderr
    followed = hpcbox(project, "logs", "--follow", env=env)
    assert "mean" in followed.stdout and "25" in followed.stdout, followed.stdout  # tabulate's table
    fetched = Path(hpcbox(project, "fetch", env=env).stdout.strip())
    result = json.loads((fetched / "result.json").read_text())
    # its own output: the mean of its own data, times the argument given after `--`
    assert result["mean"] == 25.0
    assert result["numpy"].startswith("2.2.4")  # Debian's, which the cpu lock left out
    assert fetched.is_relative_to(project / "runs" / "local")
    status = hpcbox(project, "status", env=env)
    assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout
    # its program writes no metrics.jsonl: the report says so, not that it failed to start
    reported = hpcbox(project, "report", env=env).stdout
    assert (
        "throughput  unknown" in reported
        and "-> unknown: python /code/train.py writes no metrics.jsonl" in (reported)
    ), reported
    assert "did not start" not in reported
    # No dataset named: the job goes, its /scratch/data empty, and said so.
    bare = hpcbox(project, "submit", "--cluster=local", "--offline", "--time=10", env=env)
    assert "hpcbox: no dataset (--data, or data in [tool.hpcbox]): the job's /scratch/data is empty" in (
        bare.stderr
    )
    hpcbox(project, "logs", "--follow", env=env)
    status = hpcbox(project, "status", env=env)
    assert status.stdout.startswith(f"job {bare.stdout.split()[-1]}: COMPLETED"), status.stdout
    fetched = Path(hpcbox(project, "fetch", env=env).stdout.strip())
    assert json.loads((fetched / "result.json").read_text())["mean"] == 5.5  # its own numbers, 1 to 10


@pytest.mark.cluster
def test_wandb_and_mlflow_runs_written_in_a_job_come_home_with_watch_and_read_back_offline(
    own_project: OwnProject,
):
    """Each tracker's run, written by its own library in the job, where hpcbox's job script points it
    (the output folder: node scratch goes with the job), comes home with `watch` and reads back here
    with the tracker's own reader and no network: every step's loss, MLflow's parameter, and the id
    hpcbox gave the W&B run; `watch` says both trackers' figures as they come."""
    project, env = own_project.root, own_project.env
    submitted = hpcbox(
        project, "submit", "--cluster=local", "--offline", "--data=data", "--time=10",
        "--", "--factor", "10", "--track", env=env,
    )  # fmt: skip
    job_id = submitted.stdout.strip().splitlines()[-1]
    watched = hpcbox(project, "watch", "-j", job_id, env=env)
    home = Path(re.search(r"^hpcbox: results in (.+)$", watched.stderr, re.M)[1])
    assert re.search(rf"^hpcbox: job {job_id}: COMPLETED, elapsed ", watched.stderr, re.M), watched.stderr
    record = jobs.Ledger(load_project(project)).find(job_id, "local")
    read = docker.client().containers.run(
        record.image, ["python3", "-c", READ_TRACKED, "/home-runs"], network_mode="none", remove=True,
        volumes={str(home): {"bind": "/home-runs", "mode": "ro"}}, user=f"{os.getuid()}:{os.getgid()}",
        environment={"HOME": "/tmp", "MLFLOW_ALLOW_FILE_STORE": "true"},
    )  # fmt: skip
    losses = {str(step): 25.0 / (step + 1) for step in range(5)}  # the mean of its data, 2.5, times 10
    # W&B's run id is the job's (its submission's and job id), which a requeued run keeps
    wandb_run = f"{Path(record.script).stem}-{job_id}"
    assert json.loads(read) == {"wandb_run": wandb_run, "wandb": losses, "mlflow": losses, "factor": "10.0"}
    # watch said each tracker's figures as they came (MLflow's store read here as text, W&B's log as
    # its records, with neither library), the last its last step's
    said = [line for line in watched.stdout.splitlines() if line.startswith("mlflow mean")]
    assert said and said[-1] == "mlflow mean, step 4: loss 5", watched.stdout
    said = [line for line in watched.stdout.splitlines() if line.startswith(f"wandb {wandb_run}")]
    assert said and said[-1] == f"wandb {wandb_run}, step 4: loss 5", watched.stdout


def multirun(own_project: OwnProject, sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python sweep.py -m OVERRIDES` with hpcbox's launcher on the mini cluster, into ``sweep_dir``."""
    return subprocess.run(
        [sys.executable, "sweep.py", "-m", *overrides, "hydra/launcher=hpcbox",
         "hydra.launcher.cluster=local", "hydra.launcher.offline=true", "hydra.launcher.timeout_min=10",
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=own_project.root, env={**os.environ, **own_project.env},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


@pytest.mark.cluster
def test_a_hydra_multirun_from_the_laptop_is_one_array_job_returning_each_points_return(
    own_project: OwnProject,
):
    """`python sweep.py -m lr=... hydra/launcher=hpcbox`: four points as one array job on the mini
    cluster, in the project's SIF (Python 3.13 there, this one's here: the task function goes by name);
    each point's return in the launcher's lines, its output folder home where a local multirun puts it."""
    sweep_dir = own_project.root / "multirun" / "lr-sweep"
    swept = multirun(own_project, sweep_dir, "lr=0.5,1,2,4")
    said = swept.stdout + swept.stderr
    assert swept.returncode == 0, said
    returned = re.findall(r"#(\d) : COMPLETED, returned ([0-9.]+) \(job (\d+)_(\d)\)", said)
    assert [(point, value, task) for point, value, _, task in returned] == [
        ("0", "5.0", "0"), ("1", "10", "1"), ("2", "20", "2"), ("3", "40", "3")
    ], said  # fmt: skip
    assert len({array for _, _, array, _ in returned}) == 1, said  # one array job
    for point, lr in enumerate([0.5, 1, 2, 4]):
        home = sweep_dir / str(point)
        assert json.loads((home / "result.json").read_text()) == {"lr": lr, "scaled": lr * 10}
        assert (home / ".hydra" / "overrides.yaml").read_text() == f"- lr={lr}\n"
        assert not (home / "result.pkl").exists()


@pytest.mark.cluster
def test_a_hydra_multirun_sent_without_waiting_returns_at_once_and_collect_brings_its_returns(
    own_project: OwnProject,
):
    """`hydra.launcher.wait=false`: the multirun returns once its array job is sent, its points' returns
    placeholders and nothing of theirs home yet; `hpcbox collect`, from another process, waits for the
    jobs, says each point's return and brings its output folder where a multirun that waited puts it."""
    sweep_dir = own_project.root / "multirun" / "sent-sweep"
    sent = multirun(own_project, sweep_dir, "lr=3,5", "hydra.launcher.wait=false")
    said = sent.stdout + sent.stderr
    assert sent.returncode == 0, said
    array = re.search(r"array job (\d+) sent; its 2 returns are placeholders until collected", said)
    assert array is not None, said
    assert not list(sweep_dir.glob("*/result.json")), said
    collected = hpcbox(own_project.root, "collect", f"--sweep-dir={sweep_dir}", env=own_project.env)
    returned = re.findall(r"#(\d) : COMPLETED, returned ([0-9.]+) \(job (\d+_\d)\)", collected.stdout)
    assert returned == [("0", "30", f"{array[1]}_0"), ("1", "50", f"{array[1]}_1")], collected.stdout
    for point, lr in enumerate([3, 5]):
        home = sweep_dir / str(point)
        assert json.loads((home / "result.json").read_text()) == {"lr": lr, "scaled": lr * 10}
        assert (home / ".hydra" / "overrides.yaml").read_text() == f"- lr={lr}\n"


def picked_point(
    cluster, project: Path, env: dict[str, str], sweep_dir: Path, seconds: int, *launcher: str
) -> tuple[str, str, str]:
    """`python sweep.py -m` of one long point (``seconds`` steps of a second) in `preemptible` on node1
    of ``cluster`` (the ``launcher`` overrides say how it is reached), picked 5 s into its run by a job
    that needs node1: the point's job id, the picking job's, and what the multirun said once it
    returned (successfully)."""
    sweep = subprocess.Popen(
        [sys.executable, "sweep.py", "-m", "lr=1", f"+seconds={seconds}", "hydra/launcher=hpcbox", *launcher,
         "hydra.launcher.offline=true", "hydra.launcher.partition=preemptible",
         '+hydra.launcher.resources.extra=["--nodelist=node1"]', f"hydra.sweep.dir={sweep_dir}"],
        cwd=project, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        task = running_in_preemptible(cluster, sweep)  # the point's job
        time.sleep(5)  # into its steps
        higher = picks_node1(cluster)
        said, _ = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, said
    return task, higher, said


@pytest.mark.cluster
def test_a_hydra_point_preempted_then_at_its_time_limit_is_requeued_each_time_resumes_and_returns(
    own_project: OwnProject, minicluster
):
    """A point of `preemptible` on node1, picked by a `cpu` job that needs node1 while it runs: the
    runner checkpoints it at the grace time's end (the job script gives it the time limit's signal),
    Slurm requeues it, and the point runs again from its start beside the progress its first run kept
    in its output folder. That second run outlives its 2 minutes: at the time limit's signal (a minute
    before it) the runner checkpoints it again, the job script requeues it, and its third run finishes
    and returns: its third start, the multirun never told of either stop."""
    sweep_dir = own_project.root / "multirun" / "preempted-sweep"
    task, _, said = picked_point(
        minicluster, own_project.root, own_project.env, sweep_dir, 120,
        "hydra.launcher.cluster=local", "hydra.launcher.timeout_min=2",
    )  # fmt: skip
    # Each start's first step: each run carried on from where the one before had got to (a third run
    # slow to start may reach its own limit too).
    starts = [int(step) for step in (sweep_dir / "0" / "starts.txt").read_text().split()]
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(starts) >= 3, starts
    assert (sweep_dir / "0" / "done.txt").read_text() == "120", said
    assert re.search(rf"#0 : COMPLETED, returned {len(starts)}.0 \(job {re.escape(task)}\)", said), said
    runs = runs_in_accounting(minicluster, task)
    assert runs[0] == "PREEMPTED" and runs[-1] == "COMPLETED", runs
    log = next((own_project.root / "runs" / "local").glob(f"*/sweep-{task}.out")).read_text()
    assert "was preempted; the trainer checkpointed" in log, log
    assert "the trainer checkpointed before the time limit; requeueing job" in log, log


@pytest.mark.cluster
def test_a_hydra_point_picked_where_the_site_sends_the_users_signal_checkpoints_at_once_and_returns(
    own_project: OwnProject, run_id: str, minicluster_state: Path, tmp_path: Path, monkeypatch
):
    """A site that sends the user's signal at a preemption (a profile of the user's own that says so, a
    copy of `local`, rehearsed on a mini cluster of its own): a point of `preemptible` on node1, picked by
    a `cpu` job that needs node1, is checkpointed by its runner at the USR1 that comes with the pick, not
    at the grace time's end; Slurm requeues it and its next run goes on from the progress the first kept
    in its output folder and returns its second start. (A copy of the project without its ledger: the
    lane's later commands know no profile `usersig`.)"""
    own = user_signal_profile(tmp_path / "clusters")
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(own))
    project = tmp_path / "project"
    shutil.copytree(own_project.root, project, ignore=shutil.ignore_patterns(".hpcbox", "runs", "multirun"))
    spec = mc.spec_like("usersig", name=f"{run_id}-usersig", port=free_port())
    sweep_dir = project / "multirun" / "picked"
    try:
        cluster = mc.up(spec, minicluster_state)
        assert cluster.shape.send_user_signal
        env = {**own_project.env, "HPCBOX_CLUSTERS_DIR": str(own), "HPCBOX_MINICLUSTER": spec.name}
        task, higher, said = picked_point(
            cluster, project, env, sweep_dir, 45,
            "hydra.launcher.cluster=usersig", "hydra.launcher.via=local", "hydra.launcher.timeout_min=10",
        )  # fmt: skip
        starts = [int(step) for step in (sweep_dir / "0" / "starts.txt").read_text().split()]
        assert len(starts) == 2 and 0 == starts[0] < starts[1], starts  # the second went on
        assert (sweep_dir / "0" / "done.txt").read_text() == "45", said
        assert re.search(rf"#0 : COMPLETED, returned 2.0 \(job {re.escape(task)}\)", said), said
        runs = runs_in_accounting(cluster, task)
        assert runs == ["PREEMPTED", "COMPLETED"], runs
        log = next((project / "runs").glob(f"*/*/sweep-{task}.out")).read_text()
        assert "was preempted; the trainer checkpointed" in log, log
        started_within_grace(cluster, higher)  # checkpointed as it was picked
    finally:
        mc.down(spec.name, minicluster_state)


# The project's own tests, as its CI runs them: its job on a mini cluster of the test session
# (hpcbox's pytest plugin, hpcbox_cluster), its result fetched.
PROJECT_TEST = """\
import json


def test_the_job_completes_on_slurm_and_its_result_comes_back(hpcbox_cluster):
    assert hpcbox_cluster.slurm in hpcbox_cluster.run("sinfo --version").stdout
    job = hpcbox_cluster.submit(["--factor", "2"], data="data", offline=True, time="5")
    assert job.wait(timeout_s=300).state == "COMPLETED", job.describe()
    fetched = job.fetch()
    assert json.loads((fetched / "result.json").read_text())["mean"] == 5.0
    assert fetched.is_relative_to(hpcbox_cluster.folder)  # not over the project's own runs/local/
"""
# One that waits on a job held in the queue: the session is interrupted meanwhile.
PROJECT_TEST_WAITING = """\
def test_waits_on_a_held_job(hpcbox_cluster):
    job = hpcbox_cluster.submit(["--factor", "2"], data="data", offline=True, time="5", extra=["--hold"])
    print(f"waiting on job {job.job_id}", flush=True)
    job.wait(timeout_s=600)
"""
CLUSTER_UP = re.compile(r"hpcbox: mini cluster (hpcbox-pytest-[0-9a-f]{8}) is up \(like local, Slurm ")


class ProjectSession:
    """`pytest` run in the project as its CI would, its output read as it comes (one line may be awaited)."""

    def __init__(self, project: Path, env: dict[str, str], basetemp: Path, test_file: str) -> None:
        self.basetemp = basetemp
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", f"--basetemp={basetemp}",
             test_file],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=ctrl_c_as_in_a_terminal,
        )  # fmt: skip
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def await_line(self, pattern: str, timeout_s: float) -> re.Match:
        with self._seen:
            found = self._seen.wait_for(
                lambda: self.process.poll() is not None or re.search(pattern, self.output), timeout_s
            )
            match = re.search(pattern, self.output)
        assert found and match, f"no {pattern!r} in:\n{self.output}"
        return match

    def finish(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            # pytest's faulthandler prints every thread's stack on SIGABRT: where it hangs, in the output.
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self._reader.join(10)
            raise AssertionError(f"not ended after {timeout_s:.0f} s:\n{self.output}") from None
        self._reader.join(10)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def cluster(self) -> str:
        return CLUSTER_UP.search(self.output).group(1)


def ledger_of(root: Path) -> list[str]:
    """The project's own ledger's entries (none before its first job)."""
    folder = root / ".hpcbox" / "jobs"
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


def _left_of(cluster: str, *, remove: bool = False) -> list[str]:
    """Every container, network and volume of ``cluster`` (by its label, or its name) still there; with
    ``remove``, each removed (what a session killed by the test left)."""
    client = docker.client()
    labelled = {"label": f"io.hpcbox.minicluster={cluster}"}
    named = {"name": cluster}
    containers = [c for f in (labelled, named) for c in client.containers.list(all=True, filters=f)]
    networks = [n for f in (labelled, named) for n in client.networks.list(filters=f)]
    volumes = [v for f in (labelled, named) for v in client.volumes.list(filters=f)]
    found = sorted({each.name for each in (*containers, *networks, *volumes)})
    if remove:
        for container in {c.id: c for c in containers}.values():
            container.remove(force=True, v=True)
        for resource in {r.id: r for r in (*networks, *volumes)}.values():
            resource.remove()
    return found


@pytest.mark.cluster
def test_the_projects_own_pytest_rehearses_its_job_on_a_cluster_of_its_session_and_leaves_nothing(
    own_project: OwnProject, tmp_path: Path
):
    """The project's tests ask for `hpcbox_cluster` (hpcbox's pytest plugin, found through its entry
    point); sessions at once, as CI jobs on one machine: each brings up a mini cluster of its own, one
    submits, waits, fetches and passes, one is interrupted (SIGINT) while it waits on its job, and one is
    killed outright (SIGKILL: nothing of it can clean up) while it waits: the next session to start
    removes what that one left, and none of the others'. None leaves a container, network, volume or key
    behind, nor touches the project's own ledger."""
    root = own_project.root
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_on_slurm.py").write_text(PROJECT_TEST)
    (root / "tests" / "test_waiting.py").write_text(PROJECT_TEST_WAITING)
    with (root / "pyproject.toml").open("a") as pyproject:
        pyproject.write('\n[tool.pytest.ini_options]\nhpcbox_cluster = "local"\n')
    ledger = ledger_of(root)
    # As CI has it: no cluster named, no pytest of ours around it.
    env = {
        key: value
        for key, value in {**os.environ, **own_project.env}.items()
        if key not in ("HPCBOX_MINICLUSTER", "HPCBOX_MINICLUSTER_STATE") and not key.startswith("PYTEST_")
    }
    green = ProjectSession(root, env, tmp_path / "green", "tests/test_on_slurm.py")
    killed = ProjectSession(root, env, tmp_path / "killed", "tests/test_waiting.py")
    waiting = None
    try:
        killed.await_line(r"waiting on job \d+", timeout_s=600)
        killed.process.kill()
        killed.finish(60)
        assert _left_of(killed.cluster) != []  # what a killed session leaves, until the next one starts
        waiting = ProjectSession(root, env, tmp_path / "waiting", "tests/test_waiting.py")
        waiting.await_line(r"waiting on job \d+", timeout_s=600)
        reaped = f"hpcbox: removing mini cluster {killed.cluster}, left by a test session that ended"
        assert reaped in waiting.output, waiting.output
        assert _left_of(killed.cluster) == []
        assert not [path for path in killed.basetemp.rglob(killed.cluster)], "its keys are left"
        waiting.process.send_signal(signal.SIGINT)
        assert waiting.finish(300) == pytest.ExitCode.INTERRUPTED, waiting.output
        assert green.finish(600) == 0, green.output
    finally:
        for session in (green, killed, *([waiting] if waiting else [])):
            if session.process.poll() is None:
                session.process.kill()
            if session.process.returncode not in (0, pytest.ExitCode.INTERRUPTED) and CLUSTER_UP.search(
                session.output
            ):
                _left_of(session.cluster, remove=True)  # killed, or failed: its cluster goes with it
    assert "1 passed" in green.output, green.output
    assert "KeyboardInterrupt" in waiting.output, waiting.output
    assert len({green.cluster, killed.cluster, waiting.cluster}) == 3
    assert f"removing mini cluster {green.cluster}, left" not in waiting.output  # it ran meanwhile
    for session in (green, waiting):
        removed = f"hpcbox: removed mini cluster {session.cluster}: 5 containers"
        assert removed in session.output, session.output
        assert _left_of(session.cluster) == []
        assert not [path for path in session.basetemp.rglob(session.cluster)], "its keys are left"
    assert ledger_of(root) == ledger


@pytest.mark.cluster
def test_init_ci_writes_a_script_that_passes_for_the_project_and_names_the_job_that_fails_when_broken(
    own_project: OwnProject, tmp_path: Path
):
    """`hpcbox init --ci`, then its script run here as CI runs it (hpcbox installed into a fresh venv,
    no mini cluster of ours named): the project's job passes on a cluster of the run's own; with a bug
    in the training script the script fails, naming the job, how it ended and the traceback. Neither run
    leaves a container, network or volume behind."""
    root = own_project.root
    initialised = hpcbox(root, "init", "--ci", env=own_project.env)
    assert "added ci/hpcbox-ci.sh" in initialised.stdout, initialised.stdout
    pyproject = root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('args = []\ntime = "15"', 'args = ["--factor", "3"]\ntime = "5"')
    )
    env = {
        key: value
        for key, value in {**os.environ, **own_project.env}.items()
        if key not in ("HPCBOX_MINICLUSTER", "HPCBOX_MINICLUSTER_STATE", "PYTHONPATH", "VIRTUAL_ENV")
        and not key.startswith("PYTEST_")
    }
    env["HPCBOX_INSTALL"] = str(source_copy(tmp_path / "source"))

    def run_ci() -> tuple[subprocess.CompletedProcess[str], str]:
        done = subprocess.run(
            ["ci/hpcbox-ci.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        cluster = re.search(r"hpcbox: starting mini cluster (hpcbox-pytest-[0-9a-f]{8})", done.stderr)
        assert cluster, done.stdout + done.stderr
        assert _left_of(cluster[1]) == [], done.stderr
        return done, cluster[1]

    passed, first = run_ci()
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(
        r"hpcbox ci: passed: job 1: COMPLETED.*; 1 output file\(s\) came back to ", passed.stdout
    )
    results = Path(passed.stdout.strip().split(" came back to ")[-1])
    assert json.loads((results / "result.json").read_text())["mean"] == 16.5  # 1 to 10, times 3
    train = root / "train.py"
    train.write_text(
        train.read_text().replace("def main():", "def main():\n    raise RuntimeError('a bug')", 1)
    )
    try:
        failed, second = run_ci()
    finally:
        train.write_text(TRAIN)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    said = failed.stderr.splitlines()
    verdict = next(line for line in said if line.startswith("error: "))
    assert verdict.startswith("error: the CI rehearsal (like local) failed: job 1: FAILED"), failed.stderr
    assert "RuntimeError: a bug" in failed.stderr[: failed.stderr.index(verdict)], (
        failed.stderr
    )  # its log's end
    assert first != second


# A notebook as researchers leave it: a shell escape, its computation, a plot.
NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5, "metadata": {},
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# The mean of the numbers"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 1,
         "source": ["!pip install numpy"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 2, "source": [
            "import json, sys\n", "from pathlib import Path\n", "import numpy\n",
            "data, out = Path(sys.argv[1]), Path(sys.argv[2])\n",
            "numbers = numpy.loadtxt(data / 'numbers.txt')\n",
        ]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 3, "source": [
            "import matplotlib.pyplot as plt\n", "plt.plot(numbers)\n", "plt.show()",
        ]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 4, "source": [
            "out.mkdir(parents=True, exist_ok=True)\n",
            "(out / 'mean.json').write_text(json.dumps({'mean': float(numbers.mean())}))",
        ]},
    ],
}  # fmt: skip


@pytest.mark.cluster
def test_a_notebook_becomes_the_program_a_job_runs(
    run_id: str, minicluster, minicluster_state: Path, tmp_path: Path
):
    """`hpcbox init --from-notebook`: the notebook's code, less what a batch job cannot run, is the
    program; submitted to the mini cluster, it computes on the staged data and its output comes home."""
    root = tmp_path / "notebook-project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "numbers.txt").write_text("2\n4\n6\n")
    (root / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    (root / "requirements.txt").write_text("numpy\n")
    env = {
        "HPCBOX_IMAGE_REPOSITORY": f"{run_id}/notebook-project",
        "HPCBOX_MINICLUSTER": minicluster.name,
        "HPCBOX_MINICLUSTER_STATE": str(minicluster_state),
        "HPCBOX_CACHE": str(tmp_path / "cache"),
    }
    made = hpcbox(root, "init", "--from-notebook=analysis.ipynb", "--args={data_dir} {output_dir}", env=env)
    assert "analysis.py: cell 2 kept out as comments: a shell escape" in made.stdout, made.stdout
    assert "analysis.py: cell 4 kept out as comments: it shows a plot" in made.stdout, made.stdout
    assert 'script = "analysis.py"' in (root / "pyproject.toml").read_text()
    hpcbox(root, "lock", "--pip-only", env=env)
    try:
        submitted = hpcbox(
            root, "submit", "--cluster=local", "--offline", "--data=data", "--time=10", env=env
        )
        job_id = submitted.stdout.strip().splitlines()[-1]
        followed = hpcbox(root, "logs", "--follow", "-j", job_id, env=env)
        assert "exited with status 0" in followed.stdout, followed.stdout
        fetched = Path(hpcbox(root, "fetch", "-j", job_id, env=env).stdout.strip())
        assert json.loads((fetched / "mean.json").read_text()) == {"mean": 4.0}
    finally:
        for image in docker.client().images.list(name=f"{run_id}/notebook-project*"):
            for tag in image.tags:
                docker.remove_image(tag)


def source_copy(folder: Path) -> Path:
    """hpcbox's source, as a clone has it, copied to ``folder``: what pip installs from."""
    anywhere = shutil.ignore_patterns(".git", ".venv", ".hpcbox", "*.egg-info", "__pycache__")

    def left_out(parent: str, names: list[str]) -> set[str]:
        # setuptools' build/ and the runs/ of the checkout, not the package's own build stage
        at_root = {"build", "runs"} & set(names) if Path(parent) == REPO else set()
        return set(anywhere(parent, names)) | at_root

    shutil.copytree(REPO, folder, ignore=left_out)
    return folder


def test_pip_install_into_a_fresh_venv_gives_a_working_hpcbox_command(tmp_path: Path):
    source = source_copy(tmp_path / "source")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Nothing of this environment leaks in: not its packages, not a source tree on PYTHONPATH.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(venv / "bin/pip"), "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    shutil.rmtree(source)  # what runs from now on is what the wheel installed
    program = str(venv / "bin/hpcbox")
    helped = subprocess.run([program, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: hpcbox ")
    listed = subprocess.run([program, "--list"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert {"init", "build", "sif", "sbatch", "submit", "fetch", "cluster.up"} <= {
        line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()
    }
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "requirements.txt").write_text("numpy\n")
    initialised = subprocess.run([program, "init"], capture_output=True, text=True, env=env, cwd=project)
    assert initialised.returncode == 0, initialised.stderr
    assert "added docker/Dockerfile" in initialised.stdout  # from the installed package's data
    script = subprocess.run(
        [program, "sbatch", "--cluster=edi", "--gpus=1", "--time=1:00:00"],
        capture_output=True, text=True, env=env, cwd=project, check=False,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("#!/bin/bash") and "#SBATCH --partition=" in script.stdout
    assert "/code/train.py" in script.stdout
