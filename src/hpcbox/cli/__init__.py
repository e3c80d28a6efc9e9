"""The `hpcbox` command: hpcbox's tasks (hpcbox.cli.tasks) as a program of their own, no tasks.py needed."""

from __future__ import annotations

import importlib
import sys
import types


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

from invoke import Program  # noqa: E402

from hpcbox import __version__  # noqa: E402
from hpcbox.cli.tasks import collection  # noqa: E402


def main() -> None:
    Program(namespace=collection(), name="hpcbox", binary="hpcbox", version=__version__).run()
