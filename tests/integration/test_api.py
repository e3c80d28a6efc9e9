"""hpcbox as a library against the mini cluster: a Python script submits through `hpcbox.Site`, waits,
fetches and finds its job again, as a user's script or notebook would, in a process of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox import jobs
from hpcbox.project.command import EXAMPLE_DATASET
from hpcbox.project.config import load_project
from tests.fixtures.submitting import Setup

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SHORT = ["--epochs", "1", "--steps-per-epoch", "10", "--workers", "0"]

# The one line (`print(hpcbox.Site('local').submit(args=[...]).wait())`), then the job's life
# through the API: found again by id, among the site's jobs, fetched; what the script loaded.
SCRIPT = f"""
import json, sys
import hpcbox

final = hpcbox.Site("local").submit(args={SHORT!r}, time="10", job_name="api-test").wait(timeout_s=300)
print(final)
site = hpcbox.Site("local")
job = site.job()
print(json.dumps({{
    "job": job.job_id,
    "state": final.state,
    "exit": final.exit_code,
    "again": job.state().state,
    "listed": [listed.job_id for listed in site.jobs()],
    "described": job.describe(),
    "fetched": str(job.fetch()),
    "invoke": "invoke" in sys.modules,
}}))
"""


def test_a_script_submits_through_the_api_waits_fetches_and_finds_its_job_again(
    setup: Setup, minicluster, tmp_path: Path
):
    project_dir = tmp_path / "project"
    shutil.copytree(setup.project_dir, project_dir, ignore=shutil.ignore_patterns(".hpcbox", "runs"))
    # Its last build the session's (cpu) one, and the dataset where `invoke demo` leaves it: no --data.
    shutil.copytree(setup.project_dir / ".hpcbox" / "images", project_dir / ".hpcbox" / "images")
    (project_dir / ".hpcbox" / EXAMPLE_DATASET).parent.mkdir(parents=True)
    shutil.copyfile(setup.data, project_dir / ".hpcbox" / EXAMPLE_DATASET)

    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=project_dir, env={**os.environ, **setup.env},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    printed, found = ran.stdout.splitlines()[-2], json.loads(ran.stdout.splitlines()[-1])
    assert (found["state"], found["exit"], found["again"]) == ("COMPLETED", "0:0", "COMPLETED"), ran.stderr
    assert "state='COMPLETED'" in printed and f"job_id='{found['job']}'" in printed
    assert "hpcbox: dataset .hpcbox/data/digits.tar (the example trainer's, from invoke demo)" in ran.stderr
    assert found["listed"] == [found["job"]]
    assert found["described"][0].startswith(f"job {found['job']}: COMPLETED")
    assert found["invoke"] is False  # the library stands on its own; invoke is the CLI's

    record = jobs.Ledger(load_project(project_dir)).find(found["job"], "local")
    assert record.resources["job_name"] == "api-test" and record.trainer_args == tuple(SHORT)
    fetched = Path(found["fetched"])
    assert fetched == project_dir / "runs" / "local" / found["job"]
    assert '"event": "done"' in (fetched / "metrics.jsonl").read_text()
    # its log beside its results, in the same transfer
    assert "the trainer exited with status 0" in (fetched / Path(record.log).name).read_text()
    # The command line finds the same job, in the same state.
    status = subprocess.run(
        [sys.executable, "-m", "hpcbox", "status", "-j", found["job"]], cwd=project_dir,
        env={**os.environ, **setup.env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert status.returncode == 0 and status.stdout.strip() == found["described"][0], status.stderr
