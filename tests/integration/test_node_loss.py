"""A compute node dies in the middle of a training job: Slurm requeues the job, which resumes on the
other node from the checkpoint its periodic copy (`--sync-every`) left on shared storage, and completes.

The node is killed outright (`docker kill`: no signal reaches the job, no exit trap runs), on a cluster
of its own so that the session's cluster keeps both its nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from hpcbox.resources import ResourceRequest
from tests.fixtures.cluster import free_port
from tests.integration.test_sbatch_cluster import prepare_job_dir, render_local, sacct, wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Long enough that the job is still training when a periodic copy (every 5 s) first brings an epoch's
# checkpoint to shared storage, on an idle machine as on a loaded one.
EPOCHS = 40


@pytest.fixture(scope="module")
def doomed_cluster(run_id: str, docker_engine, minicluster_state) -> Iterator[object]:
    from hpcbox import minicluster as mc

    spec = mc.ClusterSpec(name=f"{run_id}-loss", nodes=2, port=free_port())
    try:
        cluster = mc.up(spec, minicluster_state)
    except Exception:
        mc.down(spec.name, minicluster_state)
        raise
    try:
        yield cluster
    finally:
        mc.down(spec.name, minicluster_state)


def epochs_done(job_dir, job_id: str) -> int:
    """The last epoch the run's metrics on shared storage record: what the periodic copies brought."""
    text = job_dir.sh(f"cat runs/{job_id}/metrics.jsonl 2>/dev/null || true").stdout
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    return max((event["epoch"] for event in events if event.get("event") == "epoch"), default=0)


def test_a_dead_node_costs_the_job_only_what_it_did_since_its_last_copy(doomed_cluster, trainer_sif, run_id):
    job_dir = prepare_job_dir(doomed_cluster, trainer_sif, f"{run_id}-loss")
    script = render_local(
        ResourceRequest(job_name="doomed", sync_every="0:05"),
        ("--epochs", str(EPOCHS), "--steps-per-epoch", "40", "--device", "cpu", "--workers", "0"),
    )
    job_id = job_dir.submit(script, "doomed.sh")
    deadline = time.monotonic() + 240
    while epochs_done(job_dir, job_id) < 1:
        assert time.monotonic() < deadline, job_dir.sh(f"cat logs/doomed-{job_id}.out", check=False).stdout
        time.sleep(2)
    batch_host = doomed_cluster.ssh(["squeue", "-h", "-j", job_id, "-o", "%B"], check=True).stdout.strip()
    assert batch_host in doomed_cluster.spec.compute_hosts, f"job {job_id} no longer runs: {batch_host!r}"
    doomed_cluster.node_container(batch_host).kill()

    state, exit_code = wait_finished(doomed_cluster, job_id, timeout_s=420)
    log = job_dir.sh(f"cat logs/doomed-{job_id}.out", check=False).stdout
    assert (state, exit_code) == ("COMPLETED", "0:0"), log
    (survivor,) = set(doomed_cluster.spec.compute_hosts) - {batch_host}
    assert sacct(doomed_cluster, job_id, "NodeList") == [survivor]
    assert int(sacct(doomed_cluster, job_id, "Restarts")[0]) >= 1
    # The second run started from a checkpoint of the first: not from nothing, and not past the end.
    resumed = [
        json.loads(line) for line in log.splitlines() if line.startswith("{") and '"resumed": {' in line
    ]
    assert resumed, log
    assert 1 <= resumed[-1]["resumed"]["epoch"] < EPOCHS, resumed
    assert epochs_done(job_dir, job_id) == EPOCHS
    assert "the trainer exited with status 0" in log
