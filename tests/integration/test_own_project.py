"""A researcher's own project, not hpcbox's: `hpcbox init` → lock → build → submit on the mini cluster
→ fetch, through the `hpcbox` command; and hpcbox installed with nothing but `pip install .`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.tools import docker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# The project's own training script: argparse, a module of its own, a PyPI package Debian lacks
# (tabulate) and one Debian's cpu flavour provides (numpy).
TRAIN = """\
import argparse
import json
from pathlib import Path

import numpy
from tabulate import tabulate

from scaling import scale


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--factor", type=float, default=1.0)
    args = parser.parse_args()
    # Its data where a dataset was staged; without one (an empty folder), numbers of its own.
    given = args.data / "numbers.txt"
    numbers = numpy.loadtxt(given) if given.exists() else numpy.arange(1, 11)
    result = {"mean": scale(float(numbers.mean()), args.factor), "numpy": numpy.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result))
    print(tabulate([[key, value] for key, value in result.items()]))


if __name__ == "__main__":
    main()
"""


def hpcbox(project: Path, *args: str, env: dict[str, str], timeout: float = 900):
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *args],
        cwd=project,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"hpcbox {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def own_project(tmp_path: Path) -> Path:
    root = tmp_path / "mean-project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "scaling.py").write_text("def scale(value, factor):\n    return value * factor\n")
    (root / "requirements.txt").write_text("numpy\ntabulate==0.9.0\n")
    (root / "data").mkdir()
    (root / "data" / "numbers.txt").write_text("1\n2\n3\n4\n")
    return root


@pytest.mark.cluster
def test_own_project_init_lock_build_submit_fetch(
    own_project: Path, run_id: str, minicluster, minicluster_state: Path, tmp_path: Path
):
    env = {
        "HPCBOX_IMAGE_REPOSITORY": f"{run_id}/own-project",
        "HPCBOX_MINICLUSTER": minicluster.name,
        "HPCBOX_MINICLUSTER_STATE": str(minicluster_state),
        "HPCBOX_CACHE": str(tmp_path / "cache"),
    }
    hpcbox(own_project, "init", "--args=--data {data_dir} --out {output_dir}", env=env)
    locked = hpcbox(own_project, "lock", "--pip-only", env=env)
    cpu_lock = (own_project / "docker/lock/cpu-requirements.txt").read_text()
    cuda_lock = (own_project / "docker/lock/cuda-requirements.txt").read_text()
    assert "tabulate==0.9.0" in cpu_lock and "\nnumpy==" not in cpu_lock, locked.stderr  # Debian's numpy
    assert "tabulate==0.9.0" in cuda_lock and "\nnumpy==" in cuda_lock
    try:
        submitted = hpcbox(
            own_project, "submit", "--cluster=local", "--offline", "--data=data", "--time=10",
            "--", "--factor", "10", env=env,
        )  # fmt: skip
        job_id = submitted.stdout.strip().splitlines()[-1]
        assert job_id.isdigit(), submitted.stdout
        followed = hpcbox(own_project, "logs", "--follow", env=env)
        assert "mean" in followed.stdout and "25" in followed.stdout, followed.stdout  # tabulate's table
        fetched = Path(hpcbox(own_project, "fetch", env=env).stdout.strip())
        result = json.loads((fetched / "result.json").read_text())
        # its own output: the mean of its own data, times the argument given after `--`
        assert result["mean"] == 25.0
        assert result["numpy"].startswith("2.2.4")  # Debian's, which the cpu lock left out
        assert fetched.is_relative_to(own_project / "runs" / "local")
        status = hpcbox(own_project, "status", env=env)
        assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout
        # its program writes no metrics.jsonl: the report says so, not that it failed to start
        reported = hpcbox(own_project, "report", env=env).stdout
        assert (
            "throughput  unknown" in reported
            and "-> unknown: python /code/train.py writes no metrics.jsonl" in (reported)
        ), reported
        assert "did not start" not in reported
        # No dataset named: the job goes, its /scratch/data empty, and said so.
        bare = hpcbox(own_project, "submit", "--cluster=local", "--offline", "--time=10", env=env)
        assert "hpcbox: no dataset (--data, or data in [tool.hpcbox]): the job's /scratch/data is empty" in (
            bare.stderr
        )
        hpcbox(own_project, "logs", "--follow", env=env)
        status = hpcbox(own_project, "status", env=env)
        assert status.stdout.startswith(f"job {bare.stdout.split()[-1]}: COMPLETED"), status.stdout
        fetched = Path(hpcbox(own_project, "fetch", env=env).stdout.strip())
        assert json.loads((fetched / "result.json").read_text())["mean"] == 5.5  # its own numbers, 1 to 10
    finally:
        for image in docker.client().images.list(name=f"{run_id}/own-project*"):
            for tag in image.tags:
                docker.remove_image(tag)


# A notebook as researchers leave it: a shell escape, its computation, a plot.
NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5, "metadata": {},
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# The mean of the numbers"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 1,
         "source": ["!pip install numpy"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 2, "source": [
            "import json, sys\n", "from pathlib import Path\n", "import numpy\n",
            "data, out = Path(sys.argv[1]), Path(sys.argv[2])\n",
            "numbers = numpy.loadtxt(data / 'numbers.txt')\n",
        ]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 3, "source": [
            "import matplotlib.pyplot as plt\n", "plt.plot(numbers)\n", "plt.show()",
        ]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 4, "source": [
            "out.mkdir(parents=True, exist_ok=True)\n",
            "(out / 'mean.json').write_text(json.dumps({'mean': float(numbers.mean())}))",
        ]},
    ],
}  # fmt: skip


@pytest.mark.cluster
def test_a_notebook_becomes_the_program_a_job_runs(
    run_id: str, minicluster, minicluster_state: Path, tmp_path: Path
):
    """`hpcbox init --from-notebook`: the notebook's code, less what a batch job cannot run, is the
    program; submitted to the mini cluster, it computes on the staged data and its output comes home."""
    root = tmp_path / "notebook-project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "numbers.txt").write_text("2\n4\n6\n")
    (root / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    (root / "requirements.txt").write_text("numpy\n")
    env = {
        "HPCBOX_IMAGE_REPOSITORY": f"{run_id}/notebook-project",
        "HPCBOX_MINICLUSTER": minicluster.name,
        "HPCBOX_MINICLUSTER_STATE": str(minicluster_state),
        "HPCBOX_CACHE": str(tmp_path / "cache"),
    }
    made = hpcbox(root, "init", "--from-notebook=analysis.ipynb", "--args={data_dir} {output_dir}", env=env)
    assert "analysis.py: cell 2 kept out as comments: a shell escape" in made.stdout, made.stdout
    assert "analysis.py: cell 4 kept out as comments: it shows a plot" in made.stdout, made.stdout
    assert 'script = "analysis.py"' in (root / "pyproject.toml").read_text()
    hpcbox(root, "lock", "--pip-only", env=env)
    try:
        submitted = hpcbox(
            root, "submit", "--cluster=local", "--offline", "--data=data", "--time=10", env=env
        )
        job_id = submitted.stdout.strip().splitlines()[-1]
        followed = hpcbox(root, "logs", "--follow", "-j", job_id, env=env)
        assert "exited with status 0" in followed.stdout, followed.stdout
        fetched = Path(hpcbox(root, "fetch", "-j", job_id, env=env).stdout.strip())
        assert json.loads((fetched / "mean.json").read_text()) == {"mean": 4.0}
    finally:
        for image in docker.client().images.list(name=f"{run_id}/notebook-project*"):
            for tag in image.tags:
                docker.remove_image(tag)


def test_pip_install_into_a_fresh_venv_gives_a_working_hpcbox_command(tmp_path: Path):
    source = tmp_path / "source"
    anywhere = shutil.ignore_patterns(".git", ".venv", ".hpcbox", "*.egg-info", "__pycache__")

    def left_out(folder: str, names: list[str]) -> set[str]:
        # setuptools' build/ and the runs/ of the checkout, not the package's own build stage
        at_root = {"build", "runs"} & set(names) if Path(folder) == REPO else set()
        return set(anywhere(folder, names)) | at_root

    shutil.copytree(REPO, source, ignore=left_out)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Nothing of this environment leaks in: not its packages, not a source tree on PYTHONPATH.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(venv / "bin/pip"), "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    shutil.rmtree(source)  # what runs from now on is what the wheel installed
    program = str(venv / "bin/hpcbox")
    helped = subprocess.run([program, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: hpcbox ")
    listed = subprocess.run([program, "--list"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert {"init", "build", "sif", "sbatch", "submit", "fetch", "cluster.up"} <= {
        line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()
    }
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "requirements.txt").write_text("numpy\n")
    initialised = subprocess.run([program, "init"], capture_output=True, text=True, env=env, cwd=project)
    assert initialised.returncode == 0, initialised.stderr
    assert "added docker/Dockerfile" in initialised.stdout  # from the installed package's data
    script = subprocess.run(
        [program, "sbatch", "--cluster=edi", "--gpus=1", "--time=1:00:00"],
        capture_output=True, text=True, env=env, cwd=project, check=False,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("#!/bin/bash") and "#SBATCH --partition=" in script.stdout
    assert "/code/train.py" in script.stdout
