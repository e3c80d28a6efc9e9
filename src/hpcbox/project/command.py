"""What a job runs in the container: the project's program and its arguments (`[tool.hpcbox.run]`).

One of
    module = "mypackage.train"     python -m mypackage.train ARGS
    script = "scripts/train.py"    python /code/scripts/train.py ARGS (a file among the `code` paths)
    program = "mytrain"            an executable in the image (a console entry point, or an absolute path)
    entry_point = "mytrain"        one of the project's own [project.scripts] (or "pkg.cli:main"): its
                                   function called in `python -c`, since the code is beside the image
with `args`, in which {data_dir} and {output_dir} stand for the dataset staged on node scratch and the
folder copied back to the run folder. The default is the example trainer, `python -m hpctrain train`.
`launcher` says how several processes start: "torchrun" (the default: DDP, one process per GPU, each
node's processes started by torchrun) or "srun" (one process per Slurm task, as MPI programs and
independent workers expect, however many GPUs there are).

Or several steps run in turn in one job, e.g. train then evaluate, each a table of its own with a
module, script or program, its args and an optional name; the launcher is the whole job's:
    [[tool.hpcbox.run.steps]]
    name = "train"
    module = "mypackage.train"
    args = ["--data", "{data_dir}", "--out", "{output_dir}"]
    [[tool.hpcbox.run.steps]]
    name = "evaluate"
    script = "scripts/evaluate.py"
    args = ["{output_dir}"]
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hpcbox.errors import FieldError
from hpcbox.tables import Table

# Inside the container: the job's node scratch and the code snapshot.
SCRATCH_MOUNT = "/scratch"
CODE_MOUNT = "/code"
DATA_DIR = f"{SCRATCH_MOUNT}/data"
OUTPUT_DIR = f"{SCRATCH_MOUNT}/out"
PLACEHOLDERS = {"{data_dir}": DATA_DIR, "{output_dir}": OUTPUT_DIR}
KINDS = ("module", "script", "program", "entry_point")
LAUNCHERS = ("torchrun", "srun")

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ENTRY_POINT = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PROGRAM = re.compile(r"^(/[A-Za-z0-9._+@/-]+|[A-Za-z0-9._+@-]+)$")
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ContainerCommand:
    """`kind` is one of KINDS; `target` the module name, the script's path in the container, the program,
    or the entry point's `module:function`."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    launcher: str = "torchrun"  # one of LAUNCHERS

    @property
    def ddp(self) -> bool:
        """Its processes are DDP ranks, each with a GPU of its own when the job has GPUs."""
        return self.launcher == "torchrun"

    def resolved_args(self) -> tuple[str, ...]:
        """`args` with {data_dir} and {output_dir} replaced by the paths inside the container."""
        resolved = []
        for arg in self.args:
            for placeholder, path in PLACEHOLDERS.items():
                arg = arg.replace(placeholder, path)
            resolved.append(arg)
        return tuple(resolved)

    def program_words(self) -> tuple[str, ...]:
        """How one process is started: the words before the arguments."""
        if self.kind == "module":
            return ("python", "-m", self.target)
        if self.kind == "script":
            return ("python", self.target)
        if self.kind == "entry_point":
            return ("python", "-c", self.entry_point_code())
        return (self.target,)

    def torchrun_words(self) -> tuple[str, ...]:
        """How torchrun is told to start each process: a module, a script, or any program."""
        if self.kind == "module":
            return ("-m", self.target)
        if self.kind == "script":
            return (self.target,)
        if self.kind == "entry_point":
            return ("--no-python", "python", "-c", self.entry_point_code())
        return ("--no-python", self.target)

    def process_pattern(self) -> str:
        """A POSIX extended regex for the command line of one of its processes (`pkill --full`)."""
        target = _ere_literal(self.target)
        if self.kind == "module":
            return rf"^([^ ]*/)?python[0-9.]* -m {target}( |$)"
        if self.kind == "script":
            return rf"^([^ ]*/)?python[0-9.]* {target}( |$)"
        if self.kind == "entry_point":
            return rf"^([^ ]*/)?python[0-9.]* -c {_ere_literal(self.entry_point_code())}( |$)"
        # A console entry point runs as `python /venv/bin/name`, a shell script as `bash name`.
        program = target if self.target.startswith("/") else f"([^ ]*/)?{target}"
        return rf"^(([^ ]*/)?(python[0-9.]*|bash|sh) )?{program}( |$)"

    def entry_point_code(self) -> str:
        """What `python -c` runs for an entry point: what the console script pip writes would run."""
        module, _, attribute = self.target.partition(":")
        head = attribute.split(".", 1)[0]
        return f"import sys; from {module} import {head}; sys.argv[0] = {module!r}; sys.exit({attribute}())"


def _ere_literal(text: str) -> str:
    special = ".[]{}()*+?|$\\"
    return "".join(f"[{char}]" if char in special else "\\^" if char == "^" else char for char in text)


@dataclass(frozen=True)
class Step:
    name: str  # for people: the job's log says which step runs
    command: ContainerCommand


@dataclass(frozen=True)
class Steps:
    """Commands run one after another in the same allocation and container set-up, under one launcher."""

    steps: tuple[Step, ...]

    @property
    def ddp(self) -> bool:
        return self.steps[0].command.ddp

    def process_pattern(self) -> str:
        """A POSIX extended regex matching a process of any of the steps (only one runs at a time)."""
        return "|".join(f"({step.command.process_pattern()})" for step in self.steps)


EXAMPLE_TRAINER = ContainerCommand(
    "module", "hpctrain", ("train", "--data-dir", "{data_dir}", "--output-dir", "{output_dir}")
)


@dataclass(frozen=True)
class TrainerSetting:
    """How the example trainer reads one option's value (hpctrain.config's Option: its kind, its
    check, its choices), so that a value it would refuse is refused here, before a job waits in the
    queue to fail at its first line."""

    kind: str  # "int", "float", "bool", "text" or "path"
    least: float | None = None  # the value must be at least this
    positive: bool = False  # the value must be above 0
    choices: tuple[str, ...] = ()

    def problem(self, text: str) -> str:
        """What the trainer would say is wrong with ``text``; "" where it takes it."""
        if self.choices and text not in self.choices:
            return f"not one of {', '.join(self.choices)}"
        if self.kind == "bool":
            known = ("1", "true", "yes", "on", "0", "false", "no", "off")
            return "" if text.strip().lower() in known else "not true/false (on/off, yes/no, 1/0)"
        if self.kind not in ("int", "float"):
            return ""
        try:
            value = int(text) if self.kind == "int" else float(text)
        except ValueError:
            return "not a whole number" if self.kind == "int" else "not a number"
        if self.least is not None and not value >= self.least:
            return f"must be at least {self.least:g}"
        if self.positive and not value > 0:
            return "must be above 0"
        return ""


_WHOLE, _COUNT, _AMOUNT = (
    TrainerSetting("int", least=0),
    TrainerSetting("int", least=1),
    TrainerSetting("float", least=0),
)

# The example trainer's `train` options (hpctrain.config.OPTIONS; a unit test holds the two the same,
# value by value): a sweep's keys and values and the words after `--` are checked against them, as the
# trainer is not installed beside hpcbox to ask.
EXAMPLE_TRAINER_OPTIONS: dict[str, TrainerSetting] = {
    "--amp": TrainerSetting("bool"), "--batch-size": _COUNT, "--data-dir": TrainerSetting("path"),
    "--device": TrainerSetting("text", choices=("auto", "cpu", "cuda")), "--epochs": _COUNT,
    "--freeze-epochs": _WHOLE, "--gpu-sample-interval": _AMOUNT, "--image-size": _COUNT,
    "--keep-checkpoints": _COUNT, "--log-interval": _WHOLE, "--lr": TrainerSetting("float", positive=True),
    "--model": TrainerSetting("text", choices=("cnn", "resnet18")), "--momentum": _AMOUNT,
    "--output-dir": TrainerSetting("path"), "--pretrained-weights": TrainerSetting("path"), "--seed": _WHOLE,
    "--step-pause": _AMOUNT, "--steps-per-epoch": _WHOLE, "--weight-decay": _AMOUNT, "--workers": _WHOLE,
}  # fmt: skip


def example_trainer_args_problem(args: Sequence[str]) -> str:
    """What the example trainer would refuse in ``args`` (the words after its own, as argparse reads
    them: `--lr 0.1`, `--lr=0.1`, an option's unambiguous start), in one line; "" where it takes them."""
    words = list(args)
    while words:
        word = words.pop(0)
        name, equals, value = word.partition("=")
        if not name.startswith("-") or name == "-":
            return f"{word!r} is not an option of the trainer's, nor an option's value"
        starting = [option for option in EXAMPLE_TRAINER_OPTIONS if option.startswith(name)]
        option = name if name in EXAMPLE_TRAINER_OPTIONS else starting[0] if len(starting) == 1 else None
        if option is None and len(starting) > 1 and name.startswith("--"):
            return f"{name} could be any of {', '.join(sorted(starting))}"
        if option is None:
            close = difflib.get_close_matches(name, sorted(EXAMPLE_TRAINER_OPTIONS), n=1)
            meant = f" (did you mean {close[0]}?)" if close else ""
            return f"the trainer has no option {name}{meant}"
        if not equals:
            if not words or words[0].startswith("--"):
                return f"{option} takes a value"
            value = words.pop(0)
        if problem := EXAMPLE_TRAINER_OPTIONS[option].problem(value):
            return f"the trainer cannot take {value!r} for {option}: {problem}"
    return ""


# The example trainer's settings a checkpoint must be resumed with (hpctrain.config.RESUME_INVARIANTS),
# each with the trainer's default where it has a fixed one (None: decided from other settings): a unit
# test holds them equal to the trainer's.
EXAMPLE_TRAINER_RESUME_SETTINGS: dict[str, str | None] = {
    "--model": "cnn", "--epochs": "10", "--batch-size": "64", "--lr": "0.05", "--momentum": "0.9",
    "--weight-decay": "0.0005", "--seed": "0", "--freeze-epochs": None, "--image-size": None,
    "--steps-per-epoch": "0",
}  # fmt: skip


def example_trainer_resume_conflicts(earlier: Sequence[str], now: Sequence[str]) -> list[str]:
    """The settings the example trainer would refuse to resume a checkpoint written under arguments
    ``earlier`` with under arguments ``now``, a line each (`--epochs 1000, now 2`); a setting left out
    counts as the trainer's default, and where that depends on others only settings given both times
    are compared."""
    before, after = _last_values(earlier), _last_values(now)
    conflicts = []
    for flag, default in EXAMPLE_TRAINER_RESUME_SETTINGS.items():
        was, is_now = before.get(flag, default), after.get(flag, default)
        if was is None or is_now is None or _same_setting(was, is_now):
            continue
        was_said = was if flag in before else f"{was} (the default)"
        now_said = is_now if flag in after else f"{is_now} (left out: the default)"
        conflicts.append(f"{flag} {was_said}, now {now_said}")
    return conflicts


def _last_values(args: Sequence[str]) -> dict[str, str]:
    """Each `--flag value` or `--flag=value` in ``args``, its last value (as argparse keeps)."""
    values: dict[str, str] = {}
    for index, word in enumerate(args):
        flag, equals, value = word.partition("=")
        if flag.startswith("--") and equals:
            values[flag] = value
        elif word.startswith("--") and index + 1 < len(args):
            values[word] = args[index + 1]
    return values


def _same_setting(one: str, other: str) -> bool:
    """Whether two values of a setting are one: as numbers where both are (`5e-4` is `0.0005`)."""
    try:
        return float(one) == float(other)
    except ValueError:
        return one == other


def runs_example_trainer(run: ContainerCommand | Steps) -> bool:
    """Whether the project's program is (or, of steps, includes) the example trainer."""
    commands = [step.command for step in run.steps] if isinstance(run, Steps) else [run]
    return any(command.kind == "module" and command.target == EXAMPLE_TRAINER.target for command in commands)


# The example trainer's dataset as `invoke demo` makes it, under the project's state folder: what its
# jobs stage when no other is named, so that a submit after the demo needs no --data.
EXAMPLE_DATASET = Path("data", "digits.tar")

# What a notebook job runs (`hpcbox notebook`, from the notebook stage of the image): JupyterLab,
# reachable from the login node on the port and with the token the job script hands it, showing node
# scratch (the dataset, and the output folder, where new notebooks go: it is copied back as a job's
# results are).
NOTEBOOK = ContainerCommand(
    "program",
    "jupyter-lab",
    (
        "--no-browser",
        f"--ServerApp.root_dir={SCRATCH_MOUNT}",
        f"--FileContentsManager.preferred_dir={OUTPUT_DIR}",
    ),
    launcher="srun",
)
# Where the notebook keeps its runtime files (the port and token among them), on node scratch; and the
# job's Jupyter configuration (the address it listens on), found through JUPYTER_CONFIG_PATH.
NOTEBOOK_RUNTIME_DIR = "tmp/jupyter"
NOTEBOOK_CONFIG_DIR = "tmp/jupyter-config"


def command_from_table(
    table: Mapping[str, object],
    code_paths: Sequence[str],
    exists,
    scripts: Mapping[str, str] | None = None,
) -> ContainerCommand | Steps:
    """Validate `[tool.hpcbox.run]`. `exists(path)` says whether a project-relative file exists;
    ``scripts`` are the project's `[project.scripts]`, which `entry_point` names."""
    run = Table(dict(table), "tool.hpcbox.run")
    if "steps" in run:
        return _steps(run, code_paths, exists, scripts or {})
    unknown = sorted(set(table) - {*KINDS, "args", "launcher"})
    if unknown:
        raise FieldError(
            run.key(unknown[0]), f"unknown key; use one of {', '.join(KINDS)}, args, launcher and steps"
        )
    return _command(run, code_paths, exists, _launcher(run), scripts or {})


def _launcher(run: Table) -> str:
    return run.choice("launcher", LAUNCHERS, default="torchrun")


def _steps(run: Table, code_paths: Sequence[str], exists, scripts: Mapping[str, str]) -> Steps:
    beside = sorted(set(run.data) - {"steps", "launcher"})
    if beside:
        raise FieldError(
            run.key(beside[0]),
            "is given beside steps: each step names its own program and arguments in its "
            "[[tool.hpcbox.run.steps]] table",
        )
    tables = run.data["steps"]
    if not isinstance(tables, list) or not tables or not all(isinstance(step, dict) for step in tables):
        raise FieldError(
            run.key("steps"),
            "must be one or more [[tool.hpcbox.run.steps]] tables, each with a module, script or program",
        )
    launcher = _launcher(run)
    steps = []
    for index, data in enumerate(tables):
        step = Table(data, f"{run.key('steps')}[{index}]")
        unknown = sorted(set(data) - {*KINDS, "args", "name"})
        if unknown == ["launcher"]:
            raise FieldError(
                step.key("launcher"), "the launcher is the whole job's: set it in [tool.hpcbox.run]"
            )
        if unknown:
            raise FieldError(
                step.key(unknown[0]), f"unknown key; use one of {', '.join(KINDS)}, args and name"
            )
        command = _command(step, code_paths, exists, launcher, scripts)
        name = step.get("name", str, hint='e.g. name = "evaluate"')
        if name is None:
            name = PurePosixPath(command.target).name
        elif not _STEP_NAME.match(name):
            raise FieldError(
                step.key("name"), f"{name!r}: use letters, digits, '.', '_' or '-', e.g. name = \"evaluate\""
            )
        steps.append(Step(name, command))
    return Steps(tuple(steps))


def _command(
    table: Table, code_paths: Sequence[str], exists, launcher: str, scripts: Mapping[str, str]
) -> ContainerCommand:
    """One program with its arguments: `[tool.hpcbox.run]`, or one of its steps."""
    given = [kind for kind in KINDS if kind in table]
    if len(given) != 1:
        raise FieldError(table.where, f"give exactly one of {', '.join(KINDS)} (found {len(given)})")
    kind = given[0]
    value = table.string(kind)
    args = table.str_list("args", default=[], empty_items=True, hint='e.g. args = ["--epochs", "10"]')
    if any("\0" in arg for arg in args):
        raise FieldError(
            table.key("args"), "an argument contains a NUL byte, which no program argument can hold"
        )
    if kind == "module" and not _MODULE.match(value):
        raise FieldError(table.key("module"), f"{value!r} is not a Python module name, e.g. mypackage.train")
    if kind == "program" and not _PROGRAM.match(value):
        raise FieldError(
            table.key("program"), f"{value!r} is not a program name or an absolute path in the image"
        )
    target = value
    if kind == "script":
        target = _script_in_container(table.key("script"), value, code_paths, exists)
    elif kind == "entry_point":
        target = _entry_point(table.key("entry_point"), value, scripts)
    return ContainerCommand(kind, target, tuple(args), launcher)


def _entry_point(field: str, name: str, scripts: Mapping[str, str]) -> str:
    """`module:function` for one of the project's [project.scripts], or as given."""
    target = scripts.get(name, name)
    if not isinstance(target, str) or not _ENTRY_POINT.match(target.replace(" ", "")):
        known = f" (it has: {', '.join(sorted(scripts))})" if scripts else ""
        raise FieldError(
            field,
            f"{name!r} is neither a [project.scripts] name of the project{known} nor module:function",
        )
    return target.replace(" ", "")


def _script_in_container(field: str, script: str, code_paths: Sequence[str], exists) -> str:
    """Where a project-relative script lands: the code snapshot keeps each code path's last part."""
    path = PurePosixPath(script)
    if path.is_absolute() or ".." in path.parts:
        raise FieldError(field, f"{script!r} must be a path inside the project, e.g. scripts/train.py")
    if not exists(script):
        raise FieldError(field, f"{script} does not exist in the project")
    for code in code_paths:
        code_path = PurePosixPath(code)
        if path == code_path or code_path in path.parents:
            inside = path.relative_to(code_path)
            return str(PurePosixPath(CODE_MOUNT, code_path.name, inside))
    raise FieldError(
        field, f"{script} is not among the code paths {list(code_paths)}: add its folder to code"
    )
