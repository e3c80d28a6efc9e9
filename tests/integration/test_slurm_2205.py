"""A mini cluster running Slurm 22.05 (`hpcbox cluster.up --slurm 22.05`), the release Debian bookworm
carries and many sites still run: it comes up idle with its own node image, and the example trainer
goes through it end to end as on 24.11 (`submit`, `logs`, `status`, `report`, `cluster.status`), then
with `singularity` alone and no FUSE (test_container_software.py runs every combination on 24.11).

One cluster for the module, brought up through the command line; the tests that share the session's
`setup` get it in place of the session's 24.11 cluster (this module's `minicluster`), and submit from
a copy of the session's project, so that this cluster's job numbers stay out of the other's ledger.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox.minicluster.shape import ENFORCEMENT
from tests.fixtures.cluster import free_port
from tests.fixtures.submitting import Setup, with_own_ledger
from tests.integration.test_container_software import hpcbox, runs_on_each_software
from tests.integration.test_minicluster import (
    GROW,
    accounting,
    accounting_killed,
    gpus_seen,
    only_told,
    submit,
)
from tests.integration.test_submit import SHORT, invoke

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

TIMINGS: dict[str, float] = {}  # printed at the end of the module (pytest -s): what 22.05 adds to a run
SAID: dict[str, str] = {}  # what `cluster.up` printed


@pytest.fixture(scope="module")
def minicluster(run_id: str, docker_engine, minicluster_state: Path, tmp_path_factory) -> Iterator[object]:
    """This module's cluster: Slurm 22.05, 2 nodes, brought up by `hpcbox cluster.up --slurm 22.05` (its
    node image built first if missing) and removed at the end of the module."""
    from hpcbox import minicluster as mc

    name = f"{run_id}-s2205"
    env = {"HPCBOX_MINICLUSTER_STATE": str(minicluster_state)}
    started = time.monotonic()
    try:
        up = hpcbox(
            "cluster.up", "--slurm=22.05", f"--name={name}", f"--port={free_port()}",
            env=env, cwd=tmp_path_factory.mktemp("s2205-up"),
        )  # fmt: skip
        TIMINGS["cluster.up --slurm 22.05 (image build if missing + start)"] = time.monotonic() - started
        assert up.returncode == 0, up.stdout + up.stderr
        cluster = mc.find(name, minicluster_state)
        assert cluster is not None and cluster.spec.slurm == "22.05"
        SAID["up"] = up.stdout
        yield cluster
    finally:
        mc.down(name, minicluster_state)
        print("\n" + "\n".join(f"{what}: {seconds:.1f} s" for what, seconds in TIMINGS.items()))


@pytest.fixture(scope="module")
def own_setup(setup: Setup, tmp_path_factory) -> Setup:
    return with_own_ledger(setup, tmp_path_factory, "s2205-project")


def test_it_comes_up_idle_running_slurm_22_05_with_the_same_configuration(minicluster):
    version = minicluster.ssh(["sinfo", "--version"], check=True).stdout.strip()
    assert re.fullmatch(r"slurm(-wlm)? 22\.05\.\d+", version), version
    for host in ("controller", "node1", "accounting"):
        daemon = {"controller": "slurmctld", "node1": "slurmd", "accounting": "slurmdbd"}[host]
        said = minicluster.ask(host, [daemon, "-V"]).stdout.strip()
        assert said.startswith("slurm-wlm 22.05."), (host, said)
    out = minicluster.ssh(["sinfo", "--noheader", "--Node", "--format=%N %P %T %G"], check=True).stdout
    assert sorted(tuple(line.split()) for line in out.splitlines()) == [
        ("node1", "cpu*", "idle", "gpu:2"), ("node1", "gpu", "idle", "gpu:2"),
        ("node1", "preemptible", "idle", "gpu:2"),
        ("node2", "cpu*", "idle", "gpu:2"), ("node2", "gpu", "idle", "gpu:2"),
        ("node2", "preemptible", "idle", "gpu:2"),
    ]  # fmt: skip
    # Every slurm.conf setting hpcbox writes is one 22.05 takes: an unknown key stops slurmctld, an
    # unknown value is an error line in its log (or slurmd's).
    for host in ("controller", "node1"):
        logs = minicluster.node_container(host).logs().decode(errors="replace")
        assert not re.search(r"(?i)invalid (JobAcctGather|TaskPlugin|SlurmdParameters|AccountingStorageTRES)|"
                             r"unrecognized|Parse error|fatal", logs), logs  # fmt: skip
    # The accounting database of trixie's MariaDB works with 22.05's slurmdbd: the user and the cluster.
    assert "researcher|" in minicluster.ssh(["sacctmgr", "-n", "-P", "show", "user", "researcher"]).stdout
    # `cluster.up` ends with the cluster's status, its Slurm first.
    assert re.search(r"(?m)^Slurm 22\.05\.\d+ on every node \(`sinfo --version`\)$", SAID["up"]), SAID["up"]


def test_its_nodes_enforce_memory_and_gpu_devices_as_24_11s_do(minicluster, enforced_by):
    # 22.05's cgroup plugins on the same node containers: over --mem the process is killed at once and
    # the job ends OUT_OF_MEMORY; a one-GPU job sees its GPU as device 0 and opens no other. On an engine
    # that gives the nodes no cgroups, 22.05's accounting kills the job and a job is only told its GPUs.
    assert (
        ENFORCEMENT[minicluster.shape.cgroups].format(version=minicluster.shape.cgroup_version) in SAID["up"]
    )
    if not minicluster.shape.cgroups:
        accounting_killed(minicluster, submit(minicluster, GROW, "--mem=200M", "--output=mem-%j.out"))
        only_told(*gpus_seen(minicluster).values())
        return
    job_id = submit(minicluster, GROW, "--mem=200M", "--output=mem-%j.out")
    assert accounting(minicluster, job_id)["State"] == "OUT_OF_MEMORY"
    log = minicluster.ssh(f"cat mem-{job_id}.out", check=True).stdout
    assert "script-went-on-after=137" in log and "oom-kill event" in log, log
    first, second, cpu_only = gpus_seen(minicluster).values()
    assert first[0] == second[0] == "0" and sorted([first[1], second[1]]) == ["0", "1"], (first, second)
    for seen in (first, second):
        assert sorted(seen[3:]) == sorted(
            [f"/dev/fakegpu{seen[1]}=ENXIO", f"/dev/fakegpu{1 - int(seen[1])}=EPERM"]
        )
    assert cpu_only[3:] == ["/dev/fakegpu0=EPERM", "/dev/fakegpu1=EPERM"], cpu_only


def test_the_example_trainer_runs_to_completed_and_status_logs_report_read_it(
    own_setup: Setup, minicluster, run_id: str
):
    setup = own_setup
    started = time.monotonic()
    done = invoke(
        setup, "submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10",
        "--", *SHORT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), done.stdout
    followed = invoke(setup, "logs", "--follow", "-j", job_id)
    TIMINGS["submit (SIF shipped) + the job to its end"] = time.monotonic() - started
    assert followed.returncode == 0, followed.stderr
    assert '"event": "done"' in followed.stdout and "the trainer exited with status 0" in followed.stdout

    status = invoke(setup, "status", "-j", job_id)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"job {job_id}: COMPLETED") and "exit code 0:0" in status.stdout

    # The report asks sacct for Restarts, which 22.05 does not have: it asks again without it, counts
    # the job's runs from `sacct --duplicates`, and reports as on 24.11.
    reported = invoke(setup, "report", "-j", job_id)
    assert reported.returncode == 0, reported.stderr
    lines = reported.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id} (") and lines[0].endswith("): COMPLETED, exit code 0:0"), lines
    figures = {line.split()[0]: line for line in lines[1:] if line.startswith("  ")}
    assert {"CPU", "memory", "time", "GPUs", "throughput"} <= set(figures), reported.stdout
    assert "unknown" not in figures["time"] and "requeued" not in figures["time"], figures["time"]
    assert re.search(r"peak [\d.]+[KMG] of 640M asked", figures["memory"]), figures["memory"]
    assert "finished all 1 epochs" in figures["throughput"], figures["throughput"]

    shown = hpcbox("cluster.status", f"--name={minicluster.name}", env=setup.env, cwd=setup.project_dir)
    assert shown.returncode == 0, shown.stderr
    assert re.match(r"Slurm 22\.05\.\d+ on every node \(`sinfo --version`\)\n", shown.stdout), shown.stdout

    # prune reads the script of every job Slurm holds (`scontrol write batch_script JOB -`, which 22.05
    # has): a queued job's files are kept by what its script names, not left unknown.
    held = invoke(
        setup, "submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10",
        "--extra=--begin=now+3600", "--", *SHORT,
    )  # fmt: skip
    assert held.returncode == 0, held.stderr
    held_id = held.stdout.strip().splitlines()[-1]
    try:
        planned = invoke(setup, "prune", "--cluster=local")
        assert planned.returncode == 0, planned.stderr
        kept = "1 jobs Slurm still holds for you (of any project or checkout) keep every file their scripts "
        assert f"{kept}name: {held_id}\n" in planned.stdout, planned.stdout
        assert "cannot tell" not in planned.stdout, planned.stdout
    finally:
        minicluster.ssh(["scancel", held_id])


def test_the_trainer_completes_with_singularity_alone_and_no_fuse_the_sif_unpacked_by_srun_on_the_node(
    own_setup: Setup, minicluster
):
    """An old site's software on 22.05: `singularity` alone, no FUSE for users (the other runtimes and
    FUSE are Slurm's release's business nowhere: test_container_software runs each on 24.11)."""
    runs_on_each_software(own_setup, minicluster, (("singularity", "no"),))
