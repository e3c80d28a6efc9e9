"""hpcbox.submitit without a cluster: parameters as submitit names them, the Python-version rule on
both of its sides, the call's runner, and bad input that leaves nothing behind. Its jobs on the mini
cluster: tests/integration/test_executor.py."""

from __future__ import annotations

import operator
import pickle
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.submitit.executor import (
    RUNNER,
    VALID_PARAMETERS,
    Executor,
    environment_python,
    hpcbox_resources,
    pickle_call,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "docker" / "lock").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "calls"\n')
    return root


def pin_python(root: Path, version: str) -> None:
    (root / "docker" / "lock" / "apt-system.txt").write_text(
        f"python3={version}.5-1\npython3-venv={version}.5-1\n"
    )


def test_submitits_generic_parameters_become_hpcbox_resources_and_a_misspelt_one_is_refused():
    assert hpcbox_resources(
        {
            "timeout_min": 90,
            "mem_gb": 1.5,
            "cpus_per_task": 4,
            "gpus_per_node": 2,
            "name": "x",
            "qos": "short",
        }
    ) == {"time": "90", "mem": "1536M", "cpus": 4, "gpus": 2, "job_name": "x", "qos": "short"}
    with pytest.raises(FieldError) as refused:
        hpcbox_resources({"timeout_mins": 5})
    assert refused.value.field == "timeout_mins"
    assert f"allowed: {', '.join(VALID_PARAMETERS)})" in refused.value.message
    assert "timeout_min" in VALID_PARAMETERS and "gpu_type" in VALID_PARAMETERS


def add_here(a, b):
    return a + b


def test_a_function_of_an_importable_module_travels_by_reference_whatever_the_environments_python(project):
    from hpcbox.project.config import load_project

    pin_python(project, "3.99")
    pickled, by_value = pickle_call((operator.add, (1, 2), {}), load_project(project))
    assert by_value is False
    function, args, kwargs = pickle.loads(pickled)
    assert function(*args, **kwargs) == 3


def test_a_function_of_main_travels_by_value_only_to_the_same_python(project, tmp_path: Path):
    """Both sides of the rule, in a process whose `__main__` defines the function, as a script's does."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    script = f"""
from pathlib import Path
from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project
from hpcbox.submitit.executor import pickle_call

def square(x):
    return x * x

try:
    pickled, by_value = pickle_call((square, (7,), {{}}), load_project(Path({str(project)!r})))
    print("by value" if by_value else "by reference", len(pickled))
except HpcboxError as error:
    print("refused:", error.message)
"""
    pin_python(project, "3.99")
    refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.startswith(
        f"refused: square travels by value (defined in a script, a notebook or a function), which needs "
        f"the same Python on both sides: this is {platform.python_version()}, the environment's is 3.99"
    )
    pin_python(project, here)
    sent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert sent.stdout.startswith("by value ")


def test_the_environments_python_is_the_one_the_image_lock_pins():
    from hpcbox.project.config import load_project

    lock = (REPO / "docker" / "lock" / "apt-system.txt").read_text()
    assert environment_python(load_project(REPO)) in lock.split("python3=", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("raises", [False, True])
def test_the_runner_writes_what_the_call_returned_or_raised(tmp_path: Path, raises: bool):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir(), out.mkdir()
    call = (operator.truediv, (1, 0 if raises else 4), {})
    (data / "call-3.pkl").write_bytes(pickle.dumps(call, protocol=4))
    ran = subprocess.run(
        [sys.executable, str(RUNNER), str(data), str(out), "3"], capture_output=True, text=True
    )
    outcome = pickle.loads((out / "result.pkl").read_bytes())
    if raises:
        assert ran.returncode == 1 and "ZeroDivisionError" in ran.stderr
        assert outcome[0] == "error" and outcome[1] == "ZeroDivisionError: division by zero"
        assert "Traceback (most recent call last)" in outcome[2]
    else:
        assert ran.returncode == 0 and outcome == ("success", 0.25)
    assert sorted(path.name for path in out.iterdir()) == ["result.pkl"]


def test_bad_input_leaves_no_call_folder_and_no_job(project: Path, tmp_path: Path):
    executor = Executor(tmp_path / "calls", "edi", project=project)
    executor.update_parameters(partition="nope")
    with pytest.raises(FieldError, match="partition: 'nope' is not a partition"):
        executor.submit(operator.add, 1, 2)
    with pytest.raises(FieldError, match="runs a call as one process on one node"):
        executor.update_parameters(partition=None, nodes=2)
        executor.map_array(operator.add, [1], [2])
    assert not any((tmp_path / "calls").glob("*"))
    assert not (project / ".hpcbox").exists()


def test_a_batchs_jobs_are_placeholders_until_its_end(project: Path, tmp_path: Path):
    executor = Executor(tmp_path / "calls", "edi", project=project)
    with pytest.raises(HpcboxError, match="submitted at the end of its"), executor.batch():
        executor.submit(operator.add, 1, 2).job_id  # noqa: B018
    with pytest.raises(HpcboxError, match="parameters cannot change inside"), executor.batch():
        executor.update_parameters(timeout_min=5)


CHECKPOINTABLE = """
import time, types


class Counter:
    def __init__(self):
        self.counted, self.runs = 0, 0

    def __call__(self, steps):
        self.runs += 1
        print("counting", flush=True)
        while self.counted < steps:
            time.sleep(0.01)
            self.counted += 1
        return self.counted, self.runs

    def __submitit_checkpoint__(self, steps):
        return types.SimpleNamespace(function=self, args=(steps,), kwargs={})
"""


def test_at_the_time_limits_signal_a_checkpointable_call_checkpoints_and_the_next_run_resumes(tmp_path: Path):
    data, out, code = tmp_path / "data", tmp_path / "out", tmp_path / "code"
    for folder in (data, out, code):
        folder.mkdir()
    (code / "counting.py").write_text(CHECKPOINTABLE)
    sys.path.insert(0, str(code))
    try:
        from counting import Counter  # type: ignore[import-not-found]

        (data / "call-0.pkl").write_bytes(pickle.dumps((Counter(), (200,), {}), protocol=4))
    finally:
        sys.path.remove(str(code))
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, str(RUNNER), str(data), str(out), "0"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline() == "counting\n"
    time.sleep(0.3)  # a few steps counted
    first.send_signal(signal.SIGUSR1)  # what the job script passes on at the time limit's signal
    _, said = first.communicate(timeout=30)
    assert first.returncode == 75, said  # checkpointed: the job script requeues the job
    assert "hpcbox: the call checkpointed before the time limit" in said
    assert sorted(path.name for path in out.iterdir()) == ["checkpoint.pkl"]
    stopped_at = pickle.loads((out / "checkpoint.pkl").read_bytes())
    assert 0 < stopped_at[0].counted < 200
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "resuming the call from its checkpoint" in second.stderr
    assert pickle.loads((out / "result.pkl").read_bytes()) == ("success", (200, 2))


EXPERIMENT = """
from pathlib import Path
from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project
from hpcbox.submitit.executor import pickle_call, script_module


class Scaled:
    def __init__(self, factor):
        self.factor = factor


def square(x, scaled):
    return x * x * scaled.factor


def main():
    try:
        project = load_project(Path(__file__).parents[1])
        pickled, by_value = pickle_call((square, (7, Scaled(2)), {}), project, script=script_module(project))
    except HpcboxError as error:
        print("refused:", error.message)
        return
    print("by value" if by_value else "by reference")
    Path(__file__).with_name("call-0.pkl").write_bytes(pickled)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_the_running_scripts_functions_travel_by_name_where_the_project_ships_it_and_it_guards_its_run(
    project: Path, tmp_path: Path, guarded: bool
):
    """As the Hydra launcher sends a task function: a script of the project's code, run as `python
    experiments/run.py`, sends its own function and class by name; the node imports the script as a
    module (`experiments.run`, under /code) instead of needing the same Python. A script that would run
    on import (no `__main__` guard) is not imported: by value, refused to another Python."""
    pin_python(project, "3.99")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "calls"\n[tool.hpcbox]\ncode = ["experiments"]\n'
    )
    script = project / "experiments" / "run.py"
    script.parent.mkdir()
    script.write_text(EXPERIMENT + ('if __name__ == "__main__":\n    main()\n' if guarded else "main()\n"))
    sent = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    if not guarded:
        assert sent.stdout.startswith("refused: square travels by value"), sent.stdout
        return
    assert sent.stdout == "by reference\n"
    # The node: a fresh Python with the code snapshot (experiments/ under its own name) on its path.
    node = tmp_path / "node"
    shutil.copytree(project / "experiments", node / "code" / "experiments")
    ran = subprocess.run(
        [sys.executable, "-c", f"import pickle; f, a, k = pickle.load(open({str(script.with_name('call-0.pkl'))!r}, 'rb')); print(f.__module__, f(*a, **k))"],  # noqa: E501
        capture_output=True, text=True, cwd=node, env={"PYTHONPATH": str(node / "code")},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "experiments.run 98\n"


def test_an_executor_of_several_clusters_races_them_and_a_login_given_for_one_is_refused(project: Path):
    raced = Executor(project / "calls", "edi, mila", project=project)
    assert [site.name for site in raced.sites] == ["edi", "mila"] and raced.site is raced.sites[0]
    assert [site.name for site in Executor(project / "calls", ["edi", "m3"], project=project).sites] == [
        "edi", "m3",
    ]  # fmt: skip
    for given in ({"host": "login.example.org"}, {"port": 2222}):
        with pytest.raises(FieldError) as refused:
            Executor(project / "calls", "edi,mila", project=project, **given)
        assert refused.value.message == f"{next(iter(given))}: a login goes with one cluster, not a race"
    with pytest.raises(FieldError, match="names an empty cluster"):
        Executor(project / "calls", "edi,", project=project)
    assert not (project / "calls").exists()
