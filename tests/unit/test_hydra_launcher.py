"""hpcbox's Hydra launcher, short of a cluster: Hydra finds it, and a job it sends (a configuration
composed on the laptop, the task function by name) runs in a fresh Python as on a node, through the
same runner the jobs run, and comes back as Hydra's JobReturn. The launcher's multirun on the mini
cluster: tests/integration/test_own_project.py."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcbox.submitit.executor import RUN_HYDRA_JOB, RUNNER

TRAIN = '''\
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    if cfg.lr < 0:
        raise ValueError(f"lr {cfg.lr} is negative")
    output = Path(HydraConfig.get().runtime.output_dir)
    if cfg.lr == 0:  # a job that runs until it is stopped the first time: each run noted in its output
        runs = output / "runs.txt"
        runs.write_text((runs.read_text() if runs.exists() else "") + "run\\n")
        if len(runs.read_text().split()) == 1:
            Path(os.environ["READY"]).write_text("")
            time.sleep(60)
        return len(runs.read_text().split())
    (output / "trained.txt").write_text(f"{cfg.model}@{cfg.lr}")
    return cfg.lr * 2


def send(folder: Path, lrs: list[str]) -> None:
    """What the launcher does with each point, up to the pickles the job takes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.utils import JobRuntime
    from hpcbox.project.config import load_project
    from hpcbox.submitit.executor import NodeFunction, pickle_call, script_module
    from hydra_plugins.hydra_hpcbox_launcher.hpcbox_launcher import _portable

    JobRuntime.instance().set("name", "train")
    overrides = ["hydra/launcher=hpcbox"]
    if os.environ.get("THIRD_PARTY_SWEEPER"):
        import third_party_sweeper  # noqa: F401 - its config is stored as a sweeper plugin's would be

        overrides.append("hydra/sweeper=third_party")
    with initialize_config_dir(config_dir=str(Path(__file__).with_name("conf")), version_base=None):
        for index, lr in enumerate(lrs):
            config = compose("config", [f"lr={lr}", *overrides], return_hydra_config=True)
            config.hydra.job.num = index
            call = (NodeFunction("run_hydra_job", "run"), (main, _portable(config), "train"), {})
            project = load_project(Path(__file__).parent)
            pickled, by_value = pickle_call(call, project, script=script_module(project))
            assert not by_value
            (folder / f"call-{index}.pkl").write_bytes(pickled)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
'''


# A sweeper plugin's structured config, from a module the laptop has and the node does not.
THIRD_PARTY_SWEEPER = """\
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class ThirdPartySweeperConf:
    _target_: str = "third_party_sweeper.ThirdPartySweeper"
    n_trials: int = 3


ConfigStore.instance().store(group="hydra/sweeper", name="third_party", node=ThirdPartySweeperConf)
"""


# The node's Python has Hydra and the project's code, and nothing of hpcbox: the runner runs with those
# imports refused, so that nothing of the launcher travels in the pickles.
AS_ON_A_NODE = """
import runpy, sys

class NotOnTheNode:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hpcbox", "hydra_plugins"):
            raise ModuleNotFoundError(f"no {name} on the node")

sys.meta_path.insert(0, NotOnTheNode())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_hydra_finds_the_launcher_and_its_config(tmp_path: Path):
    app = tmp_path / "app"
    (app / "conf").mkdir(parents=True)
    (app / "conf" / "config.yaml").write_text("lr: 0.1\n")
    (app / "show.py").write_text(
        "import hydra\nfrom hydra.core.hydra_config import HydraConfig\n"
        "@hydra.main(version_base=None, config_path='conf', config_name='config')\n"
        "def main(cfg):\n    print(HydraConfig.get().launcher)\n"
        "main()\n"
    )
    shown = subprocess.run(
        [sys.executable, "show.py", "hydra/launcher=hpcbox", "hydra.launcher.cluster=edi"],
        capture_output=True, text=True, cwd=app,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "'_target_': 'hydra_plugins.hydra_hpcbox_launcher.hpcbox_launcher.HpcboxLauncher'" in shown.stdout
    assert "'cluster': 'edi'" in shown.stdout and "'array_parallelism': 256" in shown.stdout
    raced = subprocess.run(
        [sys.executable, "show.py", "hydra/launcher=hpcbox", "hydra.launcher.cluster='edi,mila'"],
        capture_output=True, text=True, cwd=app,
    )  # fmt: skip
    assert "'cluster': 'edi,mila'" in raced.stdout, raced.stderr  # one value, the executor's race of two
    misspelt = subprocess.run(
        [sys.executable, "show.py", "hydra/launcher=hpcbox", "hydra.launcher.clustr=edi"],
        capture_output=True, text=True, cwd=app,
    )  # fmt: skip
    assert misspelt.returncode == 1 and "Key 'clustr' not in 'HpcboxLauncherConf'" in misspelt.stderr


def send_to_a_node(tmp_path: Path, lrs: list[str], sweeper: bool = False) -> tuple[list[str], dict[str, str]]:
    """The jobs of a multirun over ``lrs`` (with a third-party ``sweeper``'s config) sent as the launcher
    sends them, and a node's Python to run them with: the runner's command line up to the output folder
    and job index, and its environment."""
    project = tmp_path / "project"
    (project / "conf").mkdir(parents=True)
    (project / "conf" / "config.yaml").write_text("lr: 0.1\nmodel: resnet\n")
    (project / "train.py").write_text(TRAIN)
    (project / "third_party_sweeper.py").write_text(THIRD_PARTY_SWEEPER)
    (project / "pyproject.toml").write_text('[project]\nname = "app"\n[tool.hpcbox]\ncode = ["train.py"]\n')
    data = tmp_path / "data"
    data.mkdir()
    sent = subprocess.run(
        [sys.executable, "train.py", "send", str(data), *lrs], capture_output=True, text=True, cwd=project,
        env={**os.environ, "THIRD_PARTY_SWEEPER": "1" if sweeper else ""},
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    for module in (RUNNER, RUN_HYDRA_JOB):
        shutil.copyfile(module, data / module.name)
    node = tmp_path / "node"
    shutil.copytree(project, node / "code", ignore=shutil.ignore_patterns("conf", "*.toml", "third_party_*"))
    env = {**os.environ, "PYTHONPATH": str(node / "code"), "SLURM_ARRAY_JOB_ID": "77"}
    return [sys.executable, "-c", AS_ON_A_NODE, str(data / RUNNER.name), str(data)], env


def run_on_the_node(runner: list[str], env: dict[str, str], out: Path, index: int) -> subprocess.Popen:
    out.mkdir(exist_ok=True)
    return subprocess.Popen(
        [*runner, str(out), str(index)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=out.parent / "node", env={**env, "SLURM_ARRAY_TASK_ID": str(index)},
    )  # fmt: skip


def test_a_job_runs_by_name_in_a_fresh_python_and_returns_hydras_job_return(tmp_path: Path):
    runner, env = send_to_a_node(tmp_path, ["0.5", "-1"])
    returns = []
    for index in (0, 1):
        out = tmp_path / f"out-{index}"
        ran = run_on_the_node(runner, env, out, index)
        said, _ = ran.communicate(timeout=60)
        assert ran.returncode == 0, said
        outcome, returned = pickle.loads((out / "result.pkl").read_bytes())
        assert outcome == "success"
        returns.append((out, returned))
    (out, completed), (failed_out, failed) = returns
    assert completed.return_value == 1.0 and completed.status.name == "COMPLETED"
    assert completed.overrides == ["lr=0.5"]
    assert completed.hydra_cfg.hydra.job.id == "77_0" and completed.hydra_cfg.hydra.job.num == 0
    assert (out / "trained.txt").read_text() == "resnet@0.5"
    assert "lr: 0.5" in (out / ".hydra" / "config.yaml").read_text()
    assert failed.status.name == "FAILED"
    with pytest.raises(ValueError, match="lr -1 is negative") as raised:
        failed.return_value  # noqa: B018 - Hydra's sweeper reads it so, and raises the job's error
    (note,) = raised.value.__notes__
    assert note.startswith("its traceback on the node:\n") and 'code/train.py", line 14, in main' in note
    assert not (failed_out / "trained.txt").exists()


def test_a_job_stopped_at_its_time_limit_runs_again_from_its_start_and_returns(tmp_path: Path):
    """The time limit's signal (USR1; a preemption's too, as the job script passes it on) mid-job: the
    runner checkpoints the job's call and exits 75, on which the job script requeues it; the next run
    makes that call, the same job from its start (as hydra-submitit-launcher's), beside what the first
    wrote in the job's output folder, and returns."""
    runner, env = send_to_a_node(tmp_path, ["0"])
    env["READY"] = str(tmp_path / "ready")
    out = tmp_path / "out-0"
    first = run_on_the_node(runner, env, out, 0)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.05)
    first.send_signal(signal.SIGUSR1)
    said, _ = first.communicate(timeout=60)
    assert first.returncode == 75 and "the call checkpointed before the time limit" in said, said
    assert (out / "checkpoint.pkl").is_file() and not (out / "result.pkl").exists()
    again = run_on_the_node(runner, env, out, 0)
    said, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and "resuming the call from its checkpoint" in said, said
    outcome, returned = pickle.loads((out / "result.pkl").read_bytes())
    assert outcome == "success" and returned.status.name == "COMPLETED", said
    assert returned.return_value == 2 and returned.overrides == ["lr=0"]  # its second run, which returned


def test_a_third_party_sweepers_config_travels_without_its_plugin_on_the_node(tmp_path: Path):
    """A sweeper plugin's structured config (as Optuna's or Nevergrad's) is composed on the laptop, where
    the plugin is; the node, without it, reads the job's configuration with that node made plain."""
    runner, env = send_to_a_node(tmp_path, ["0.5"], sweeper=True)
    out = tmp_path / "out-0"
    ran = run_on_the_node(runner, env, out, 0)
    said, _ = ran.communicate(timeout=60)
    assert ran.returncode == 0, said
    outcome, returned = pickle.loads((out / "result.pkl").read_bytes())
    assert outcome == "success" and returned.return_value == 1.0, returned
    sweeper = returned.hydra_cfg.hydra.sweeper
    assert (sweeper._target_, sweeper.n_trials) == ("third_party_sweeper.ThirdPartySweeper", 3)
