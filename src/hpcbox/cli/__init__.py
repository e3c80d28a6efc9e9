"""The `hpcbox` command: hpcbox's tasks (hpcbox.cli.tasks) as a program of their own, no tasks.py needed."""

from __future__ import annotations

from invoke import Program

from hpcbox import __version__
from hpcbox.cli.tasks import collection


def main() -> None:
    Program(namespace=collection(), name="hpcbox", binary="hpcbox", version=__version__).run()
