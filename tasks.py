"""This repository's tasks: every hpcbox command, from the same two lines any project's tasks.py has,
and the development ones (demo, lint, test, bench). `invoke --list` shows them."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from hpcbox.tasks import collection, friendly, say, task

ns = collection()

ROOT = Path(__file__).resolve().parent
SHELL_SCRIPTS = ("bootstrap", ".ci/run", ".ci/cgroup2", ".ci/cgroup2-guest", "docker/apt-install.sh")


@task(
    help={
        "epochs": "epochs the demo trains (default 3)",
        "name": "the mini cluster's name (default hpcbox-local)",
        "port": "its login node's SSH port on 127.0.0.1 (default 2222)",
        "force": "replace a mini cluster of other settings even while Slurm has unfinished jobs on it",
    }
)
@friendly
def demo(c, epochs=3, name=None, port=None, force=False):
    """The whole pipeline on the mini cluster: build, sif, cluster up, submit, wait, fetch, report."""
    from hpcbox.cli.demo import run_demo
    from hpcbox.minicluster.spec import DEFAULT_NAME, DEFAULT_PORT

    port = int(port or DEFAULT_PORT)
    run_demo(epochs=int(epochs), name=name or DEFAULT_NAME, port=port, force=force, say=say)


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
        "reverse": "run each lane's integration modules in reverse order (any order must pass)",
        "note": "how this run is made (e.g. fresh clone, engine wiped), as suite.json's history records it "
        "(default: $HPCBOX_SUITE_NOTE)",
        "cpu": "the whole suite's CPU by where it ran and by program, from the kernel's process accounting "
        "(root only), into the same results",
    }
)
def test(c, k=None, unit=False, lint_first=True, reverse=False, note=None, cpu=False):
    """Run lint, the docs site's strict build and the whole test suite (real Docker, Apptainer, Slurm)."""
    if lint_first:
        lint(c)
    # The docs site, strict: a broken link or anchor fails the suite. Built into a folder removed
    # afterwards, so the checkout keeps nothing of it. Not --quiet: it hides the warnings --strict counts.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hpcbox-site-") as site:
        mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict"]
        mkdocs += ["--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", site]
        c.run(shlex.join(mkdocs), pty=False, env={"NO_MKDOCS_2_WARNING": "1"})
    # A worker for each lane of integration modules (`auto`: tests/conftest.py's LANES say how many);
    # the unit tests fill in where a lane ends first.
    # Debian moves past the locks' pins between `invoke lock --record`s: the recorded-digests test then
    # names the moved pins and passes here, so that this command passes on any day; CI's weekly run
    # (.github/workflows/drift.yml) leaves it unset and fails.
    os.environ.setdefault("HPCBOX_ALLOW_DRIFT", "1")
    if note:
        os.environ["HPCBOX_SUITE_NOTE"] = note
    args = [sys.executable, "-m", "pytest", "--numprocesses=2" if unit else "--numprocesses=auto"]
    args.append("tests/unit" if unit else "tests")
    if k:
        args += ["-k", k]
    elif not unit:  # the whole suite: each module's time into bench/results/suite.json and docs/testing.md
        args.append("--record-durations")
    if reverse:
        args.append("--reverse-modules")
    if cpu:
        args.append("--record-cpu")
    c.run(shlex.join(args), pty=False)


@task(help={"name": "benchmark to run (bench/bench_NAME.py); all when omitted"})
def bench(c, name=None):
    """Run benchmarks (`invoke bench --name submit`), write bench/results/NAME.json, print a table."""
    c.run(shlex.join([sys.executable, "bench/run.py", *([name] if name else [])]), pty=False)


for development_task in (demo, lint, test, bench):
    ns.add_task(development_task)
