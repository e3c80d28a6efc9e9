"""Sweeps: one array task per point of a grid of the program's options, from a small TOML file.

    # sweep.toml
    throttle = 4                  # optional: at most 4 tasks at once (--array=...%4)

    [grid]                        # every combination; the first key changes slowest
    lr = [0.1, 0.01]
    batch-size = [32, 64]

    [[points]]                    # and/or points one by one, after the grid's
    lr = 0.5
    batch-size = 16
    augment = true

Each point becomes the task's arguments, after the job's own: `--lr 0.1 --batch-size 32`; `true` is a
bare flag (`--augment`), `false` leaves the option out, a list in a point gives the option several
values (`--layers 2 4`). A key that starts with `-` is taken as written (`-v = true` is `-v`). A key is
the program's own spelling of the option (`batch-size`, not `batch_size`): for the example trainer,
whose options hpcbox knows, each key and value is checked (`lr = -1` is refused here, not by each
task); a project's own program gets them as written.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError
from hpcbox.tables import Table, load_toml

# Slurm's default MaxArraySize is 1001: task ids 0-1000.
MAX_POINTS = 1001
_OPTION = re.compile(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GIVEN_OPTION = re.compile(r"^--[A-Za-z][A-Za-z0-9_.-]*(=|$)")  # a value like this is an option's name


@dataclass(frozen=True)
class Sweep:
    """The tasks of a sweep: each one's arguments, in task order (task i runs ``points[i]``)."""

    source: str  # the file's name, for the job script's comment
    points: tuple[tuple[str, ...], ...]
    throttle: int | None = None  # at most this many tasks run at once

    def array(self, tasks: tuple[int, ...] | None = None) -> str:
        """The --array spec: every task, or only ``tasks`` (a resubmission of some of them)."""
        spec = _ranges(tasks) if tasks is not None else f"0-{len(self.points) - 1}"
        return spec + (f"%{self.throttle}" if self.throttle else "")


# A program's own options, each with what is wrong with a value of it ("" where it takes the value):
# each takes one value.
ProgramOptions = Mapping[str, Callable[[str], str]]


def load_sweep(path: Path, options: ProgramOptions | None = None) -> Sweep:
    """Read and check a sweep file; the first problem raises FieldError naming the key. ``options``:
    the program's own, whose values are checked (None: unknown, each key and value taken as written)."""
    if not path.is_file():
        raise FieldError("sweep", f"{path} does not exist", "give the path of a sweep file (TOML)")
    shape = "a sweep file is TOML: a [grid] of option = [values] (lr = [0.1, 0.01]) and/or [[points]]"
    sweep = Table(load_toml(path, "sweep", shape), "sweep")
    grid = sweep.table("grid", required=False, hint="a table of option = [values]")
    points = [*_grid_points(grid, options), *_listed_points(sweep.tables("points", required=False), options)]
    throttle = sweep.get("throttle", int, must="a whole number of tasks, 1 or more")
    if throttle is not None and throttle < 1:
        raise FieldError(sweep.key("throttle"), f"{throttle!r} must be a whole number of tasks, 1 or more")
    sweep.reject_extra(what="sweep setting")
    if not points:
        raise FieldError("sweep", f"{path.name} has no points", "add a [grid] table or [[points]] tables")
    if len(points) > MAX_POINTS:
        raise FieldError(
            "sweep",
            f"{path.name} has {len(points)} points, more than the {MAX_POINTS} tasks of Slurm's default "
            "MaxArraySize",
            "split it into several sweeps",
        )
    return Sweep(path.name, tuple(points), throttle)


def point_args(
    point: Mapping[str, object], where: str, options: ProgramOptions | None = None
) -> tuple[str, ...]:
    """One point's options as program arguments; each one of ``options``, with a value it takes, where
    they are known."""
    args: list[str] = []
    for key, value in point.items():
        if not _OPTION.match(key):
            raise FieldError(f"{where}.{key}", "is not an option name (letters, digits, - _ .)")
        option = key if key.startswith("-") else f"--{key}"
        _refuse_options_as_values(value, f"{where}.{key}")
        if options is not None and option not in options:
            close = difflib.get_close_matches(option, sorted(options), n=1)
            meant = (
                f"did you mean {close[0].removeprefix('--')}?"
                if close
                else f"its options: {', '.join(sorted(options))}"
            )
            raise FieldError(f"{where}.{key}", f"the program has no option {option}", meant)
        if options is not None:
            _check_value(value, options[option], f"{where}.{key}", option)
        if value is True:
            args.append(option)
        elif value is False:
            continue
        elif isinstance(value, list):
            args += [option, *(_word(item, f"{where}.{key}") for item in value)]
        else:
            args += [option, _word(value, f"{where}.{key}")]
    return tuple(args)


def _check_value(value: object, problem_of: Callable[[str], str], where: str, option: str) -> None:
    """A value the program would refuse, refused here: its every task would fail at its first line."""
    if value is True or isinstance(value, list):
        key = where.rpartition(".")[2]
        raise FieldError(where, f"the program's {option} takes one value", f"write {key} = VALUE")
    if value is not False and (problem := problem_of(_word(value, where))):
        raise FieldError(where, f"the program cannot take {_word(value, where)!r} for {option}: {problem}")


def _grid_points(grid: Table, options: ProgramOptions | None) -> list[tuple[str, ...]]:
    choices = []
    for key in grid.data:
        values = grid.get(key, list, hint=f"e.g. {key} = [1, 2]", must="a non-empty list of values")
        if not values:
            raise FieldError(grid.key(key), f"must be a non-empty list of values, e.g. {key} = [1, 2]")
        choices.append([(key, value) for value in values])
    if not choices:
        return []
    return [point_args(dict(combination), grid.where, options) for combination in itertools.product(*choices)]


def _listed_points(points: list[Table], options: ProgramOptions | None) -> list[tuple[str, ...]]:
    return [point_args(point.data, point.where, options) for point in points]


def _refuse_options_as_values(value: object, where: str) -> None:
    """`args = ["--lr", "0.1"]` would run `--args --lr 0.1`: a point written as its command line."""
    values = value if isinstance(value, list) else [value]
    given = next((item for item in values if isinstance(item, str) and _GIVEN_OPTION.match(item)), None)
    if given is not None:
        name = given.removeprefix("--").partition("=")[0]
        raise FieldError(
            where,
            f"holds an option ({given}), not a value: a point's keys are the options",
            f"write {name} = VALUE for {given.partition('=')[0]} VALUE",
        )


def _word(value: object, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        text = str(value)
        if "\0" in text:
            raise FieldError(where, f"{text!r} contains a NUL byte, which no program argument can hold")
        return text
    raise FieldError(where, f"{value!r} is not a string, number or true/false")


def _ranges(tasks: tuple[int, ...]) -> str:
    """0,1,2,5,7,8 → 0-2,5,7-8."""
    parts = []
    for _, run in itertools.groupby(enumerate(sorted(set(tasks))), lambda pair: pair[1] - pair[0]):
        numbers = [number for _, number in run]
        parts.append(f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0]))
    return ",".join(parts)
