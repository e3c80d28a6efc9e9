"""How long `cluster.up` takes until every compute node is idle and the login node answers over SSH.

fresh: no cluster yet, node image already built (new containers, secrets and Slurm state, as each
`up` after a `down`). again: `up` on a cluster that is already running (the idempotent path), idle,
and busy: a job of the user's running on every node, which `up` leaves running.
The one-off cold image build is measured separately by `image_build_cold` only when asked
(HPCBOX_BENCH_COLD_BUILD=1), since it rebuilds the node image from scratch.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import free_port
from hpcbox import minicluster
from hpcbox.minicluster import node_image

REPEATS = 3


def _timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def run() -> list[dict]:
    rows: list[dict] = []
    if os.environ.get("HPCBOX_BENCH_COLD_BUILD"):
        rows.append(_cold_build())
    image_check = _timed(node_image.ensure_image)
    fresh, again, busy, down = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-cluster-") as state:
        for _ in range(REPEATS):
            spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
            try:
                fresh.append(_timed(lambda spec=spec: minicluster.up(spec, Path(state))))
                again.append(_timed(lambda spec=spec: minicluster.up(spec, Path(state))))
                cluster = minicluster.up(spec, Path(state))
                jobs = _busy_on_every_node(cluster)
                busy.append(_timed(lambda spec=spec: minicluster.up(spec, Path(state))))
                if (states := _states(cluster, jobs)) != ["RUNNING"] * len(jobs):
                    raise RuntimeError(f"`up` on the busy cluster did not leave its jobs running: {states}")
            finally:
                down.append(_timed(lambda spec=spec: minicluster.down(spec.name, Path(state))))
    runs = ", ".join(f"{t:.2f}" for t in busy)
    note = f"median of {REPEATS}, 2 compute nodes; runs: " + ", ".join(f"{t:.1f}" for t in fresh)
    rows += [
        _row("image_up_to_date_check", image_check, None, "content-hash lookup, no build"),
        _row("up_fresh_to_idle", statistics.median(fresh), "< 30 s", note),
        _row("up_again_to_idle", statistics.median(again), "< 30 s", "cluster already running"),
        _row(
            "up_again_busy",
            statistics.median(busy),
            "≤ 2 s",
            f"a job on every node, all its CPUs; runs: {runs}",
        ),
        _row("down", statistics.median(down), None, "containers, network, volumes, keys"),
    ]
    return rows


def _busy_on_every_node(cluster) -> list[str]:
    """A job on each compute node taking all of its CPUs, once Slurm runs them all."""
    jobs = [
        cluster.ssh(
            ["sbatch", "--parsable", f"--nodelist={host}", f"--cpus-per-task={cluster.spec.cpus_per_node}",
             "--mem=100M", "--wrap=sleep 300"], check=True,
        ).stdout.strip()
        for host in cluster.spec.compute_hosts
    ]  # fmt: skip
    deadline = time.monotonic() + 60
    while (states := _states(cluster, jobs)) != ["RUNNING"] * len(jobs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the busy row's jobs are not all running after 60 s: {states}")
        time.sleep(0.2)
    return jobs


def _states(cluster, jobs: list[str]) -> list[str]:
    listed = cluster.ssh(["squeue", "--noheader", "--format=%T", f"--jobs={','.join(jobs)}"], check=True)
    return listed.stdout.split()


def _cold_build() -> dict:
    from hpcbox.tools import docker

    ref = node_image.ensure_image().ref
    docker.remove_image(ref)
    seconds = _timed(lambda: node_image.ensure_image(no_cache=True))
    return _row("image_build_cold", seconds, None, "no build cache; apt installs from the Debian mirror")


def _row(metric: str, seconds: float, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(seconds, 2), "unit": "s", "target": target, "note": note}
