"""Faults a cluster has, in the middle of a real job on the mini cluster: its accounting (slurmdbd) stops
answering, its controller (slurmctld) restarts; and the user's own, a Ctrl-C while the job is sent. The
job is the session project's trainer, submitted as `invoke submit` submits it; what it did is read from
its log, its metrics and Slurm's own answers.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest

from hpcbox import jobs
from hpcbox.tools import ssh
from tests.fixtures.cluster import frozen
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import REPO, SHORT, finished, invoke, submit

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


# sbatch on the login node, held until the test says go: the moment a Ctrl-C comes while the command
# that ends in sbatch runs there, made to last (the real sbatch runs after it, as it would).
HELD_SBATCH = """#!/bin/sh
touch {held}/started
while ! test -e {held}/go; do sleep 0.1; done
exec /usr/bin/sbatch "$@"
"""


TAKING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_a_ctrl_c_while_the_job_is_sent_leaves_it_recorded_not_running_unknown(setup: Setup, minicluster):
    """Found as a user: of 30 submits interrupted at a random moment, 3 had their job running with its
    id known nowhere here (Ctrl-C ended ssh while sbatch ran on the login node, and sbatch went on).
    The terminal's Ctrl-C (SIGINT to the command's process group) comes while sbatch runs: the command
    says it waits, and ends interrupted once the job is recorded, which Slurm runs to its end."""
    login = minicluster.node_container("login")
    held = f"/tmp/hpcbox-held-sbatch-{uuid.uuid4().hex[:8]}"
    wrapper = HELD_SBATCH.format(held=held)
    install = f"mkdir -m 777 {held} && printf %s {shlex.quote(wrapper)} > /usr/local/bin/sbatch"
    assert login.exec_run(["sh", "-c", f"{install} && chmod 755 /usr/local/bin/sbatch"]).exit_code == 0
    before = {record.job_id for record in jobs.Ledger(setup.project()).all()}
    try:
        # A terminal's command takes Ctrl-C whatever its parent ignores (a suite run in the background
        # ignores SIGINT, and its children would inherit that).
        command = [sys.executable, "-c", TAKING_SIGINT, "-m", "invoke", "-r", str(REPO), "submit",
                   "--cluster=local", f"--data={setup.data}", "--time=10", "--", *SHORT]  # fmt: skip
        submitting = subprocess.Popen(
            command, cwd=setup.project_dir, env={**os.environ, **setup.env}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        while login.exec_run(["test", "-e", f"{held}/started"]).exit_code != 0:
            assert submitting.poll() is None, submitting.communicate()
            time.sleep(0.2)
        os.killpg(submitting.pid, signal.SIGINT)  # as the terminal sends Ctrl-C
        login.exec_run(["touch", f"{held}/go"])
        out, err = submitting.communicate(timeout=120)
    finally:
        login.exec_run(["rm", "-rf", "/usr/local/bin/sbatch", held])
    assert submitting.returncode != 0, out + err
    assert "hpcbox: SIGINT: stopping once the job being sent is recorded" in err, err
    said = re.search(
        r"^hpcbox: SIGINT came while job (\d+) was being sent: it was sent and is recorded", err, re.M
    )
    assert said, err
    recorded = {record.job_id: record for record in jobs.Ledger(setup.project()).all()}
    assert set(recorded) - before == {said[1]}, recorded.keys()
    assert finished(minicluster, recorded[said[1]]).state == "COMPLETED"
