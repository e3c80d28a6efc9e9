"""hpcbox.submitit on the mini cluster: functions of the project's code run in its environment SIF as
jobs, through hpcbox's Executor and through submitit's own AutoExecutor, from a script of their own
(a process with nothing of the tests loaded, as a user's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox import jobs
from hpcbox.project.config import load_project
from hpcbox.tools import ssh
from tests.fixtures.submitting import TRAINER_CLASS, Setup

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# The project's own code: these travel by reference, whatever Python the environment runs.
CALLS = """\
import os
import time


def add(a, b):
    return a + b


def fail(message):
    raise ValueError(message)


def hog(megabytes):
    held = bytearray(megabytes * 2**20)
    for start in range(0, len(held), 4096):
        held[start] = 1
    return len(held)


def nap(seconds, value):
    time.sleep(seconds)
    return value


def say_then_nap(seconds, value):
    print(f"napping for {seconds} s", flush=True)
    time.sleep(seconds)
    return value


def where():
    return os.environ.get("SLURM_JOB_ID"), os.getcwd()
"""


@pytest.fixture(scope="module")
def calls_project(setup: Setup, tmp_path_factory) -> Path:
    """The session's project with `hpctrain.calls` in its code, its last build the session's (cpu)."""
    project_dir = tmp_path_factory.mktemp("executor") / "project"
    shutil.copytree(setup.project_dir, project_dir, ignore=shutil.ignore_patterns(".hpcbox", "runs"))
    shutil.copytree(setup.project_dir / ".hpcbox" / "images", project_dir / ".hpcbox" / "images")
    (project_dir / "src" / "hpctrain" / "calls.py").write_text(CALLS)
    return project_dir


@pytest.fixture(autouse=True)
def jobs_end_with_their_test(calls_project: Path, minicluster) -> Iterator[None]:
    """Every job of this module's project ends with the test that sent it, passed or failed: a script
    that died leaves none running on the session's cluster for the next tests to wait behind."""
    yield
    sent = [record.job_id for record in jobs.Ledger(load_project(calls_project)).all()]
    if sent:  # scancel of a job that has ended says so and changes nothing
        minicluster.exec("controller", ["scancel", *sent])


def run_script(body: str, project_dir: Path, setup: Setup) -> dict:
    """``body`` run as a script in the project (its code importable, as in a user's checkout); the
    last line it prints is JSON."""
    script = "import json, sys\nsys.path.insert(0, 'src')\n" + textwrap.dedent(body)
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=project_dir, env={**os.environ, **setup.env},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    return json.loads(ran.stdout.splitlines()[-1])


def test_a_function_returns_its_value_and_map_array_of_20_is_one_array_job_in_order(
    calls_project: Path, setup: Setup, tmp_path: Path, minicluster
):
    found = run_script(
        f"""
        import submitit
        from hpcbox.submitit import Executor
        from hpctrain.calls import add, where

        executor = Executor({str(tmp_path / "calls")!r}, "local")
        executor.update_parameters(timeout_min=10, name="executor-test")
        one = executor.submit(add, 2, 3)
        inside = executor.submit(where)
        mapped = executor.map_array(add, range(20), range(100, 120))
        auto = submitit.AutoExecutor({str(tmp_path / "auto")!r}, cluster="hpcbox", hpcbox_cluster="local")
        auto.update_parameters(timeout_min=10)
        through_submitit = auto.submit(add, "a", "b")
        print(json.dumps({{
            "one": [one.job_id, one.result(), one.state, one.done()],
            "inside": inside.result(),
            "mapped": [[job.job_id, job.result()] for job in mapped],
            "auto": [type(through_submitit).__name__, isinstance(through_submitit, submitit.Job),
                     through_submitit.result()],
        }}))
        """,
        calls_project,
        setup,
    )
    job_id, value, state, done = found["one"]
    assert (value, state, done) == (5, "COMPLETED", True)
    record = jobs.Ledger(load_project(calls_project)).find(job_id, "local")
    assert record.resources["job_name"] == "executor-test" and record.resources["time_s"] == 600
    slurm_job, working = found["inside"]
    assert slurm_job is not None and working  # it ran as a Slurm job, in its container
    ids = [job_id for job_id, _ in found["mapped"]]
    assert len({job_id.split("_")[0] for job_id in ids}) == 1  # one array job
    assert ids == [f"{ids[0].split('_')[0]}_{task}" for task in range(20)]
    assert [value for _, value in found["mapped"]] == [100 + 2 * i for i in range(20)]
    assert found["auto"] == ["HpcboxJob", True, "ab"]
    # What a wait peeks at between its looks at Slurm: the exit status each one's run folder keeps.
    array = jobs.Ledger(load_project(calls_project)).find(ids[0].split("_")[0], "local")
    with ssh.Connection(minicluster.ssh_target()) as connection:
        assert jobs.exits_kept(connection, [record, array]) == {job_id, *ids}


def test_an_exception_comes_back_with_its_traceback_and_a_job_without_a_result_says_how_it_ended(
    calls_project: Path, setup: Setup, tmp_path: Path
):
    found = run_script(
        f"""
        import time
        from submitit.core.utils import FailedJobError, UncompletedJobError
        from hpcbox.submitit import Executor
        from hpctrain.calls import fail, hog, nap

        executor = Executor({str(tmp_path / "calls")!r}, "local")
        executor.update_parameters(timeout_min=10)
        failing = executor.submit(fail, "boom from the node")
        executor.update_parameters(mem_gb=0.25)
        greedy = executor.submit(hog, 2048)
        executor.update_parameters(mem_gb=0.5)
        sleeper = executor.submit(nap, 600, "never")
        while sleeper.state != "RUNNING":
            time.sleep(1)
        sleeper.cancel()
        said = {{}}
        for name, job in (("failing", failing), ("greedy", greedy), ("sleeper", sleeper)):
            try:
                job.result()
            except FailedJobError as error:
                said[name] = ["FailedJobError", str(error)]
            except UncompletedJobError as error:
                said[name] = ["UncompletedJobError", str(error)]
        said["exception"] = type(failing.exception()).__name__
        print(json.dumps(said))
        """,
        calls_project,
        setup,
    )
    kind, message = found["failing"]
    assert kind == "FailedJobError" and "ValueError: boom from the node" in message
    raised_at = CALLS.splitlines().index("    raise ValueError(message)") + 1
    assert f'hpctrain/calls.py", line {raised_at}, in fail' in message  # the traceback from the node
    assert found["exception"] == "FailedJobError"
    kind, message = found["greedy"]
    assert kind == "UncompletedJobError" and "without a result" in message
    assert "OUT_OF_MEMORY" in message or "memory" in message, message
    kind, message = found["sleeper"]
    assert kind == "UncompletedJobError" and "ended CANCELLED" in message, message


def test_one_task_of_an_array_is_cancelled_while_the_others_return_and_a_job_is_found_again_later(
    calls_project: Path, setup: Setup, tmp_path: Path
):
    """Each task of a map_array is a job of its own: the long one's log is read while it runs, it alone
    is cancelled, the other two return. Then a job whose result the submitting process never asked for
    is found again from the executor's folder in a new process (and another from its pickle), and
    returns."""
    folder = str(tmp_path / "calls")
    found = run_script(
        f"""
        import pickle, time
        from submitit.core.utils import UncompletedJobError
        from hpcbox.submitit import Executor
        from hpctrain.calls import add, say_then_nap

        executor = Executor({folder!r}, "local")
        executor.update_parameters(timeout_min=10)
        tasks = executor.map_array(say_then_nap, [3, 600, 3], ["first", "never", "third"])
        started = time.monotonic()
        while "napping for 600 s" not in (tasks[1].stdout() or ""):  # its log, read while it runs
            assert time.monotonic() - started < 300, tasks[1].state
            time.sleep(1)
        live = [tasks[1].state, tasks[1].stdout()]
        tasks[1].cancel()
        returned = [tasks[0].result(), tasks[2].result()]
        try:
            tasks[1].result()
            raised = None
        except UncompletedJobError as error:
            raised = str(error)
        later = executor.submit(add, 40, 2)
        print(json.dumps({{
            "ids": [task.job_id for task in tasks], "live": live, "returned": returned, "raised": raised,
            "states": [task.state for task in tasks], "later": later.job_id,
            "pickled": pickle.dumps(tasks[2]).hex(),
        }}))
        """,
        calls_project,
        setup,
    )
    state, log = found["live"]
    assert state == "RUNNING" and "napping for 600 s\n" in log
    assert found["returned"] == ["first", "third"]
    assert f"job {found['ids'][1]} ended CANCELLED" in found["raised"]
    assert found["states"] == ["COMPLETED", "CANCELLED", "COMPLETED"]
    array = jobs.Ledger(load_project(calls_project)).find(found["ids"][0].split("_")[0], "local")
    assert array.resources["array"] == "0-2%256"  # submitit's throttle by default
    again = run_script(
        f"""
        import pickle
        from hpcbox.submitit import Job

        later = Job({folder!r}, {found["later"]!r})
        unpickled = pickle.loads(bytes.fromhex({found["pickled"]!r}))
        print(json.dumps({{"later": [later.result(), later.state], "unpickled": unpickled.result()}}))
        """,
        calls_project,
        setup,
    )
    assert again == {"later": [42, "COMPLETED"], "unpickled": "third"}


def test_a_notebook_submits_a_function_and_a_later_cell_gets_its_result(
    calls_project: Path, setup: Setup, monkeypatch: pytest.MonkeyPatch
):
    """A real kernel (nbclient, ipykernel) runs the notebook's cells in turn, as JupyterLab on a laptop
    would: the first submits, the second waits for the result."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "import sys\nsys.path.insert(0, 'src')\nfrom hpcbox.submitit import Executor\n"
            "from hpctrain.calls import add\n"
            "executor = Executor('notebook-calls', 'local')\nexecutor.update_parameters(timeout_min=10)\n"
            "job = executor.submit(add, 40, 2)\nprint('submitted', job.job_id)"
        ),
        nbformat.v4.new_code_cell("print('result', job.result())"),
    ]
    for name, value in setup.env.items():  # the kernel's environment is this process's
        monkeypatch.setenv(name, value)
    NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(calls_project)}}).execute()
    said = [
        "".join(
            output.text for output in cell.outputs if output.get("name") == "stdout"
        )  # not hpcbox's progress
        for cell in notebook.cells
    ]
    assert said[0].startswith("submitted "), said
    job_id = said[0].split()[1].strip()
    assert said[1] == "result 42\n", said
    record = jobs.Ledger(load_project(calls_project)).find(job_id, "local")
    assert record.resources["job_name"] == "add"  # a call's job is named after its function


# A script as submitit's docs write one: its functions and a Checkpointable defined in it, no main guard,
# submitit's own AutoExecutor; only the cluster is hpcbox's. Its Checkpointable: TRAINER_CLASS.
DOCS_SCRIPT = (
    """\
import json
import sys
import time

import submitit


def add(a, b):
    return a + b


def fail(message):
    raise ValueError(message)


"""
    + TRAINER_CLASS
    + """


executor = submitit.AutoExecutor(folder=sys.argv[1], cluster="hpcbox", hpcbox_cluster="local")
executor.update_parameters(timeout_min=10)
job = executor.submit(add, 5, 7)
jobs = executor.map_array(add, [1, 2, 3], [10, 20, 30])
failing = executor.submit(fail, "boom from the node")
with executor.batch():
    batched = [executor.submit(add, n, n) for n in range(3)]
echoed = executor.submit(submitit.helpers.CommandFunction(["echo", "from", "the", "node"]))
sleepers = executor.map_array(time.sleep, [600, 1, 2])
executor.update_parameters(timeout_min=2)
training = executor.submit(Trainer(), 100)
output = job.result()
try:
    failing.result()
    raised = None
except submitit.core.utils.FailedJobError as error:
    raised = str(error)
while sleepers[0].state != "RUNNING":
    time.sleep(1)
sleepers[0].cancel()
slept = [each.result() for each in sleepers[1:]]
sleepers[0].wait()
print(json.dumps({
    "python": list(sys.version_info[:2]), "add": output, "mapped": [each.result() for each in jobs],
    "raised": raised, "training": training.result(), "log": training.stdout(),
    "as_completed": sorted(each.result() for each in submitit.helpers.as_completed(batched)),
    "echoed": echoed.result(), "slept": slept, "cancelled": sleepers[0].state,
    "found_again": [job.paths.folder.parent.as_posix(), job.job_id],
}))
"""
)

# A new process, a day later as far as it knows: the job found again from its folder and id.
FOUND_AGAIN = """\
import sys

from hpcbox.submitit import Job

print(Job(sys.argv[1], sys.argv[2]).result())
"""


def test_a_submitit_docs_script_runs_unchanged_from_another_python_than_the_environments(
    calls_project: Path, setup: Setup, tmp_path: Path
):
    """The script's functions and its Checkpointable travel as their source: defined again on the
    node in the environment's Python (3.13) from the laptop's (this one, 3.11), the driver never run
    there; its exception comes back with the node's traceback, and the Checkpointable is requeued at
    its time limit (two minutes) and resumes."""
    from hpcbox.submitit.executor import environment_python

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert environment_python(load_project(calls_project)) != here  # the point: not the same Python
    script = calls_project / "docs_script.py"
    script.write_text(DOCS_SCRIPT)
    ran = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "calls")], cwd=calls_project,
        env={**os.environ, **setup.env}, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    found = json.loads(ran.stdout.splitlines()[-1])
    assert found["add"] == 12 and found["mapped"] == [11, 22, 33]
    raised_at = DOCS_SCRIPT.splitlines().index("    raise ValueError(message)") + 1
    assert "ValueError: boom from the node" in found["raised"]
    assert f'docs_script.py", line {raised_at}, in fail' in found["raised"]  # the node's traceback
    # A real time limit (two minutes; Slurm's own timer sends USR1 a minute before it): the call
    # checkpoints, the job requeues itself outside the container, the next run resumes from the
    # checkpoint, and the result is an uninterrupted run's (its steps) after more than one run (starts).
    assert found["training"]["steps"] == 100 and found["training"]["starts"] >= 2, found["log"]
    assert "hpcbox: the call checkpointed before the time limit" in found["log"]
    assert "hpcbox: resuming the call from its checkpoint" in found["log"]
    assert "requeueing job " in found["log"]
    assert found["as_completed"] == [0, 2, 4] and found["echoed"] == "from the node"
    # One task of an array cancelled while the others finish: theirs are their own results.
    assert found["slept"] == [None, None] and found["cancelled"] == "CANCELLED", found
    again = subprocess.run(
        [sys.executable, "-c", FOUND_AGAIN, *found["found_again"]], cwd=calls_project,
        env={**os.environ, **setup.env}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert (again.returncode, again.stdout) == (0, "12\n"), again.stderr[-2000:]
