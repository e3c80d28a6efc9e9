"""A compute node dies in the middle of a training job: Slurm marks it down and requeues the job, which
resumes on the other node from the checkpoint its periodic copy (`--sync-every`) left on shared storage,
and completes.

The node is killed outright (`docker kill`: no signal reaches the job, no exit trap runs), then started
again so that the session's cluster is whole for the tests after this one.
"""

from __future__ import annotations

import json
import time

import pytest

from hpcbox.minicluster.spec import USER
from hpcbox.render.resources import ResourceRequest
from tests.integration.test_minicluster import wait_for_state
from tests.integration.test_sbatch_cluster import prepare_job_dir, render_local, sacct, wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Long enough that the job is still training when a periodic copy (every 5 s) first brings an epoch's
# checkpoint to shared storage, on an idle machine as on a loaded one: each epoch about 2.5 s, most of
# it resting between steps, so that the job takes little CPU from the tests beside it.
EPOCHS = 20
TRAINING = ("--epochs", str(EPOCHS), "--steps-per-epoch", "10", "--step-pause", "0.2")


def epochs_done(job_dir, job_id: str) -> int:
    """The last epoch the run's metrics on shared storage record: what the periodic copies brought."""
    text = job_dir.sh(f"cat runs/{job_id}/metrics.jsonl 2>/dev/null || true").stdout
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    return max((event["epoch"] for event in events if event.get("event") == "epoch"), default=0)


def test_a_dead_node_costs_the_job_only_what_it_did_since_its_last_copy(minicluster, trainer_sif, run_id):
    """The job is requeued and resumes from the checkpoint its last periodic copy brought (the newest on
    shared storage when its node died), and completes all its epochs."""
    cluster = minicluster
    job_dir = prepare_job_dir(cluster, trainer_sif, f"{run_id}-loss")
    script = render_local(
        ResourceRequest(job_name="doomed", sync_every="0:05"),
        (*TRAINING, "--device", "cpu", "--workers", "0"),
    )
    job_id = job_dir.submit(script, "doomed.sh")
    deadline = time.monotonic() + 240
    while epochs_done(job_dir, job_id) < 1:
        assert time.monotonic() < deadline, job_dir.sh(f"cat logs/doomed-{job_id}.out", check=False).stdout
        time.sleep(2)
    batch_host = cluster.ssh(["squeue", "-h", "-j", job_id, "-o", "%B"], check=True).stdout.strip()
    assert batch_host in cluster.spec.compute_hosts, f"job {job_id} no longer runs: {batch_host!r}"
    # The job's processes there stopped first (the periodic copy with them), so that the last copy is
    # known: the newest checkpoint on shared storage now. Then the node dies.
    stopped = cluster.exec(batch_host, ["pkill", "--signal", "STOP", "--uid", USER])
    assert stopped.returncode == 0, stopped
    copied = job_dir.sh(f"ls runs/{job_id}/checkpoints").stdout.split()
    last_copy = max(name for name in copied if name.startswith("ckpt-"))
    cluster.node_container(batch_host).kill()
    try:
        wait_for_state(cluster, batch_host, "down", timeout_s=60)
        state, exit_code = wait_finished(cluster, job_id, timeout_s=420)
        log = job_dir.sh(f"cat logs/doomed-{job_id}.out", check=False).stdout
        assert (state, exit_code) == ("COMPLETED", "0:0"), log
        (survivor,) = set(cluster.spec.compute_hosts) - {batch_host}
        assert sacct(cluster, job_id, "NodeList") == [survivor]
        assert int(sacct(cluster, job_id, "Restarts")[0]) >= 1
        # The second run started from the first's last copy: not from an earlier one, nor from nothing.
        resumed = [
            json.loads(line) for line in log.splitlines() if line.startswith("{") and '"resumed": {' in line
        ]
        assert resumed, log
        assert resumed[-1]["resumed"]["checkpoint"] == last_copy, (resumed, copied)
        assert 1 <= resumed[-1]["resumed"]["epoch"] < EPOCHS, resumed
        assert epochs_done(job_dir, job_id) == EPOCHS
        assert "the trainer exited with status 0" in log
    finally:
        # ReturnToService=2: the node comes back idle once its slurmd registers.
        cluster.node_container(batch_host).start()
        wait_for_state(cluster, batch_host, "idle", timeout_s=60)
