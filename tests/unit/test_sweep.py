"""Sweep files → one array task per point; array task states read back from sacct and squeue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.errors import FieldError
from hpcbox.jobs import array_state
from hpcbox.render.sweep import MAX_POINTS, ProgramOptions, Sweep, load_sweep
from hpcbox.tools.slurm import parse_tasks

REPO = Path(__file__).resolve().parents[2]


def sweep_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_a_grid_then_listed_points_each_become_a_tasks_arguments(tmp_path: Path):
    sweep = load_sweep(
        sweep_file(
            tmp_path,
            'throttle = 3\n[grid]\nlr = [0.1, 0.01]\nmodel = ["cnn", "resnet18"]\n'
            "[[points]]\nlr = 1e-3\naugment = true\nfreeze = false\nlayers = [2, 4]\n-v = true\n",
        )
    )
    assert sweep.points == (
        ("--lr", "0.1", "--model", "cnn"),
        ("--lr", "0.1", "--model", "resnet18"),
        ("--lr", "0.01", "--model", "cnn"),
        ("--lr", "0.01", "--model", "resnet18"),
        ("--lr", "0.001", "--augment", "--layers", "2", "4", "-v"),
    )
    assert (sweep.source, sweep.throttle, sweep.array()) == ("sweep.toml", 3, "0-4%3")


def test_a_resubmission_names_only_its_tasks():
    sweep = Sweep("s.toml", tuple((str(n),) for n in range(10)), throttle=2)
    assert sweep.array((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8%2"
    assert Sweep("s.toml", (("a",),)).array((0,)) == "0"


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("", "sweep", "has no points"),
        ("[grid]\n", "sweep", "has no points"),
        ("rate = 1\n[grid]\na = [1]\n", "sweep.rate", "is not a sweep setting"),
        ("[grid]\nlr = 0.1\n", "sweep.grid.lr", "must be a non-empty list of values"),
        ("[grid]\nlr = []\n", "sweep.grid.lr", "must be a non-empty list"),
        ('[grid]\n"--l r" = [1]\n', "sweep.grid.--l r", "is not an option name"),
        ("[[points]]\nopt = {a = 1}\n", "sweep.points[0].opt", "is not a string, number or true/false"),
        ("throttle = 0\n[grid]\na = [1]\n", "sweep.throttle", "must be a whole number of tasks"),
        ("[grid\n", "sweep", "is not valid TOML"),
        ("[grid]\na = [" + ", ".join(str(n) for n in range(MAX_POINTS + 1)) + "]\n", "sweep", "1002 points"),
    ],
)
def test_a_bad_sweep_file_names_the_key(tmp_path: Path, text: str, field: str, says: str):
    with pytest.raises(FieldError) as refused:
        load_sweep(sweep_file(tmp_path, text))
    assert refused.value.field == field
    assert says in str(refused.value) and "\n" not in refused.value.message


def test_a_sweep_file_written_as_a_list_of_arguments_is_shown_the_shape_of_one(tmp_path: Path):
    with pytest.raises(FieldError) as refused:
        load_sweep(sweep_file(tmp_path, "--lr 0.01\n--lr 0.1\n"))
    assert "is not valid TOML" in refused.value.message
    assert refused.value.hint == (
        "fix the syntax error it names; a sweep file is TOML: a [grid] of option = [values] "
        "(lr = [0.1, 0.01]) and/or [[points]]"
    )


@pytest.mark.parametrize("program_options", [None, dict.fromkeys(("--lr", "--epochs"), lambda value: "")])
def test_a_point_written_as_its_command_line_is_shown_how_a_point_gives_an_option(
    tmp_path: Path, program_options: ProgramOptions | None
):
    """Found as a user: `args = [...]` was refused as the option --args (`did you mean lr?`) where the
    program's options are known, and ran every task with `--args --lr 0.1` where they are not."""
    with pytest.raises(FieldError) as refused:
        load_sweep(sweep_file(tmp_path, '[[points]]\nargs = ["--lr", "0.1"]\n'), program_options)
    assert str(refused.value) == (
        "sweep.points[0].args: holds an option (--lr), not a value: a point's keys are the options "
        "(write lr = VALUE for --lr VALUE)"
    )
    # A value that only starts with a dash is a value.
    assert load_sweep(sweep_file(tmp_path, '[[points]]\nlr = "-1"\n'), program_options).points == (
        ("--lr", "-1"),
    )


def test_a_missing_sweep_file_is_one_line(tmp_path: Path):
    with pytest.raises(FieldError, match="does not exist"):
        load_sweep(tmp_path / "nope.toml")


SACCT = """\
812_0|COMPLETED|None|00:00:09|00:10:00|0:0|node1|2026-12-05T09:00:01|/r|sbatch t.sh
812_1|FAILED|None|00:00:03|00:10:00|1:0|node2|2026-12-05T09:00:01|/r|sbatch t.sh
812_2|RUNNING|None|00:00:05|00:10:00|0:0|node1|2026-12-05T09:00:01|/r|sbatch t.sh
812_[3-4%2]|PENDING|JobArrayTaskLimit|00:00:00|00:10:00|0:0|None assigned|2026-12-05T09:00:01|/r|sbatch t.sh
8120_1|COMPLETED|None|00:00:01|00:10:00|0:0|node1|2026-12-05T09:00:01|/r|sbatch t.sh
"""
SQUEUE = """\
812_2|RUNNING|None|0:05|10:00|node1|2026-12-05T09:00:03|2026-12-05T09:00:01|/r/t.sh
812_3|PENDING|JobArrayTaskLimit|0:00|10:00||N/A|2026-12-05T09:00:01|/r/t.sh
812_4|PENDING|JobArrayTaskLimit|0:00|10:00||N/A|2026-12-05T09:00:01|/r/t.sh
"""


def test_each_array_task_has_its_state_and_the_array_one_for_them_all():
    tasks = parse_tasks(SACCT, SQUEUE, "812")
    assert {index: task.state for index, task in tasks.items()} == {
        0: "COMPLETED", 1: "FAILED", 2: "RUNNING", 3: "PENDING", 4: "PENDING",
    }  # fmt: skip
    assert tasks[1].exit_code == "1:0" and tasks[3].reason == "JobArrayTaskLimit"
    assert array_state(tasks).state == "RUNNING"
    finished = parse_tasks(SACCT.replace("RUNNING", "COMPLETED").replace("PENDING", "COMPLETED"), "", "812")
    assert (array_state(finished).state, array_state(finished).job_id) == ("FAILED", "812")


def hpcbox(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SBATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "hpcbox", *args], cwd=cwd, capture_output=True, text=True, env=env
    )


def test_sbatch_with_a_sweep_renders_the_array_and_every_point(tmp_path: Path):
    path = sweep_file(tmp_path, "throttle = 2\n[grid]\nlr = [0.1, 0.01, 0.001]\n")
    done = hpcbox("sbatch", "--cluster=edi", f"--sweep={path}", "--", "--epochs", "3")
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --array=0-2%2" in done.stdout
    assert "    2) point_args=(--lr 0.001) ;;" in done.stdout
    assert '--epochs 3 "${point_args[@]}" &\n' in done.stdout.replace(" \\\n    ", " ")  # however wrapped


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--cluster=edi", "--array=0-9"], "error: array: --array and the sweep both say which tasks run"),
        (["--cluster=dtu"], "error: sweep: dtu uses LSF"),
    ],
)
def test_sbatch_refuses_a_sweep_it_cannot_run_in_one_line(tmp_path: Path, flags: list[str], says: str):
    path = sweep_file(tmp_path, "[grid]\nlr = [0.1]\n")
    done = hpcbox("sbatch", *flags, f"--sweep={path}")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines()[0].startswith(says), done.stderr


PROBES = ("abc", "", "-1", "0", "0.5", "1", "3", "1e-5", "nan", "inf", "on", "no", "cnn", "resnet18", "cuda")


def test_the_example_trainers_options_hpcbox_checks_against_are_the_trainers_own_value_by_value():
    """Each value hpcbox lets through for an option, the trainer takes; each it refuses, the trainer
    refuses: the trainer's own configuration (torch-free) read with every probe."""
    from hpcbox.project.command import EXAMPLE_TRAINER_OPTIONS
    from hpctrain import HpctrainError, config

    assert {option.flag for option in config.OPTIONS} == set(EXAMPLE_TRAINER_OPTIONS)
    for option in config.OPTIONS:
        setting = EXAMPLE_TRAINER_OPTIONS[option.flag]
        if option.kind is Path:  # any word is a path; whether the file is there, the node says
            assert setting.kind == "path", option.flag
            continue
        for probe in PROBES:
            try:
                config.resolve({"data_dir": "d", "output_dir": "o", option.name: probe}, {})
                takes = ""
            except HpctrainError as refused:
                takes = refused.message
            assert bool(setting.problem(probe)) == bool(takes), (option.flag, probe, takes)


def test_a_sweep_value_the_example_trainer_would_refuse_is_refused_before_any_task_runs(tmp_path: Path):
    from hpcbox.api import Site

    site = Site("local", project=REPO)
    for text, field, says in [
        ('lr = [0.1, "abc"]', "sweep.grid.lr", "the program cannot take 'abc' for --lr: not a number"),
        (
            "epochs = [3, 0]",
            "sweep.grid.epochs",
            "the program cannot take '0' for --epochs: must be at least 1",
        ),
        ('device = ["gpu"]', "sweep.grid.device", "the program cannot take 'gpu' for --device: not one of"),
        ("amp = [true]", "sweep.grid.amp", "the program's --amp takes one value"),
        ("epochs = [[1, 2]]", "sweep.grid.epochs", "the program's --epochs takes one value"),
    ]:
        with pytest.raises(FieldError) as refused:
            site.sweep(sweep_file(tmp_path, f"[grid]\n{text}\n"))
        assert refused.value.field == field and says in refused.value.message, refused.value.message
    taken = site.sweep(sweep_file(tmp_path, '[grid]\nlr = [1e-5]\namp = ["on", false]\nepochs = [3]\n'))
    assert taken.points == (
        ("--lr", "1e-05", "--amp", "on", "--epochs", "3"),
        ("--lr", "1e-05", "--epochs", "3"),
    )


def test_the_words_after_dashes_are_read_as_the_trainers_argparse_reads_them():
    from hpcbox.project.command import example_trainer_args_problem

    for taken in (["--lr", "0.1"], ["--lr=0.1"], ["--epoch", "3"], ["--momentum", "0"], ["--amp", "off"]):
        assert example_trainer_args_problem(taken) == "", taken
    assert (
        example_trainer_args_problem(["--lr", "-1"])
        == "the trainer cannot take '-1' for --lr: must be above 0"
    )
    assert example_trainer_args_problem(["--e", "3"]) == ""  # --epochs, the one option starting so
    assert example_trainer_args_problem(["--s", "3"]) == (
        "--s could be any of --seed, --step-pause, --steps-per-epoch"
    )
    assert example_trainer_args_problem(["-x", "3"]) == "the trainer has no option -x"
    assert example_trainer_args_problem(["--lr"]) == "--lr takes a value"
    assert example_trainer_args_problem(["--lr", "--epochs", "3"]) == "--lr takes a value"
    assert (
        example_trainer_args_problem(["train"])
        == "'train' is not an option of the trainer's, nor an option's value"
    )


def test_a_sweep_key_the_example_trainer_does_not_take_is_refused_with_its_spelling(tmp_path: Path):
    """Issue 59: `batch_size` became --batch_size, and every task failed at argparse."""
    from hpcbox.api import Site

    path = sweep_file(tmp_path, "[grid]\nlr = [0.1, 0.01]\nbatch_size = [32]\n")
    with pytest.raises(FieldError) as refused:
        Site("local", project=REPO).sweep(path)
    assert (refused.value.field, refused.value.message) == (
        "sweep.grid.batch_size",
        "sweep.grid.batch_size: the program has no option --batch_size",
    )
    assert refused.value.hint == "did you mean batch-size?"
    # Spelt as the trainer spells it, it goes; a program of a project's own takes the keys as written.
    assert load_sweep(path).points[0] == ("--lr", "0.1", "--batch_size", "32")
    (tmp_path / "fixed").mkdir()
    fixed = sweep_file(tmp_path / "fixed", "[grid]\nlr = [0.1, 0.01]\nbatch-size = [32]\n")
    assert Site("local", project=REPO).sweep(fixed).points[0] == ("--lr", "0.1", "--batch-size", "32")
