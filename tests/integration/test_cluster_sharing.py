"""One mini cluster per user and machine, shared by every project: its keys under the user's state folder
(XDG_STATE_HOME here, the real default path, not HPCBOX_MINICLUSTER_STATE), a second project's
`cluster.up` finding the first's cluster, a checkout's old keys adopted, and replacing or removing a
cluster Slurm still has a job on refused, naming the job, unless --force.

One cluster for the module (1 node), replaced once by the --force test: two starts in all. Everything
goes through the `hpcbox` command, from two project folders, as users type it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@dataclass(frozen=True)
class Shared:
    """A cluster brought up by project `a`, reached from project `b`, keys under ``xdg``."""

    name: str
    port: int
    xdg: Path
    a: Path
    b: Path

    @property
    def root(self) -> Path:
        return self.xdg / "hpcbox" / "cluster"

    def hpcbox(self, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCBOX_", "SBATCH_"))}
        env.update(XDG_STATE_HOME=str(self.xdg), HPCBOX_MINICLUSTER=self.name)
        return subprocess.run(
            [sys.executable, "-m", "hpcbox", *args], cwd=project, env=env, capture_output=True, text=True
        )

    def cluster_args(self, nodes: int = 1) -> list[str]:
        return [f"--name={self.name}", f"--port={self.port}", f"--nodes={nodes}"]

    def found(self):
        from hpcbox import minicluster

        cluster = minicluster.find(self.name, self.root)
        assert cluster is not None, f"no keys for {self.name} in {self.root}"
        return cluster


def project(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n\n[tool.hpcbox]\n')
    return folder


@pytest.fixture(scope="module")
def shared(run_id: str, docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    from hpcbox import minicluster

    work = tmp_path_factory.mktemp("sharing")
    a, b = project(work / "a", "proj-a"), project(work / "b", "proj-b")
    made = Shared(f"{run_id}-share", free_port(), work / "xdg", a, b)
    try:
        yield made
    finally:
        minicluster.down(made.name, made.root)


def containers(engine, name: str) -> dict[str, tuple[str, str]]:
    """Each container of cluster ``name``: its id and status."""
    labelled = engine.containers.list(all=True, filters={"label": f"io.hpcbox.minicluster={name}"})
    return {c.name: (c.id, c.status) for c in labelled}


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (a hint may follow), with no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith("error: ") and all(line.startswith("  hint: ") for line in rest), done.stderr
    return first


def test_a_second_project_finds_the_cluster_the_first_brought_up(shared: Shared, docker_engine):
    up = shared.hpcbox(shared.a, "cluster.up", *shared.cluster_args())
    assert up.returncode == 0, up.stderr
    keys = shared.root / shared.name
    assert (keys / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert keys.stat().st_mode & 0o777 == 0o700 and shared.root.stat().st_mode & 0o777 == 0o700
    assert not (shared.a / ".hpcbox").exists()  # nothing of it in the checkout
    assert f"UserKnownHostsFile={keys / 'known_hosts'}" in up.stdout
    before = containers(docker_engine, shared.name)

    again = shared.hpcbox(shared.b, "cluster.up", *shared.cluster_args())
    assert again.returncode == 0, again.stderr
    assert f"cluster {shared.name} is already up" in again.stdout
    assert containers(docker_engine, shared.name) == before  # the same containers, not replaced
    status = shared.hpcbox(shared.b, "cluster.status", f"--name={shared.name}")
    assert status.returncode == 0 and "idle" in status.stdout, status.stderr
    # Over SSH, with the keys from the user's state folder: the cluster's own sinfo, and a command that
    # connects to `local` (sbatch --test-only of project b's job script on the login node).
    assert "node1" in shared.found().ssh(["sinfo", "--noheader", "--Node"], check=True).stdout
    check = shared.hpcbox(shared.b, "sbatch", "--cluster=local", "--check", "--time=5")
    assert check.returncode == 0, check.stderr
    assert "to start at" in check.stderr


def test_a_checkouts_old_keys_of_the_running_cluster_are_adopted_once(shared: Shared):
    # As an older hpcbox left them: in the checkout that brought the cluster up, none in the user's folder.
    old = shared.a / ".hpcbox" / "cluster" / shared.name
    old.parent.mkdir(parents=True)
    shutil.move(shared.root / shared.name, old)
    missing = shared.hpcbox(shared.b, "cluster.status", f"--name={shared.name}")
    assert f"no cluster named {shared.name} is up" in error_line(missing)

    adopted = shared.hpcbox(shared.a, "cluster.status", f"--name={shared.name}")
    assert adopted.returncode == 0, adopted.stderr
    line = f"hpcbox: cluster {shared.name}'s keys moved from {old} to {shared.root / shared.name}"
    assert adopted.stdout.splitlines()[0].startswith(line), adopted.stdout
    assert not old.exists() and (shared.root / shared.name / "id_ed25519").is_file()
    # Said once; from the other project too, the keys are now there.
    for folder in (shared.a, shared.b):
        done = shared.hpcbox(folder, "cluster.status", f"--name={shared.name}")
        assert done.returncode == 0 and "moved" not in done.stdout, done.stdout + done.stderr


def looked_at_until(cluster, job_id: str, reached: Callable[[Any], bool], what: str):
    """Job ``job_id``'s state as hpcbox reads it (squeue, then sacct), looked at each second over one
    connection until ``reached`` holds, for a minute at most."""
    from hpcbox.tools import slurm, ssh

    with ssh.Connection(cluster.ssh_target()) as connection:
        deadline = time.monotonic() + 60
        found = slurm.job_state(connection, job_id)
        while not reached(found):
            assert time.monotonic() < deadline, f"job {job_id} never {what}: {found}"
            time.sleep(1)
            found = slurm.job_state(connection, job_id)
    return found


def test_a_job_held_back_by_a_full_queue_says_why_and_slurms_start_guess_as_a_guess(shared: Shared):
    from hpcbox import jobs
    from hpcbox.tools import slurm

    cluster = shared.found()
    # Another user of the cluster (root, on the controller) holds its one node for ten minutes.
    other = cluster.exec(
        "controller",
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            "--time=10",
            "--job-name=someone else",
            "--wrap",
            "sleep 600",
        ],
    )
    assert other.returncode == 0, other.stderr
    others = other.stdout.strip()
    mine = ""
    try:
        check = shared.hpcbox(shared.b, "sbatch", "--cluster=local", "--check", "--time=5")
        assert check.returncode == 0, check.stderr
        guess = slurm.test_only_start(check.stderr)
        assert guess, check.stderr
        assert f"{guess} is Slurm's guess of its start from the queue as it stands now, not a promise" in (
            check.stderr
        )
        mine = cluster.ssh(["sbatch", "--parsable", "--time=5", "--wrap", "true"], check=True).stdout.strip()
        # The scheduler looks at a job within its sched_interval (5 s): wait for that, not for a time.
        found = looked_at_until(
            cluster,
            mine,
            lambda found: found is None or (found.reason == "Resources" and bool(found.start_guess)),
            "waited for resources with a guess",
        )
        assert found is not None and found.state == "PENDING"
        said = jobs.describe(found)
        assert said.startswith(f"job {mine}: PENDING, waiting for free resources (Resources: "), said
        assert f"Slurm guesses it starts at {found.start_guess} (its own estimate, not a promise)" in said
        assert said.endswith(", time limit 00:05:00"), said
        # Cancelled while it waits, it is told as such, not by the time, node and exit status sacct fills
        # in for a job that never ran
        cluster.ssh(["scancel", mine], check=True)
        found = looked_at_until(
            cluster, mine, lambda found: found is not None and found.source == "sacct", "reached sacct"
        )
        assert jobs.describe(found) == f"job {mine}: CANCELLED, before it started", found
    finally:
        ids = [others, *([mine] if mine else [])]
        cluster.exec("controller", ["scancel", *ids])
        # gone from the queue before the next test counts the cluster's jobs
        deadline = time.monotonic() + 60
        while cluster.ask("controller", ["squeue", "--noheader", f"--jobs={','.join(ids)}"]).stdout.strip():
            assert time.monotonic() < deadline, f"jobs {ids} still in the queue a minute after scancel"
            time.sleep(0.5)


def test_down_or_replace_with_a_job_running_is_refused_naming_it_until_forced(shared: Shared, docker_engine):
    cluster = shared.found()
    job = cluster.ssh(["sbatch", "--parsable", "--job-name=hold me", "--wrap", "sleep 300"], check=True)
    job_id = job.stdout.strip()
    assert job_id.isdigit(), job.stdout
    before = containers(docker_engine, shared.name)
    keys = sorted(p.name for p in (shared.root / shared.name).iterdir())

    down = shared.hpcbox(shared.b, "cluster.down", f"--name={shared.name}")
    line = error_line(down)
    named = f"({job_id} 'hold me' "
    assert line.startswith(f"error: cluster {shared.name} has 1 unfinished Slurm job {named}"), line
    assert line.endswith("): removing it would end it"), line
    assert "pass --force to remove it anyway" in down.stderr
    replace = shared.hpcbox(shared.b, "cluster.up", *shared.cluster_args(nodes=2))
    line = error_line(replace)
    assert named in line and line.endswith("): replacing it (nodes 1 -> 2) would end it"), line
    assert "pass --force to replace it anyway" in replace.stderr

    with socket.socket() as busy:  # a port taken by something else: refused before anything is removed
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        flags = (f"--name={shared.name}", f"--port={port}", "--force")
        elsewhere = shared.hpcbox(shared.b, "cluster.up", *flags)
    assert error_line(elsewhere) == f"error: port: 127.0.0.1:{port} is already in use"

    # Untouched: the same containers, the keys, the job still Slurm's.
    assert containers(docker_engine, shared.name) == before
    assert sorted(p.name for p in (shared.root / shared.name).iterdir()) == keys
    queue = cluster.ssh(["squeue", "--noheader", "--format=%i %T"], check=True).stdout.split()
    assert queue[0] == job_id and queue[1] in ("PENDING", "RUNNING"), queue

    forced = shared.hpcbox(shared.b, "cluster.up", *shared.cluster_args(nodes=2), "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"hpcbox: --force: replacing cluster {shared.name} ends its 1 unfinished Slurm job ({job_id} " in (
        forced.stdout
    )
    after = containers(docker_engine, shared.name)
    assert len(after) == 5 and not {cid for cid, _ in after.values()} & {cid for cid, _ in before.values()}
    fresh = shared.found()
    assert fresh.spec.nodes == 2
    assert fresh.ssh(["squeue", "--noheader"], check=True).stdout.strip() == ""  # its Slurm is new


def test_down_when_slurm_cannot_answer_needs_force(shared: Shared, docker_engine):
    up = shared.hpcbox(shared.b, "cluster.up", *shared.cluster_args(nodes=2))  # as the last test left it
    assert up.returncode == 0, up.stderr
    docker_engine.containers.get(f"{shared.name}-controller").stop(timeout=0)
    started = time.monotonic()
    down = shared.hpcbox(shared.b, "cluster.down", f"--name={shared.name}")
    line = error_line(down)
    assert line == (
        f"error: cannot tell whether cluster {shared.name} has unfinished Slurm jobs (its controller is not "
        "running): removing it could end them"
    ), line
    assert time.monotonic() - started < 30
    assert sum(status == "running" for _, status in containers(docker_engine, shared.name).values()) == 4

    forced = shared.hpcbox(shared.b, "cluster.down", f"--name={shared.name}", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "whose Slurm cannot say what runs there (its controller is not running)" in forced.stdout
    assert f"removed 5 containers, 1 network(s), 2 volume(s) of {shared.name}" in forced.stdout
    assert containers(docker_engine, shared.name) == {}
    assert not (shared.root / shared.name).exists()
