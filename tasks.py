"""This repository's tasks: every hpcbox command, from the same two lines any project's tasks.py has,
and the development ones (demo, lint, test, bench). `invoke --list` shows them."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from hpcbox.tasks import collection, friendly, say, task

ns = collection()

ROOT = Path(__file__).resolve().parent
SHELL_SCRIPTS = ("bootstrap", ".ci/run", "docker/apt-install.sh")


@task(
    help={
        "epochs": "epochs the demo trains (default 3)",
        "name": "the mini cluster's name (default hpcbox-local)",
        "port": "its login node's SSH port on 127.0.0.1 (default 2222)",
    }
)
@friendly
def demo(c, epochs=3, name=None, port=None):
    """The whole pipeline on the mini cluster: build, sif, cluster up, submit, wait, fetch, report."""
    from hpcbox.cli.demo import run_demo
    from hpcbox.minicluster.spec import DEFAULT_NAME, DEFAULT_PORT

    run_demo(epochs=int(epochs), name=name or DEFAULT_NAME, port=int(port or DEFAULT_PORT), say=say)


@task
def lint(c):
    """Lint: ruff (rules and formatting) and shellcheck on the project's shell scripts."""
    # This environment's tools, whichever way invoke was started (activated or not).
    ruff = shlex.join([sys.executable, "-m", "ruff"])
    c.run(f"{ruff} check src tests bench tasks.py", pty=False)
    c.run(f"{ruff} format --check src tests bench tasks.py", pty=False)
    # and the scripts each stage ships beside its code (the node image's, the SIF helper's)
    scripts = [*SHELL_SCRIPTS, *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.sh"))]
    c.run("shellcheck " + " ".join(scripts), pty=False)


@task(
    help={
        "k": "only tests matching this pytest -k expression",
        "unit": "only the unit tests (no Docker engine needed)",
        "lint_first": "run `invoke lint` before the tests (default: yes)",
    }
)
def test(c, k=None, unit=False, lint_first=True):
    """Run the whole test suite (lint, unit and integration tests against real Docker, Apptainer, Slurm)."""
    if lint_first:
        lint(c)
    # Two workers: the integration tests keep one (see tests/conftest.py), the unit tests fill the other.
    args = [sys.executable, "-m", "pytest", "--numprocesses=2"]
    args.append("tests/unit" if unit else "tests")
    if k:
        args += ["-k", k]
    c.run(shlex.join(args), pty=False)


@task(help={"name": "benchmark to run (bench/bench_NAME.py); all when omitted"})
def bench(c, name=None):
    """Run benchmarks (`invoke bench --name submit`), write bench/results/NAME.json, print a table."""
    c.run(shlex.join([sys.executable, "bench/run.py", *([name] if name else [])]), pty=False)


for development_task in (demo, lint, test, bench):
    ns.add_task(development_task)
