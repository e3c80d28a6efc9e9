"""A script's functions and classes travel as their source (hpcbox.submitit.script_source): what of a
script the node defines again, and the node's side run for real, in a fresh process of each Python
this machine has, through the same runner the jobs run. The same on the mini cluster, from Python 3.11
to the environment's 3.13: tests/integration/test_executor.py."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project
from hpcbox.submitit.executor import Executor, refuse_missing_modules
from hpcbox.submitit.script_source import definitions

REPO = Path(__file__).resolve().parents[2]
# The node's Python: each one this machine has (the job's is the environment's, 3.13).
NODE_PYTHONS = sorted(
    {str(path) for path in Path("/usr/bin").glob("python3.*") if path.name[len("python3.") :].isdigit()}
)

# As submitit's docs write a script: functions and a Checkpointable of its own, the driver at the top
# level with no guard (GUARDED puts it under one).
DOCS_SCRIPT = """\
import dataclasses
import json
import logging
import pathlib
import sys

import submitit

from hpcbox.project.config import load_project
from hpcbox.submitit.executor import pickle_calls

LR = 0.5
SCALE = LR * 4
log = logging.getLogger("docs-script")
pathlib.Path("driver-ran").write_text("the driver ran here")


@dataclasses.dataclass
class Point:
    x: int
    y: int


def add(a, b):
    log.info("adding")
    return (a + b) * LR


def grow(point):
    return Point(point.x * SCALE, point.y * SCALE)


def fail(message):
    raise ValueError(message)


class Trainer(submitit.helpers.Checkpointable):
    def __init__(self):
        self.step, self.starts = 0, 0

    def __call__(self, steps):
        import time

        self.starts += 1
        print("training", flush=True)
        for self.step in range(self.step, steps):
            time.sleep(0.01)  # a step of training
        return self.step + 1, self.starts


"""
DRIVER = """\
LR = float(sys.argv[2])  # the driver changes a constant: the node reads this value
calls = [(add, (1, 2), {}), (grow, (Point(1, 2),), {}), (fail, ("boom",), {}), (Trainer(), (300,), {})]
pickled = pickle_calls(calls, load_project(pathlib.Path(__file__).parent))
pickled.write(pathlib.Path(sys.argv[1]))
print(json.dumps({"by_value": pickled.by_value, "shipped": pickled.shipped, "text": pickled.script.text}))
"""


def guarded(driver: str) -> str:
    return 'if __name__ == "__main__":\n' + textwrap.indent(driver, "    ")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "docker" / "lock").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "calls"\n')
    (root / "docker" / "lock" / "apt-system.txt").write_text("python3=3.99.5-1\n")  # never this Python
    return root


def send(project: Path, body: str, call_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``body`` run as the laptop's script, in a process of its own (its `__main__`)."""
    script = project / "experiment.py"
    script.write_text(body)
    call_dir.mkdir()
    return subprocess.run(
        [sys.executable, str(script), str(call_dir), *args], cwd=project, capture_output=True, text=True
    )


def run_on_node(
    python: str, call_dir: Path, out: Path, index: int, node: Path
) -> subprocess.CompletedProcess:
    """The runner in a fresh Python with nothing of the laptop's: no hpcbox, no submitit installed."""
    out.mkdir(parents=True)
    return subprocess.run(
        [python, str(REPO / "src/hpcbox/submitit/run_call.py"), str(call_dir), str(out), str(index)],
        cwd=node, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def read_results(project: Path, outs: list[Path]) -> list:
    """The outcomes, unpickled as the laptop reads them: in a process whose `__main__` is the script."""
    reader = project / "read.py"
    reader.write_text(
        (project / "experiment.py").read_text().split("LR = float")[0].split('if __name__ == "__main__"')[0]
        + "import pickle\nouts = sys.argv[1:]\n"
        + "print(json.dumps([repr(pickle.load(open(out + '/result.pkl', 'rb'))) for out in outs]))\n"
    )
    read = subprocess.run(
        [sys.executable, str(reader), *map(str, outs)], cwd=project, capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr
    return json.loads(read.stdout)


@pytest.mark.parametrize("python", NODE_PYTHONS)
@pytest.mark.parametrize("guard", [False, True])
def test_a_docs_style_scripts_functions_and_checkpointable_run_on_the_node_from_their_source(
    project: Path, tmp_path: Path, python: str, guard: bool
):
    """The script's functions, a class used as an argument and returned, a constant the driver
    changed, a logger the driver made, a submitit Checkpointable: defined again on the node from the
    script's source, whose driver never runs there; the environment's Python (3.99 here) may differ."""
    call_dir, node = tmp_path / "call", tmp_path / "node"
    node.mkdir()
    sent = send(project, DOCS_SCRIPT + (guarded(DRIVER) if guard else DRIVER), call_dir, "3.0")
    assert sent.returncode == 0, sent.stderr
    said = json.loads(sent.stdout)
    assert said["by_value"] is False and said["shipped"] == ["submitit", "cloudpickle", "typing_extensions"]
    text = said["text"]
    assert "write_text" not in text and "pickle_calls(" not in text and "import submitit" in text
    assert "from hpcbox" not in text  # the driver's imports stay here: the node has no hpcbox
    lines = text.splitlines()
    source_lines = DOCS_SCRIPT.splitlines()
    assert lines.index("def add(a, b):") == source_lines.index("def add(a, b):")  # the script's line numbers

    outs = [tmp_path / f"out-{index}" for index in range(4)]
    ran = [run_on_node(python, call_dir, outs[index], index, node) for index in range(3)]
    assert [each.returncode for each in ran] == [0, 0, 1], [each.stderr for each in ran]
    assert not (node / "driver-ran").exists()
    add, grow, fail = read_results(project, outs[:3])
    assert add == "('success', 9.0)"  # (1 + 2) * the driver's LR
    assert grow == "('success', Point(x=2.0, y=4.0))"  # the laptop's own class again; SCALE from the source
    assert fail.startswith("('error', 'ValueError: boom',") and 'experiment.py", line' in fail
    raised_at = source_lines.index("    raise ValueError(message)") + 1
    assert f"line {raised_at}, in fail" in fail and fail.endswith(", None)")

    # The Checkpointable: at the time limit's signal it checkpoints, and the next run resumes.
    outs[3].mkdir()
    argv = [python, str(REPO / "src/hpcbox/submitit/run_call.py"), str(call_dir), str(outs[3]), "3"]
    env = {"PATH": "/usr/bin:/bin"}
    first = subprocess.Popen(
        argv, cwd=node, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert first.stdout is not None and first.stdout.readline() == "training\n"
    time.sleep(0.3)
    first.send_signal(signal.SIGUSR1)
    _, stderr = first.communicate(timeout=30)
    assert first.returncode == 75, stderr
    second = subprocess.run(argv, cwd=node, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "resuming the call from its checkpoint" in second.stderr, second.stderr
    assert read_results(project, outs[3:]) == ["('success', (300, 2))"]


def sent_and_run(project: Path, tmp_path: Path, body: str, call: str, python: str):
    """A script of ``body`` that sends ``call`` (a Python expression over its names), then the runner
    on a node in ``python``: its outcome in tmp_path/out."""
    script = (
        "import pathlib, sys\nfrom hpcbox.project.config import load_project\n"
        f"from hpcbox.submitit.executor import pickle_calls\n{body}\n"
        "project = load_project(pathlib.Path(__file__).parent)\n"
        f"pickle_calls([{call}], project).write(pathlib.Path(sys.argv[1]))\n"
    )
    assert send(project, script, tmp_path / "call").returncode == 0
    node = tmp_path / "node"
    node.mkdir()
    return run_on_node(python, tmp_path / "call", tmp_path / "out", 0, node)


def test_a_module_the_node_lacks_comes_back_as_the_calls_error_naming_it(project: Path, tmp_path: Path):
    """A module of the script that the node cannot import fails inside the runner's `try`: the call's
    error, with the traceback and the module's name, not a job without a result."""
    (project / "helperlib.py").write_text("def double(x):\n    return 2 * x\n")
    body = "from helperlib import double\n\ndef twice(x):\n    return double(x)\n\n"
    ran = sent_and_run(project, tmp_path, body, "(twice, (4,), {})", sys.executable)
    assert ran.returncode == 1 and "ModuleNotFoundError" in ran.stderr
    error, message, trace, missing = pickle.loads((tmp_path / "out" / "result.pkl").read_bytes())
    assert (error, message, missing) == (
        "error",
        "ModuleNotFoundError: No module named 'helperlib'",
        "helperlib",
    )
    assert 'experiment.py", line 4, in <module>' in trace  # the import's line in the script


REFUSALS = {
    "lambda": ("executor_call(lambda x: x + 1)", "<lambda> travels by value (a lambda)"),
    "nested": (
        "def outer():\n    def inner(x):\n        return x\n    return inner\nexecutor_call(outer())",
        "outer.<locals>.inner travels by value (a nested function)",
    ),
    "closure": (
        "def outer(k):\n    def inner(x):\n        return x * k\n    return inner\nexecutor_call(outer(3))",
        "outer.<locals>.inner travels by value (a closure over a function's local state)",
    ),
    "global lambda": (
        "import sys\nACT = dict(act=lambda x: x)['act']\ndef use(x):\n    return ACT(x)\nexecutor_call(use)",
        "ACT (experiment.py line {at}) is set by code that does not run on the node, and the script's "
        "functions read it, but its value cannot travel: a lambda",
    ),
    "inside a block": (
        "import sys\nif sys.argv:\n    def hidden(x):\n        return x\nexecutor_call(hidden)",
        "hidden (experiment.py line {at}) is defined inside a block that does not run on the node",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_has_no_source_of_its_own_is_refused_in_one_line_naming_it(
    project: Path, tmp_path: Path, case: str
):
    code, expected = REFUSALS[case]
    body = (
        "import pathlib\nfrom hpcbox.errors import HpcboxError\n"
        "from hpcbox.project.config import load_project\n"
        "from hpcbox.submitit.executor import pickle_calls\n\n"
        "def executor_call(fn):\n    try:\n"
        "        pickle_calls([(fn, (1,), {})], load_project(pathlib.Path(__file__).parent))\n"
        "    except HpcboxError as error:\n        print(error.message)\n        print(error.hint)\n"
    )
    at = body.count("\n") + 2  # the line of the case's second statement, which the messages name
    sent = send(project, body + code + "\n", tmp_path / "call")
    assert sent.returncode == 0, sent.stderr
    message, hint = sent.stdout.splitlines()
    assert message.startswith(expected.format(at=at)), message
    assert "\n" not in message and hint


def test_definitions_keep_what_defines_and_drop_what_runs():
    source = textwrap.dedent(
        """\
        from __future__ import annotations
        import os, json
        import submitit
        A = 1; print("side effect")
        B = A + 1
        C = os.getcwd()
        D = [i for i in range(3)]
        def f():
            return A + B + C + D + len(os.sep)
        executor = submitit.AutoExecutor("x")
        if __name__ == "__main__": import sys; executor.submit(f)
        """
    )
    found = definitions([source], "s.py", "s.py")
    assert found.text.splitlines()[:5] == [
        "from __future__ import annotations",
        "import os, json",
        "",
        "A = 1",
        "B = A + 1",
    ]
    assert "print" not in found.text and "getcwd" not in found.text and "AutoExecutor" not in found.text
    assert "import sys" not in found.text and "submit(f)" not in found.text
    compile(found.text, "s.py", "exec")
    assert found.defined >= {"A", "B", "f", "os"} and "C" not in found.defined and "D" not in found.defined
    assert found.data_names({"A": 1, "B": 2, "C": "/", "D": [0], "executor": object(), "f": None}) == [
        "C",
        "D",
    ]


def test_a_notebooks_definitions_come_from_its_cell_history():
    """A real IPython shell runs the cells; the last definition of a name is the one sent."""
    code = textwrap.dedent(
        """\
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        for cell in ["def f(x):\\n    return x", "%time y = 1", "def f(x):\\n    return 2 * x\\nprint(f(1))",
                     "from hpcbox.submitit.script_source import running_script\\nfound = running_script()"]:
            shell.run_cell(cell, store_history=True)  # as a kernel runs a cell
        print(shell.user_ns["found"].origin, "|", shell.user_ns["found"].text.replace("\\n", "/"))
        """
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    origin, text = ran.stdout.splitlines()[-1].split(" | ")
    assert origin == "the notebook"
    assert text.count("def f(x):") == 2 and text.rstrip("/").endswith("return 2 * x")
    assert "print" not in text and "time" not in text and "running_script()" not in text


def test_a_module_the_locks_say_the_environment_lacks_is_named_before_anything_is_sent(project: Path):
    (project / "docker" / "lock" / "apt-venv.txt").write_text("python3-venv=3.99.5-1\n")
    (project / "docker" / "lock" / "cuda-requirements.txt").write_text(
        "torch==2.6.0 \\\n    --hash=sha256:00\n"
    )
    loaded = load_project(project)
    refuse_missing_modules({"torch", "json"}, loaded, "cuda")  # listed, and the standard library's
    with pytest.raises(HpcboxError) as refused:
        refuse_missing_modules({"yaml"}, loaded, "cuda")
    assert refused.value.message == (
        "the call imports yaml on the node, which the cuda environment lacks "
        "(lock/cuda-requirements.txt does not list PyYAML)"
    )
    assert refused.value.hint.startswith("add `PyYAML` to the project's dependencies")
    # Beside Debian's python3-* packages (the cpu flavour), whose own dependencies no lock lists: the
    # locks cannot tell, and the node's ImportError says it instead.
    (project / "docker" / "lock" / "apt-cpu.txt").write_text("python3-torch=2.6.0+dfsg-7\n")
    (project / "docker" / "lock" / "cpu-requirements.txt").write_text("")
    refuse_missing_modules({"yaml"}, loaded, "cpu")


def test_a_module_of_this_machine_outside_the_projects_code_is_named_before_anything_is_sent(
    project: Path, monkeypatch: pytest.MonkeyPatch
):
    (project / "helperlib.py").write_text("")
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(HpcboxError, match=r"imports helperlib on the node, a module of this machine's \("):
        refuse_missing_modules({"helperlib"}, load_project(project), "cpu")


def test_a_call_that_asks_for_no_gpu_runs_in_the_cpu_flavour_unless_told(project: Path, tmp_path: Path):
    executor = Executor(tmp_path / "calls", "local", project=project)
    assert executor.flavour_for({}) == "cpu"
    assert executor.flavour_for({"gpus": 1, "partition": "gpu"}) is None  # the last one built, as any job's
    assert Executor(tmp_path / "calls", "local", project=project, flavour="cuda").flavour_for({}) == "cuda"


@pytest.mark.parametrize("python", NODE_PYTHONS)
def test_a_call_of_submitits_own_command_function_takes_submitit_to_a_node_without_it(
    project: Path, tmp_path: Path, python: str
):
    """`submitit.helpers.CommandFunction` travels by name, as submitit's: the laptop's submitit goes
    with it, as with a script's Checkpointable, to a node whose Python has none."""
    body = "import submitit\n\necho = submitit.helpers.CommandFunction(['echo', 'from', 'the', 'node'])\n"
    ran = sent_and_run(project, tmp_path, body, "(echo, (), {})", python)
    assert ran.returncode == 0, ran.stderr
    assert pickle.loads((tmp_path / "out" / "result.pkl").read_bytes()) == ("success", "from the node")
