"""What `hpcbox init --ci` writes: a GitHub Actions workflow and the script it runs.

The script, not the workflow, holds the steps, so a laptop runs exactly what CI runs: install hpcbox (in
a virtual environment of the project's own, git-ignored under .hpcbox/), then `hpcbox ci`, which builds
the environment, brings a mini cluster up shaped like `[tool.hpcbox.ci] cluster`, submits the job with
the table's arguments and time limit, and fails unless it ends COMPLETED with its outputs home.
"""

from __future__ import annotations

from importlib.metadata import version

from hpcbox.tables import toml_value

WORKFLOW = ".github/workflows/hpcbox.yml"
SCRIPT = "ci/hpcbox-ci.sh"


def workflow() -> str:
    return f"""\
# Written by `hpcbox init --ci`: on every push, this project's job runs on a mini Slurm cluster in
# Docker, shaped like the site it goes to. The steps are in {SCRIPT}, which runs the same on a laptop;
# what the job is given: [tool.hpcbox.ci] in pyproject.toml. The repository variable HPCBOX_INSTALL
# (a pip requirement) says where hpcbox comes from, if not from PyPI.
name: hpcbox
on:
  push:
  pull_request:
jobs:
  rehearse:
    runs-on: ubuntu-latest
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - run: {SCRIPT}
        env:
          HPCBOX_INSTALL: ${{{{ vars.HPCBOX_INSTALL }}}}
"""


def script() -> str:
    release = version("hpcbox")  # the installed hpcbox's, which writes the script
    return f"""\
#!/usr/bin/env bash
# Written by `hpcbox init --ci`: this project's job rehearsed on a mini Slurm cluster in Docker, as
# {WORKFLOW} runs it on every push and as it runs here. It needs Python 3 and Docker.
# HPCBOX_INSTALL: the pip requirement hpcbox is installed from (default: the release that wrote this).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.hpcbox/ci/venv
if ! "$venv/bin/hpcbox" --version >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "${{HPCBOX_INSTALL:-hpcbox=={release}}}"
fi
exec "$venv/bin/hpcbox" ci
"""


def ci_table(args: list[str], prefix: str) -> str:
    """`[tool.hpcbox.ci]` as TOML text to add to pyproject.toml, after ``prefix`` (a blank line where
    the file has tables)."""
    lines = [
        "[tool.hpcbox.ci]",
        "# Written by `hpcbox init --ci`: what `hpcbox ci` submits to its mini cluster. A small",
        "# configuration of the job (a CI machine has two cores), within a time limit.",
        f"args = {toml_value(args)}",
        'time = "15"',
        "# The profile the mini cluster is shaped like (its partitions, GPU types, Slurm version).",
        'cluster = "local"',
    ]
    return prefix + "\n".join(lines) + "\n"
