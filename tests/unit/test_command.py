"""`[tool.hpcbox.run]`: what a job runs in the container, read and checked from pyproject.toml."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand, Step, Steps
from hpcbox.project.config import load_project


def project_with(tmp_path: Path, run: str, code: str = '["src/mypkg", "train.py"]') -> Path:
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "fit.py").write_text("print('fit')\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "outside.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
            [project]
            name = "mine"
            [tool.hpcbox]
            code = {code}
            """)
        + textwrap.dedent(run)
    )
    return tmp_path


def test_without_a_run_table_the_job_runs_the_example_trainer(tmp_path: Path):
    project = load_project(project_with(tmp_path, ""))
    assert project.run == EXAMPLE_TRAINER
    assert EXAMPLE_TRAINER.program_words() + EXAMPLE_TRAINER.resolved_args() == (
        "python", "-m", "hpctrain", "train", "--data-dir", "/scratch/data", "--output-dir", "/scratch/out",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ('module = "mypkg.fit"\nargs = ["--data", "{data_dir}"]',
         ContainerCommand("module", "mypkg.fit", ("--data", "{data_dir}"))),
        ('script = "src/mypkg/fit.py"', ContainerCommand("script", "/code/mypkg/fit.py")),
        ('script = "train.py"\nargs = ["--out={output_dir}/x"]',
         ContainerCommand("script", "/code/train.py", ("--out={output_dir}/x",))),
        ('program = "mytrain"', ContainerCommand("program", "mytrain")),
        ('program = "/opt/venv/bin/fit"', ContainerCommand("program", "/opt/venv/bin/fit")),
        ('program = "fit"\nlauncher = "srun"', ContainerCommand("program", "fit", launcher="srun")),
    ],
)  # fmt: skip
def test_module_script_or_program_is_read_with_its_arguments(tmp_path: Path, run: str, expected):
    project = load_project(project_with(tmp_path, "[tool.hpcbox.run]\n" + run))
    assert project.run == expected


def test_placeholders_become_the_paths_inside_the_container():
    command = ContainerCommand("script", "/code/train.py", ("--out={output_dir}/x", "{data_dir}", "{other}"))
    assert command.resolved_args() == ("--out=/scratch/out/x", "/scratch/data", "{other}")
    assert command.program_words() == ("python", "/code/train.py")
    assert command.torchrun_words() == ("/code/train.py",)
    assert ContainerCommand("program", "fit").torchrun_words() == ("--no-python", "fit")
    assert ContainerCommand("module", "a.b").torchrun_words() == ("-m", "a.b")


@pytest.mark.parametrize(
    ("run", "field", "says"),
    [
        ('module = "mypkg.fit"\nscript = "train.py"', "tool.hpcbox.run", "exactly one of module, script"),
        ('args = ["--x"]', "tool.hpcbox.run", "one of module, script, program, entry_point (found 0)"),
        ('modul = "mypkg.fit"', "tool.hpcbox.run.modul", "unknown key"),
        ('module = "mypkg-fit"', "tool.hpcbox.run.module", "is not a Python module name"),
        ('module = ""', "tool.hpcbox.run.module", "is empty"),
        ('program = "my train"', "tool.hpcbox.run.program", "is not a program name"),
        ('program = "$(reboot)"', "tool.hpcbox.run.program", "is not a program name"),
        ('script = "missing.py"', "tool.hpcbox.run.script", "missing.py does not exist"),
        ('script = "outside.py"', "tool.hpcbox.run.script", "is not among the code paths"),
        ('script = "../train.py"', "tool.hpcbox.run.script", "must be a path inside the project"),
        ('script = "/etc/passwd"', "tool.hpcbox.run.script", "must be a path inside the project"),
        ('module = "m"\nargs = "--epochs 3"', "tool.hpcbox.run.args", "must be a list of strings"),
        ('module = "m"\nargs = [3]', "tool.hpcbox.run.args", "must be a list of strings"),
        ('module = "m"\nlauncher = "mpirun"', "tool.hpcbox.run.launcher", "(allowed: torchrun, srun)"),
        ('module = "m"\n[[tool.hpcbox.run.steps]]\nmodule = "n"', "tool.hpcbox.run.module", "beside steps"),
        ("steps = []", "tool.hpcbox.run.steps", "must be one or more [[tool.hpcbox.run.steps]] tables"),
        ('steps = ["python train.py"]', "tool.hpcbox.run.steps", "must be one or more"),
        ('[[tool.hpcbox.run.steps]]\nmodule = "m"\n[[tool.hpcbox.run.steps]]\nscript = "missing.py"',
         "tool.hpcbox.run.steps[1].script", "missing.py does not exist"),
        ('[[tool.hpcbox.run.steps]]\nargs = ["--x"]', "tool.hpcbox.run.steps[0]", "exactly one of module"),
        ('[[tool.hpcbox.run.steps]]\nmodule = "m"\nlauncher = "srun"', "tool.hpcbox.run.steps[0].launcher",
         "the launcher is the whole job's"),
        ('[[tool.hpcbox.run.steps]]\nmodule = "m"\nmodle = "n"', "tool.hpcbox.run.steps[0].modle",
         "unknown key"),
        ('[[tool.hpcbox.run.steps]]\nmodule = "m"\nname = "two words"', "tool.hpcbox.run.steps[0].name",
         "use letters, digits"),
        ('[[tool.hpcbox.run.steps]]\nmodule = "m"\nargs = [1]', "tool.hpcbox.run.steps[0].args",
         "must be a list of strings"),
        ('launcher = "mpirun"\n[[tool.hpcbox.run.steps]]\nmodule = "m"', "tool.hpcbox.run.launcher",
         "(allowed: torchrun, srun)"),
    ],
)  # fmt: skip
def test_bad_run_table_names_the_field(tmp_path: Path, run: str, field: str, says: str):
    with pytest.raises(FieldError) as refused:
        load_project(project_with(tmp_path, "[tool.hpcbox.run]\n" + run))
    assert refused.value.field == field
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


def test_run_that_is_not_a_table_is_refused(tmp_path: Path):
    with pytest.raises(HpcboxError, match=r"^tool.hpcbox.run: .* must be a table"):
        load_project(project_with(tmp_path, 'run = "python train.py"\n'))


@pytest.mark.parametrize(
    ("command", "matches", "misses"),
    [
        (ContainerCommand("module", "my.fit"),
         ["python -m my.fit --x", "/opt/venv/bin/python3.11 -m my.fit"],
         ["python -m my_fit", "python -m my.fitter", "srun python -m my.fit", "python -m other my.fit"]),
        (ContainerCommand("script", "/code/a+b/train.py"),
         ["python /code/a+b/train.py --x", "/usr/bin/python3 /code/a+b/train.py"],
         ["python /code/aab/train.py", "python /code/a+b/trainXpy",
          "apptainer exec x.sif python /code/a+b/train.py"]),
        (ContainerCommand("program", "fit"),
         ["fit --x", "/opt/venv/bin/fit", "/opt/venv/bin/python3 /opt/venv/bin/fit --x", "bash fit"],
         ["fitter", "python -m fit", "srun fit", "refit"]),
        (ContainerCommand("program", "/opt/bin/fit"),
         ["/opt/bin/fit --x", "python3 /opt/bin/fit"],
         ["/opt/bin/fitter", "/usr/bin/fit", "fit"]),
    ],
)  # fmt: skip
def test_process_pattern_finds_the_programs_own_processes(command, matches, misses):
    """The pattern is read by pkill --full as a POSIX extended regex; grep -E reads it the same way."""
    lines = "\n".join([*matches, *misses]) + "\n"
    found = subprocess.run(
        ["grep", "-E", command.process_pattern()], input=lines, capture_output=True, text=True
    )
    assert found.stdout.splitlines() == matches


TWO_STEPS = """\
[tool.hpcbox.run]
launcher = "srun"
[[tool.hpcbox.run.steps]]
name = "train"
module = "mypkg.fit"
args = ["--data", "{data_dir}", "--out", "{output_dir}"]
[[tool.hpcbox.run.steps]]
script = "src/mypkg/fit.py"
args = ["{output_dir}", "it's"]
"""


def test_steps_are_read_in_order_each_with_its_own_program_and_the_jobs_launcher(tmp_path: Path):
    project = load_project(project_with(tmp_path, TWO_STEPS))
    train = ContainerCommand("module", "mypkg.fit", ("--data", "{data_dir}", "--out", "{output_dir}"), "srun")
    evaluate = ContainerCommand("script", "/code/mypkg/fit.py", ("{output_dir}", "it's"), "srun")
    assert project.run == Steps((Step("train", train), Step("fit.py", evaluate)))  # a script's default name
    assert not project.run.ddp


def test_the_steps_pattern_finds_the_processes_of_every_step_and_no_other():
    steps = Steps(
        (Step("a", ContainerCommand("module", "my.fit")), Step("b", ContainerCommand("program", "ev")))
    )
    lines = "python -m my.fit --x\n/opt/bin/ev --y\npython -m other\nevil\n"
    found = subprocess.run(
        ["grep", "-E", steps.process_pattern()], input=lines, capture_output=True, text=True
    )
    assert found.stdout.splitlines() == ["python -m my.fit --x", "/opt/bin/ev --y"]


@pytest.mark.parametrize(
    ("setting", "field", "says"),
    [
        ('projct = "mine"\n', "tool.hpcbox.projct", "is not a [tool.hpcbox] setting (a typo? allowed: ci,"),
        ('dockerfile = 3\n', "tool.hpcbox.dockerfile", "3 must be a string"),
        ('data = ["a", "b"]\n', "tool.hpcbox.data", "must be a string"),
        ('extras = "train"\n', "tool.hpcbox.extras", "must be a list of non-empty strings"),
    ],
)  # fmt: skip
def test_a_misspelt_or_mistyped_hpcbox_setting_is_one_line_naming_it(
    tmp_path: Path, setting: str, field: str, says: str
):
    """[tool.hpcbox] goes through the one typed reader: a typo is said, not ignored."""
    with pytest.raises(FieldError) as refused:
        load_project(project_with(tmp_path, setting))
    assert refused.value.field == field
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_an_image_repository_in_the_environment_does_not_make_the_setting_unknown(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("HPCBOX_IMAGE_REPOSITORY", "elsewhere/trainer")
    project = load_project(project_with(tmp_path, 'image_repository = "mine/trainer"\n'))
    assert project.repository == "elsewhere/trainer"
