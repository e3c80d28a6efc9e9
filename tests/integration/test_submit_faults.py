"""Faults a cluster has, in the middle of a real job on the mini cluster: its accounting (slurmdbd) stops
answering, its controller (slurmctld) restarts. The job is the session project's trainer, submitted as
`invoke submit` submits it; what it did is read from its log, its metrics and Slurm's own answers.
"""

from __future__ import annotations

import time

import pytest

from hpcbox import jobs
from hpcbox.tools import ssh
from tests.fixtures.cluster import frozen
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import finished, invoke, submit

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Long enough to be running when the fault comes, short enough to end soon after.
STEADY = ("--epochs", "3", "--steps-per-epoch", "40", "--workers", "0")


def running(minicluster, record: jobs.JobRecord) -> None:
    with ssh.Connection(minicluster.ssh_target()) as connection:
        jobs.wait(connection, record, until=lambda found: found.state == "RUNNING", timeout_s=120)


def test_accounting_that_stops_answering_mid_job_never_makes_the_job_failed(setup: Setup, minicluster):
    record = submit(setup, minicluster, STEADY)
    assert record is not None
    running(minicluster, record)
    # slurmdbd takes connections and never answers, as a hung host does
    with frozen(minicluster.node_container("accounting")):
        final = finished(minicluster, record)
        assert (final.state, final.source) == ("COMPLETED", "squeue"), final
        started = time.monotonic()
        status = invoke(setup, "status", "-j", record.job_id)
        took = time.monotonic() - started
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"job {record.job_id}: COMPLETED"), status.stdout
        assert "exit code unknown: Slurm's accounting does not answer" in status.stdout
        assert took < 20, took  # sacct alone would wait 40 s
        logs = invoke(setup, "logs", "-j", record.job_id)
        assert "the trainer exited with status 0" in logs.stdout, logs.stdout + logs.stderr
        fetched = invoke(setup, "fetch", "-j", record.job_id)
        assert fetched.returncode == 0, fetched.stderr
        report = invoke(setup, "report", "-j", record.job_id)
        errors = [line for line in report.stderr.splitlines() if line.startswith("error: ")]
        assert report.returncode != 0 and len(errors) == 1, report.stderr
        assert "Slurm's accounting (slurmdbd) does not answer" in errors[0]
    # slurmctld sends what accounting missed once it answers again: status and the report catch up.
    deadline = time.monotonic() + 120
    while True:
        status = invoke(setup, "status", "-j", record.job_id)
        if "exit code 0:0" in status.stdout or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert status.stdout.startswith(f"job {record.job_id}: COMPLETED") and "exit code 0:0" in status.stdout, (
        status.stdout + status.stderr
    )
    assert invoke(setup, "report", "-j", record.job_id).returncode == 0


def test_a_controller_restarted_mid_job_loses_nothing(setup: Setup, minicluster):
    record = submit(setup, minicluster, STEADY)
    assert record is not None
    running(minicluster, record)
    minicluster.node_container("controller").restart(timeout=30)
    final = finished(minicluster, record)
    assert (final.state, final.exit_code) == ("COMPLETED", "0:0"), final
    metrics = minicluster.ssh(["cat", f"{record.run_dir}/metrics.jsonl"], check=True).stdout
    assert metrics.count('"event": "epoch"') == 3 and '"event": "done"' in metrics
    status = invoke(setup, "status", "-j", record.job_id)
    assert status.stdout.startswith(f"job {record.job_id}: COMPLETED"), status.stdout + status.stderr
    # The controller takes new work again.
    again = submit(setup, minicluster)
    assert again is not None and finished(minicluster, again).state == "COMPLETED"
