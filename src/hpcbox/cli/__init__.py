"""The `hpcbox` command: hpcbox's tasks (hpcbox.cli.tasks) as a program of their own, no tasks.py needed."""

from __future__ import annotations

import difflib
import importlib
import shlex
import sys
import types
from collections.abc import Container


class _ImportedOnFirstUse(types.ModuleType):
    """Stands in for a module until one of its names is first used, and then imports it."""

    def __getattr__(self, name: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)
        return getattr(module, name)


# Invoke imports its YAML parser (and PyYAML's C parser behind it) as it starts, for config files that
# few users have: about 0.1 s of every command (bench/bench_submit.py's rows count it).
sys.modules.setdefault("invoke.vendor.yaml", _ImportedOnFirstUse("invoke.vendor.yaml"))

from invoke import Argument, ParseError, Program  # noqa: E402

from hpcbox import __version__  # noqa: E402
from hpcbox.cli.tasks import collection  # noqa: E402

# Flags users bring from the commands about one job to one that takes none of them.
_ONE_JOB_FLAGS = ("-j", "--job")
# Commands whose words after `--` are the program's: an option they do not take is likely the program's.
_PASS_PROGRAM_ARGS = ("sbatch", "submit")
# How near an unknown option must be to one of theirs to be taken for its misspelling.
_MISSPELT = 0.75
# invoke's own options that keep their single letter: -h, -l, -V.
_KEPT_LETTERS = ("help", "list", "version")


class HpcboxProgram(Program):
    """invoke's Program, with a command's unknown option said as hpcbox says errors: what is wrong,
    the options the command has, and how to do what was meant; and invoke's own options by their long
    names alone (but help, list and version): its -p (pty) and -e (echo) are sbatch's partition and
    error log to anyone who knows Slurm, and hpcbox's single letters are Slurm's."""

    def core_args(self) -> list[Argument]:
        found = super().core_args()
        for argument in found:
            if argument.names[0] not in _KEPT_LETTERS:
                argument.names = tuple(name for name in argument.names if len(name) > 1)
        return found

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as error:
            raise ParseError(
                _unknown_word(error, sorted(self.collection.task_names), self.argv), error.context
            ) from error


def _unknown_word(error: ParseError, commands: list[str], argv: list[str]) -> str:
    """invoke's "No idea what 'X' is!" as hpcbox says it: a command it does not have (with the nearest
    one), or an option the command does not take (with the ones it does; where the command runs a
    program and none of its own is near, the command line with that option moved after `--`)."""
    context = error.context
    said = str(error)
    if not said.startswith("No idea what "):
        return said
    option = said.removeprefix("No idea what ").removesuffix(" is!").strip("'\"")
    if context is None or not context.name:
        if option.startswith("-"):
            return said
        close = difflib.get_close_matches(option, commands, n=1)
        hint = (f"did you mean {close[0]}? " if close else "") + "`hpcbox --list` lists them"
        return f"error: hpcbox: no command {option!r}\n  hint: {hint}"
    flags = sorted({name for name in context.flags if name.startswith("--")})
    known = f" (its options: {', '.join(flags)})" if flags else " (it takes no options)"
    passes_program_args = context.name in _PASS_PROGRAM_ARGS
    close = difflib.get_close_matches(option, flags, n=1, cutoff=_MISSPELT if passes_program_args else 0.6)
    hint = (
        f"did you mean {close[0]}? " if close else ""
    ) + f"`hpcbox {context.name} --help` says what each does"
    meant = _moved_after_dashes(argv, option, context.flags) if passes_program_args and not close else None
    if meant:
        hint = f"the program's own options go after `--`: {meant}"
    if option in _ONE_JOB_FLAGS and context.name == "jobs":
        hint = "`hpcbox jobs` lists every job; -j JOB names one for status, logs, fetch, report and cancel"
    return f"error: hpcbox {context.name}: no option {option}{known}\n  hint: {hint}"


def _moved_after_dashes(argv: list[str], option: str, own_flags: Container[str]) -> str | None:
    """``argv`` as it was meant: ``option`` and the words that follow it up to the command's next option
    (``own_flags``), after `--` and before the program's words already there; None where no word of
    ``argv`` is ``option``."""
    words, program = argv[1:], []
    if "--" in words:
        at = words.index("--")
        words, program = words[:at], words[at + 1 :]
    start = next((at for at, word in enumerate(words) if _flag_of(word) == option), None)
    if start is None:
        return None
    end = start + 1
    while end < len(words) and _flag_of(words[end]) not in own_flags:
        end += 1
    moved = words[start:end]
    return shlex.join(["hpcbox", *words[:start], *words[end:], "--", *moved, *program])


def _flag_of(word: str) -> str:
    """The option a command-line word gives: ``--time`` of ``--time=10``, ``-p`` of ``-pgpu``."""
    if word.startswith("--"):
        return word.split("=")[0]
    return word[:2] if word.startswith("-") else word


def main() -> None:
    HpcboxProgram(namespace=collection(), name="hpcbox", binary="hpcbox", version=__version__).run()
