"""The invoke layer: every task answers --help (both spellings) and -h, and no option hides -h."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Program

REPO = Path(__file__).resolve().parents[2]


def _load_tasks():
    spec = importlib.util.spec_from_file_location("hpcbox_tasks", REPO / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # tasks.py builds its namespace from its own module entry
    spec.loader.exec_module(module)
    return module


TASKS = _load_tasks()
NAMES = sorted(TASKS.ns.task_names)


def _invoke(*argv: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SBATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=REPO, capture_output=True, text=True, env=env
    )


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        Program(namespace=TASKS.ns, binary="invoke").run(["invoke", *argv])
    output = capsys.readouterr()
    assert exited.value.code == 0, output.err
    return output.out


def test_every_task_is_listed():
    assert {"sbatch", "submit", "shell", "logs", "cluster.up"} <= set(NAMES)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("jobs", "-j", "64"),
            [
                "error: hpcbox jobs: no option -j (its options: --cluster)",
                "  hint: `hpcbox jobs` lists every job; -j JOB names one for status, logs, fetch, report and "
                "cancel",
            ],
        ),
        (
            ("statsu",),
            ["error: hpcbox: no command 'statsu'", "  hint: did you mean status? `hpcbox --list` lists them"],
        ),
        (
            ("status", "--nope"),
            [
                "error: hpcbox status: no option --nope (its options: --cluster, --follow, --job)",
                "  hint: `hpcbox status --help` says what each does",
            ],
        ),
    ],
)
def test_an_option_a_command_does_not_take_is_said_with_the_ones_it_does(argv, said, tmp_path: Path):
    """Issue 59: `hpcbox jobs -j 64` was invoke's own "No idea what '-j' is!"."""
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *argv], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (1, said, "")


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["submit", "--cluster=local", "--epochs", "40"], "hpcbox submit --cluster=local -- --epochs 40"),
        (
            ["sbatch", "-c4", "--lr=0.1", "--seed", "3", "-pgpu", "--", "--epochs", "2"],
            "hpcbox sbatch -c4 -pgpu -- --lr=0.1 --seed 3 --epochs 2",
        ),
    ],
)
def test_a_programs_option_before_the_dashes_is_said_with_the_command_line_meant(argv, meant, tmp_path):
    """Found as a user: `hpcbox submit --cluster=local --epochs 40` hinted `did you mean --qos?`, the
    nearest of submit's own options, where the trainer's option belonged after `--`."""
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *argv], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    first, hint = done.stderr.splitlines()
    assert (done.returncode, done.stdout) == (1, "")
    assert first.startswith(f"error: hpcbox {argv[0]}: no option {argv[2].split('=')[0]} (its options: --")
    assert hint == f"  hint: the program's own options go after `--`: {meant}"
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_option_is_said_with_the_nearest_one(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", "submit", "--cluster=local", "--partiton=gpu"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    first, hint = done.stderr.splitlines()
    assert done.returncode == 1 and first.startswith(
        "error: hpcbox submit: no option --partiton (its options: "
    )
    assert "--partition, " in first
    assert hint == "  hint: did you mean --partition? `hpcbox submit --help` says what each does"


def test_the_hpcbox_commands_own_options_have_no_letter_but_help_list_and_version():
    """invoke's -p (pty) and -e (echo) beside sbatch's -p (partition) and -e (error log) (issue 59)."""
    helped = subprocess.run(
        [sys.executable, "-m", "hpcbox", "--help"], capture_output=True, text=True, check=True
    )
    core = helped.stdout.split("Core options:")[1].split("Subcommands:")[0]
    letters = sorted(set(re.findall(r"^  (-\w)\b", core, re.MULTILINE)))
    assert letters == ["-V", "-h", "-l"], core
    assert "--pty" in core and "--echo" in core


def test_every_command_in_the_list_has_a_whole_summary():
    """`hpcbox --list` shows each docstring's first line: one that wraps was cut mid-phrase (issue 59)."""
    from hpcbox.cli.tasks import collection

    def tasks(found):
        yield from found.tasks.values()
        for inner in found.collections.values():
            yield from tasks(inner)

    cut = [task.name for task in tasks(collection()) if "\n" in inspect.getdoc(task.body).split("\n\n")[0]]
    assert cut == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", ["--help TASK", "TASK --help", "TASK -h"])
def test_help_works_for_every_task(name: str, form: str, capsys):
    output = _help(form.replace("TASK", name).split(), capsys)
    assert output.startswith(f"Usage: invoke [--core-opts] {name} ")
    for line in inspect.getdoc(TASKS.ns[name]).splitlines():
        assert line in output
    options = output.split("Options:\n", 1)[1]
    assert not any(line.lstrip().startswith(("-h ", "-h,", "-- ", "--=")) for line in options.splitlines())


def test_sbatch_help_through_the_real_command_line():
    """Run the way people do: `--help` after a task whose cluster used to be positional."""
    for argv in (["sbatch", "--help"], ["sbatch", "-h"], ["--help", "sbatch"]):
        done = _invoke(*argv)
        assert done.returncode == 0, done.stderr
        assert "Render the job script for a cluster" in done.stdout
        assert "  --check  " in done.stdout


def test_a_missing_cluster_is_one_line_naming_the_flag():
    done = _invoke("sbatch", "--gpus", "1")
    assert done.returncode == 1
    assert done.stderr.splitlines()[0].startswith("error: cluster: no cluster given (allowed: alliance,")
    assert done.stdout == ""


def test_the_hpcbox_command_has_every_task_but_this_repositorys_own():
    """`hpcbox` (here `python -m hpcbox`, the console script's entry) needs no tasks.py."""
    listed = subprocess.run(
        [sys.executable, "-m", "hpcbox", "--list"], cwd="/", capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    names = {
        line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ") and line[2] != " "
    }
    assert names == set(NAMES) - {"demo", "lint", "test", "bench"}
    helped = subprocess.run(
        [sys.executable, "-m", "hpcbox", "init", "--help"], cwd="/", capture_output=True, text=True
    )
    assert helped.stdout.startswith("Usage: hpcbox [--core-opts] init ")
    version = subprocess.run([sys.executable, "-m", "hpcbox", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == "hpcbox 0.1.0"


@pytest.mark.parametrize("name", NAMES)
def test_a_short_flag_is_slurms_letter_for_that_option_and_no_other_letter_is_handed_out(name, capsys):
    from hpcbox.cli.tasks import SHORT_FLAGS

    options = _help(["--help", name], capsys).split("Options:\n", 1)[1]
    letters = dict(re.findall(r"(?m)^  -(\w)(?: \w+)?, --([\w-]+)", options))
    # A letter may serve several options that mean what it means to sbatch (-o: the job's log, the
    # file profile.draft writes), never another.
    expected: dict[str, set[str]] = {}
    for option, (letter, _slurm) in SHORT_FLAGS.items():
        expected.setdefault(letter, set()).add(option)
    for letter, option in letters.items():
        assert option.replace("-", "_") in expected.get(letter, ()), (name, letter, option)
    assert not re.search(r"(?m)^  -\w(?: \w+)?  ", options)  # no letter stands alone either


def test_sbatch_submit_and_shell_take_sbatchs_letters(capsys):
    for name in ("sbatch", "submit", "shell"):
        options = _help(["--help", name], capsys)
        for shown in (
            "-p STRING, --partition",
            "-A STRING, --account",
            "-t STRING, --time",
            "-N STRING, --nodes",
            "-c STRING, --cpus",
            "-J STRING, --job-name",
            "-q STRING, --qos",
            "-M STRING, --cluster",
        ):
            assert shown in options, (name, shown)


def test_the_hpcbox_command_parses_yaml_only_when_a_config_file_asks_for_it(tmp_path: Path):
    """Invoke's YAML parser (and PyYAML's behind it) is imported when a YAML config file is read, not at
    every start; a runtime config file (`-f`) is still read, and a broken one still refused."""
    started = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpcbox", "--version"], capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    imported = {line.split("|")[-1].strip() for line in started.stderr.splitlines() if "|" in line}
    assert "hpcbox.cli.tasks" in imported and "invoke.vendor.yaml.cyaml" not in imported
    (tmp_path / "broken.yaml").write_text("run: [unclosed\n")
    reading = "import hpcbox.cli, invoke; c = invoke.Config(runtime_path='broken.yaml'); c.load_runtime()"
    refused = subprocess.run([sys.executable, "-c", reading], cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode != 0 and "ParserError" in refused.stderr


def test_bootstrap_leaves_the_bytecode_of_what_the_commands_import():
    """`./bootstrap` compiles hpcbox's src/ and its runtime dependencies once: where Python writes no
    bytecode at import (PYTHONDONTWRITEBYTECODE, as on CI), every command would otherwise compile them
    again at its start. Run `./bootstrap true` where this fails."""
    loading = (  # what the interpreter's start loaded (a .pth file's hook) is not the commands'
        "import sys; started = set(sys.modules); "
        "import hpcbox.cli.tasks, hpcbox.jobs.follow, hpcbox.jobs.submit; "
        "import docker, testcontainers.core.container; "
        "print('\\n'.join(m.__file__ for n, m in list(sys.modules.items()) "
        "if n not in started and (getattr(m, '__file__', None) or '').endswith('.py')))"
    )
    environ = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", loading], env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ours = [Path(name) for name in done.stdout.split() if name.startswith((sys.prefix, str(REPO / "src")))]
    assert any("site-packages/docker/" in str(path) for path in ours), ours
    assert any("src/hpcbox/jobs/" in str(path) for path in ours), ours
    uncompiled = [str(path) for path in ours if not Path(importlib.util.cache_from_source(path)).is_file()]
    assert uncompiled == []
