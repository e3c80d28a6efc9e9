"""A mini cluster running Slurm 26.05 (`hpcbox cluster.up --slurm 26.05`), Debian sid's, the release sites
are moving to: it comes up idle with its own node image, the example trainer goes through it to
COMPLETED and is read with `logs`, `status` and `report`, and a job meeting its time limit is requeued by
its own script and resumes from its checkpoint, as on 24.11 and 22.05; and the trainer completes with
each container runtime a site may have (Singularity alone, Apptainer with or without FUSE).

sid moves on to each new Slurm release: `--slurm 26.05` runs the release its lock pins, or once sid and
the snapshot archive serve it no longer, off-lock, the release sid serves (26.05 or newer), and `up` says
so where it is newer. These tests hold that, whichever release sid serves on the day they run; a node
image whose lock sid has moved past is built too, off-lock, and gets sid's.

Lean on purpose (the suite's budget): one cluster, brought up through the command line; the time-limited
job is submitted first and waits out its limit while the short one runs beside it. As in
test_slurm_2205.py, the tests get this cluster in place of the session's (this module's `minicluster`)
and submit from a copy of the session's project with a ledger of its own.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox.build import offlock
from hpcbox.errors import HpcboxError
from hpcbox.minicluster import node_image, versions
from hpcbox.minicluster.shape import ENFORCEMENT
from hpcbox.tools import docker
from tests.fixtures.cluster import free_port
from tests.fixtures.debian import pinned_base
from tests.fixtures.submitting import RESTING, Setup, with_own_ledger
from tests.integration.test_container_software import hpcbox, runs_on_each_software, switch
from tests.integration.test_submit import SHORT, invoke

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

TIMINGS: dict[str, float] = {}  # printed at the end of the module (pytest -s): what 26.05 adds to a run
SAID: dict[str, str] = {}  # what `cluster.up` printed
# Trains far past its two minutes: the limit's signal (60 s before it) stops it, at any machine's speed.
LIMITED = RESTING


@pytest.fixture(scope="module")
def minicluster(run_id: str, docker_engine, minicluster_state: Path, tmp_path_factory) -> Iterator[object]:
    """This module's cluster: Slurm 26.05, 2 nodes, brought up by `hpcbox cluster.up --slurm 26.05` (its
    node image built first if missing) and removed at the end of the module."""
    from hpcbox import minicluster as mc

    name = f"{run_id}-s2605"
    env = {"HPCBOX_MINICLUSTER_STATE": str(minicluster_state)}
    started = time.monotonic()
    try:
        up = hpcbox(
            "cluster.up", "--slurm=26.05", f"--name={name}", f"--port={free_port()}",
            env=env, cwd=tmp_path_factory.mktemp("s2605-up"),
        )  # fmt: skip
        TIMINGS["cluster.up --slurm 26.05 (image build if missing + start)"] = time.monotonic() - started
        assert up.returncode == 0, up.stdout + up.stderr
        cluster = mc.find(name, minicluster_state)
        assert cluster is not None and cluster.spec.slurm == "26.05"
        SAID["up"] = up.stdout
        yield cluster
    finally:
        mc.down(name, minicluster_state)
        print("\n" + "\n".join(f"{what}: {seconds:.1f} s" for what, seconds in TIMINGS.items()))


@pytest.fixture(scope="module")
def own_setup(setup: Setup, tmp_path_factory) -> Setup:
    return with_own_ledger(setup, tmp_path_factory, "s2605-project")


@pytest.fixture(scope="module")
def limited_job(own_setup: Setup, minicluster) -> str:
    """A trainer with two minutes for far more than two minutes' work, submitted before the short job so
    that its limit runs out while the other is followed: its job id."""
    TIMINGS["started"] = time.monotonic()
    done = invoke(
        own_setup, "submit", "--cluster=local", f"--data={own_setup.data}", "--flavour=cpu", "--offline",
        "--time=2", "--", *LIMITED,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), done.stdout
    return job_id


def running(minicluster) -> str:
    """The Slurm release the cluster runs (`26.05.5`), as `sinfo --version` says."""
    return minicluster.ssh(["sinfo", "--version"], check=True).stdout.split()[-1]


def at_least(release: str, version: str) -> bool:
    return tuple(map(int, release.split(".")[:2])) >= tuple(map(int, version.split(".")))


def test_it_comes_up_idle_running_slurm_26_05_with_the_same_configuration(minicluster):
    version = minicluster.ssh(["sinfo", "--version"], check=True).stdout.strip()
    assert re.fullmatch(r"slurm(-wlm)? \d+\.\d+\.\d+", version), version
    release = running(minicluster)
    assert at_least(release, "26.05"), version  # sid's: 26.05 when this was written, or a later one since
    for host, daemon in (("controller", "slurmctld"), ("node1", "slurmd"), ("accounting", "slurmdbd")):
        said = minicluster.ask(host, [daemon, "-V"]).stdout.strip()
        assert said == f"slurm-wlm {release}", (host, said)
    # `up` says which release runs where sid has moved past 26.05, and says nothing of it where not.
    moved = versions.moved_note("26.05", release)
    assert (moved in SAID["up"]) if moved else ("no longer 26.05" not in SAID["up"]), SAID["up"]
    out = minicluster.ssh(["sinfo", "--noheader", "--Node", "--format=%N %P %T %G"], check=True).stdout
    assert sorted(tuple(line.split()) for line in out.splitlines()) == [
        ("node1", "cpu*", "idle", "gpu:2"), ("node1", "gpu", "idle", "gpu:2"),
        ("node1", "preemptible", "idle", "gpu:2"),
        ("node2", "cpu*", "idle", "gpu:2"), ("node2", "gpu", "idle", "gpu:2"),
        ("node2", "preemptible", "idle", "gpu:2"),
    ]  # fmt: skip
    # Every setting hpcbox writes is one 26.05 takes (an unknown key stops slurmctld, an unknown value is
    # an error line); its one complaint is cgroup/v1's deprecation, the nodes' only cgroups here. The
    # accounting database runs with snapshot isolation off, as slurmdbd 26.05 checks at its start.
    for host in ("controller", "node1", "accounting"):
        logs = minicluster.node_container(host).logs().decode(errors="replace")
        bad = (
            r"(?i)invalid (JobAcctGather|TaskPlugin|SlurmdParameters|AccountingStorageTRES)|unrecognized|"
            r"Parse error|fatal|innodb_snapshot_isolation"
        )
        assert not re.search(bad, logs), logs
    assert (
        ENFORCEMENT[minicluster.shape.cgroups].format(version=minicluster.shape.cgroup_version) in SAID["up"]
    )
    assert "researcher|" in minicluster.ssh(["sacctmgr", "-n", "-P", "show", "user", "researcher"]).stdout
    shown = rf"(?m)^Slurm {re.escape(release)} on every node \(`sinfo --version`\)$"
    assert re.search(shown, SAID["up"]), SAID["up"]


def test_the_trainer_completes_with_apptainer_and_no_fuse_the_sif_unpacked_by_srun_on_the_node(
    own_setup: Setup, minicluster
):
    """Before the other jobs: the nodes' software is changed in place (Apptainer, no FUSE), which a
    running job's later steps would meet; then back to what the profile names (Apptainer, FUSE) for the
    tests after it. (test_container_software runs every runtime and FUSE on 24.11.)"""
    runs_on_each_software(own_setup, minicluster, (("apptainer", "no"),))
    switch(own_setup, minicluster, "apptainer", "yes")


def test_the_example_trainer_runs_to_completed_and_status_logs_report_read_it(
    own_setup: Setup, minicluster, limited_job: str
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
    TIMINGS["submit + the short job to its end (beside the limited one)"] = time.monotonic() - started
    assert followed.returncode == 0, followed.stderr
    assert '"event": "done"' in followed.stdout and "the trainer exited with status 0" in followed.stdout

    status = invoke(setup, "status", "-j", job_id)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"job {job_id}: COMPLETED") and "exit code 0:0" in status.stdout

    # sacct 26.05 knows every field the report asks for (Restarts too): one question, as on 24.11.
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
    said = rf"Slurm {re.escape(running(minicluster))} on every node \(`sinfo --version`\)\n"
    assert re.match(said, shown.stdout), shown.stdout


def test_a_26_05_lock_sid_has_moved_past_builds_off_lock_with_the_release_sid_serves(
    run_id: str, docker_engine, tmp_path, monkeypatch
):
    """The node image's off-lock path for real, as it runs the day sid drops 26.05 and the snapshot archive
    cannot serve it: Slurm's pins name a version sid never served, so the locked build fails on them; the
    image is built with the release sid serves (26.05 or later, checked so by its Dockerfile), labelled
    with the pins that moved, said one line each, found again by the next call, and refused under
    --strict-lock. Built while the limited job waits out its limit; it shares every layer before Slurm's."""
    context = tmp_path / "node"
    shutil.copytree(node_image.CONTEXT, context)
    locked = node_image.locked("26.05", context)
    # Every other pin as Debian serves it today, so that Slurm's below are the only ones moved, on any day.
    moved_today = locked.moved(pinned_base())
    for lock in locked.locks.values():
        lock.write_text(offlock.follow(lock.read_text(), moved_today))
    slurm_lock = node_image.slurm_lock("26.05", context)
    gone = "26.05.5-0+hpcbox.gone"
    slurm_lock.write_text(re.sub(r"(?m)^(slurm[a-z-]*)=.*$", rf"\g<1>={gone}", slurm_lock.read_text()))
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://127.0.0.1:9")
    said: list[str] = []
    started = time.monotonic()
    made = node_image.ensure_image(context, slurm="26.05", on_line=said.append)
    TIMINGS["node image for 26.05 off-lock (sid moved past its pins)"] = time.monotonic() - started
    try:
        image = docker.image(made.ref)
        assert made.built and image is not None
        labels = image.labels
        assert labels[offlock.LABEL_OF] != made.ref and labels[node_image.SLURM_LABEL] == "26.05"
        assert docker.image(labels[offlock.LABEL_OF]) is None  # the locked build left nothing tagged
        # What the image installed, as its own dpkg says, is what the label says Slurm's pins moved to.
        format_ = "${Package}=${Version}\n"
        listed = docker_engine.containers.run(
            made.ref,
            ["-W", f"-f={format_}", *node_image.SLURM_PACKAGES],
            entrypoint="dpkg-query",
            remove=True,
        ).decode()
        installed = dict(line.split("=", 1) for line in listed.split())
        moved = {pin.package: pin for pin in offlock.from_labels(labels)}
        lock = "src/hpcbox/minicluster/node/lock/apt-slurm-26.05.txt"
        for package in node_image.SLURM_PACKAGES:
            pin = moved[package]
            assert (pin.locked, pin.served, pin.lock) == (gone, installed[package], lock), pin
            line = f"hpcbox: Debian moved on: {pin.describe()}; this build is off-lock: run hpcbox lock"
            assert said.count(line) == 1, said
        assert set(moved) & {"apptainer", "mariadb-server", "munge"} == set(), moved
        gone_line = rf"hpcbox: Debian no longer serves slurm\S* {re.escape(gone)}, pinned in {lock}, and .*"
        assert any(re.fullmatch(gone_line, each) for each in said), said
        said_v = (
            docker_engine.containers.run(made.ref, ["-V"], entrypoint="slurmd", remove=True).decode().strip()
        )
        release = said_v.removeprefix("slurm-wlm ")
        assert said_v.startswith("slurm-wlm ") and at_least(release, "26.05"), said_v
        assert installed["slurm-wlm"].startswith(f"{release}-"), (installed, said_v)
        # Found again, not rebuilt; refused under --strict-lock.
        assert node_image.ensure_image(context, slurm="26.05") == dataclasses.replace(made, built=False)
        # the node image's refusal; the base's, where its own pins moved too (.ci/moved-pins)
        with pytest.raises(HpcboxError, match=r"--strict-lock refuses an off-lock (node|base) image \("):
            node_image.ensure_image(context, slurm="26.05", strict=True)
    finally:
        docker.remove_image(made.ref)


def test_a_job_at_its_time_limit_checkpoints_is_requeued_and_resumes(
    own_setup: Setup, minicluster, limited_job: str
):
    """Slurm 26.05's --signal=B:USR1 before the limit reaches the job script: the trainer checkpoints, the
    script requeues the job, and the next run resumes from the checkpoint; then `cancel` stops it, and
    status, logs and report say what happened: sacct's Restarts is the requeues the log tells (one, or
    two where the resumed run reached its own limit before the cancel: on a loaded machine it did), the
    report's resumes the resumed starts the log shows."""
    setup, job_id = own_setup, limited_job
    deadline = time.monotonic() + 300
    log = ""
    while '"resumed": {' not in log:
        assert time.monotonic() < deadline, log
        time.sleep(5)
        log = invoke(setup, "logs", "-j", job_id).stdout
    TIMINGS["the limited job from its submit to its resume"] = time.monotonic() - TIMINGS.pop("started")
    assert f"requeueing job {job_id}" in log, log
    # Running again; or, where the resumed run reached its own limit already (its start took most of
    # its 2 minutes on a loaded machine), requeued once more, until it runs again.
    deadline = time.monotonic() + 300
    while not (running := invoke(setup, "status", "-j", job_id)).stdout.startswith(f"job {job_id}: RUNNING"):
        assert f"job {job_id}: PENDING, requeued" in running.stdout, running.stdout + running.stderr
        assert time.monotonic() < deadline, running.stdout
        time.sleep(2)

    cancelled = invoke(setup, "cancel", "-j", job_id)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    status = invoke(setup, "status", "-j", job_id)
    assert status.stdout.startswith(f"job {job_id}: CANCELLED"), status.stdout + status.stderr
    restarts = minicluster.ssh(["sacct", "-X", "-n", "-P", f"--jobs={job_id}", "--format=Restarts"]).stdout
    log = invoke(setup, "logs", "-j", job_id).stdout
    requeues, resumes = log.count(f"requeueing job {job_id}"), log.count('"resumed": {')
    assert restarts.split() == [str(requeues)] and resumes >= 1, (restarts, log)

    reported = invoke(setup, "report", "-j", job_id)
    assert reported.returncode == 0, reported.stderr
    figures = {line.split()[0]: line for line in reported.stdout.splitlines() if line.startswith("  ")}
    assert f"resumed {resumes} time" in figures["throughput"], reported.stdout
    assert "stopped (CANCELLED" in figures["time"], figures["time"]
