"""The container software sites run, end to end: Apptainer or `singularity` alone, with FUSE or without.

One cluster for the module (Slurm 24.11, one node), brought up by `hpcbox cluster.up --runtime
singularity --fuse yes`, then changed in place by `cluster.up` to each other combination; the example
trainer goes through `submit`, `logs --follow` and `status` on each. Without FUSE the job finds out on
its node that Apptainer cannot mount the SIF, unpacks it to node scratch and runs that. The runtime and
FUSE are the nodes' and the job script's, whichever Slurm: test_slurm_2205 and test_slurm_2605 run one
combination without FUSE each (`runs_on_each_software`), where the unpacking's `srun` meets their Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.cluster import free_port
from tests.fixtures.submitting import Setup, with_own_ledger
from tests.integration.test_doctor import verdicts
from tests.integration.test_submit import SHORT, invoke

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Each (runtime, FUSE) a cluster is switched to in turn, and what a job then says about the SIF.
SOFTWARE = (("singularity", "no"), ("apptainer", "no"), ("singularity", "yes"))


@pytest.fixture(scope="module")
def setup(setup: Setup, tmp_path_factory) -> Setup:
    """The lane's setup, with a ledger of this module's own (its cluster's job ids repeat others')."""
    return with_own_ledger(setup, tmp_path_factory, "software-project")


@pytest.fixture(scope="module")
def minicluster(run_id: str, docker_engine, minicluster_state: Path, tmp_path_factory) -> Iterator[object]:
    """This module's cluster, in place of the session's: one node with `singularity` alone and FUSE."""
    from hpcbox import minicluster as mc

    name = f"{run_id}-soft"
    env = {"HPCBOX_MINICLUSTER_STATE": str(minicluster_state)}
    try:
        up = hpcbox(
            "cluster.up", f"--name={name}", f"--port={free_port()}", "--nodes=1", "--runtime=singularity",
            "--fuse=yes", env=env, cwd=tmp_path_factory.mktemp("soft-up"),
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        assert "container runtime: singularity only" in up.stdout and "FUSE for users: yes" in up.stdout
        cluster = mc.find(name, minicluster_state)
        assert cluster is not None
        yield cluster
    finally:
        mc.down(name, minicluster_state)


def hpcbox(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcbox", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )


def switch(
    setup: Setup, cluster, runtime: str, fuse: str, squashfuse: str = "yes", zstd: str = "yes"
) -> float:
    """`cluster.up` with other node software, which changes the running cluster in place: seconds."""
    started = time.monotonic()
    up = hpcbox(
        "cluster.up", f"--name={cluster.name}", f"--port={cluster.spec.port}",
        f"--nodes={cluster.spec.nodes}",
        f"--slurm={cluster.spec.slurm}", f"--runtime={runtime}", f"--fuse={fuse}",
        f"--squashfuse={squashfuse}", f"--zstd={zstd}",
        env=setup.env, cwd=setup.project_dir,
    )  # fmt: skip
    took = time.monotonic() - started
    assert up.returncode == 0, up.stdout + up.stderr
    assert "replacing" not in up.stdout, up.stdout
    words = "with FUSE" if fuse == "yes" else "without FUSE"
    words += "".join(
        f", without {what}" for what, there in (("squashfuse", squashfuse), ("zstd", zstd)) if there == "no"
    )
    assert f"compute nodes now run {runtime}, {words} (changed in place)" in up.stdout, up.stdout
    return took


def sif_line(doctor_output: str) -> str:
    return next(" ".join(line.split()) for line in doctor_output.splitlines() if line.split()[1:2] == ["sif"])


def doctor_sif(setup: Setup, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`hpcbox doctor --cluster=local`: its exit status and its `sif` line."""
    done = invoke(setup, "doctor", "--cluster=local", env=env)
    return done.returncode, sif_line(done.stdout)


def submit_and_follow(setup: Setup, *flags: str) -> tuple[str, str]:
    """Submit the example trainer with ``flags``, follow it to its end: (job id, its log)."""
    done = invoke(
        setup, "submit", "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=10",
        *flags, "--", *SHORT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), done.stdout
    followed = invoke(setup, "logs", "--follow", "-j", job_id)
    assert followed.returncode == 0, followed.stderr
    return job_id, followed.stdout


def runs_on_each_software(setup: Setup, cluster, software: tuple[tuple[str, str], ...] = SOFTWARE) -> None:
    """On each (runtime, FUSE) of ``software``: the trainer runs to COMPLETED, from the SIF as shipped
    where Apptainer can mount it, else unpacked on the node's scratch after its node said why not."""
    for runtime, fuse in software:
        assert switch(setup, cluster, runtime, fuse) < 60
        shown = hpcbox("cluster.status", f"--name={cluster.name}", env=setup.env, cwd=setup.project_dir)
        assert f"FUSE for users: {fuse}" in shown.stdout, shown.stdout
        if fuse == "no":  # the doctor sees it too, and says which profile key tells jobs
            doctor = invoke(setup, "doctor", "--cluster=local")
            mounting = next(line for line in doctor.stdout.splitlines() if line.split()[1:2] == ["mounting"])
            assert mounting.split()[0] == "differs" and mounting.endswith("-> [apptainer] fuse = false"), (
                mounting
            )
            assert doctor.returncode == 1, doctor.stdout
        if fuse == "no" and runtime == "apptainer":  # the profile's runtime: the probe SIFs run
            # A SIF of the profile's compression does not mount; unpacked it runs.
            assert re.fullmatch(
                r"fails sif a zstd SIF \(the profile's\) does not mount on the login node: .+; unpacked it "
                r"runs -> \[apptainer\] fuse = false",
                sif_line(doctor.stdout),
            ), doctor.stdout
        job_id, log = submit_and_follow(setup, f"--container={runtime}")
        assert "the trainer exited with status 0" in log and '"event": "done"' in log, log
        if fuse == "no":
            # Apptainer's own reason, from the node: squashfuse cannot open /dev/fuse.
            assert re.search(r"hpcbox: a node cannot run the SIF as it is: FATAL: .*fuse", log), log
            assert re.search(
                r"each node runs the SIF unpacked on its scratch, \S+/sif/unpacked \(\d+ s\)", log
            )
        else:
            assert "cannot run the SIF" not in log and "unpacked" not in log, log
        status = invoke(setup, "status", "-j", job_id)
        assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout + status.stderr


def test_a_job_for_a_runtime_the_nodes_do_not_have_fails_in_one_line(setup: Setup, minicluster):
    # The cluster as the fixture brought it up: `singularity` alone. The local profile names apptainer.
    doctor = invoke(setup, "doctor", "--cluster=local")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    failing = verdicts(doctor.stdout)["fails"]
    assert [" ".join(line.split()) for line in failing] == [
        "fails runtime `apptainer` does not run -> [apptainer] command, setup"
    ], doctor.stdout
    job_id, log = submit_and_follow(setup)
    assert "hpcbox: `apptainer` does not run on node1; name the container runtime" in log, log
    assert "the trainer exited" not in log
    status = invoke(setup, "status", "-j", job_id)
    assert status.stdout.startswith(f"job {job_id}: FAILED") and "exit code 69:0" in status.stdout, (
        status.stdout
    )


def test_the_trainer_completes_with_singularity_alone_or_apptainer_with_or_without_fuse(
    setup: Setup, minicluster
):
    runs_on_each_software(setup, minicluster)


def test_a_squashfuse_without_zstd_or_none_is_found_by_the_doctor_and_jobs_run_the_sif_once_unpacked(
    setup: Setup, minicluster, tmp_path: Path
):
    """Older squashfuse builds read no zstd, and a node image may have no squashfuse at all: the doctor's
    probe SIFs find either on the login node, and a job where Apptainer would extract the SIF for each
    process unpacks it once instead."""
    switch(setup, minicluster, "apptainer", "yes", zstd="no")
    assert doctor_sif(setup) == (
        1,
        "fails sif a zstd SIF (the profile's) does not mount on the login node: Squashfs image uses zstd "
        "compression, this version supports only zlib, xz, lzo, lz4.; gzip, lzo, xz, lz4 mount "
        '-> [apptainer] compression = "gzip:1"',
    )
    # The user's own `local` profile, with the compression the line names: every line ok.
    from hpcbox.render import profiles

    own = tmp_path / "clusters"
    own.mkdir()
    shipped = profiles.load_profile("local").source.read_text()
    (own / "local.toml").write_text(shipped.replace('compression = "zstd:3"', 'compression = "gzip:1"', 1))
    assert doctor_sif(setup, env={"HPCBOX_CLUSTERS_DIR": str(own)}) == (
        0,
        "ok sif a gzip SIF (the profile's) mounts on the login node; so do lzo, xz, lz4; zstd does not: "
        "Squashfs image uses zstd compression, this version supports only zlib, xz, lzo, lz4.",
    )

    switch(setup, minicluster, "apptainer", "yes", squashfuse="no")
    assert doctor_sif(setup) == (
        1,
        "fails sif a zstd SIF (the profile's) runs on the login node only extracted to a temporary folder, "
        "each time -> [apptainer] fuse = false: jobs unpack it once to node scratch",
    )
    job_id, log = submit_and_follow(setup)
    assert "hpcbox: a node cannot mount the SIF (Apptainer extracts it for each process)" in log, log
    assert re.search(r"each node runs the SIF unpacked on its scratch, \S+/sif/unpacked \(\d+ s\)", log), log
    assert "the trainer exited with status 0" in log, log
    status = invoke(setup, "status", "-j", job_id)
    assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout + status.stderr
