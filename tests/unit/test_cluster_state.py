"""Where a user's mini clusters keep their keys (the user's state folder, shared by every project), how a
checkout's old folder is adopted, the unfinished jobs a refusal names, and bad cluster names refused
before they name a folder. The cluster itself: tests/integration/test_cluster_sharing.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.minicluster import state
from hpcbox.minicluster.cluster import RECORD, Cluster, find, record, shared_state
from hpcbox.minicluster.lifecycle import UnfinishedJob, parse_unfinished
from hpcbox.minicluster.secrets import generate
from hpcbox.minicluster.shape import shape_like
from hpcbox.minicluster.spec import ClusterSpec, legacy_state_dir, spec_like, state_dir, state_root

NAME = "hpcbox-local"


def test_the_state_root_is_the_users_xdg_state_folder(tmp_path: Path):
    assert state_root({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "hpcbox" / "cluster"


def test_without_xdg_state_home_it_is_under_the_home_folder(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".local" / "state" / "hpcbox" / "cluster"
    assert state_root({}) == expected
    assert state_root({"XDG_STATE_HOME": ""}) == expected
    # The XDG spec: a relative path in the variable is invalid, and ignored.
    assert state_root({"XDG_STATE_HOME": "relative/state"}) == expected


def test_hpcbox_minicluster_state_overrides_both(tmp_path: Path):
    environ = {"HPCBOX_MINICLUSTER_STATE": str(tmp_path / "mine"), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    assert state_root(environ) == tmp_path / "mine"


def test_the_process_environment_is_what_is_read_by_default(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("HPCBOX_MINICLUSTER_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert state_root() == tmp_path / "hpcbox" / "cluster"


@pytest.mark.parametrize("name", ["../../etc", "a/b", "", "UPPER", ".hidden", "x"])
def test_a_name_that_is_no_cluster_name_never_becomes_a_path(name: str, tmp_path: Path):
    for make in (state_dir, legacy_state_dir):
        with pytest.raises(HpcboxError) as caught:
            make(tmp_path, name)
        assert caught.value.message == f"name: {name!r} is not a valid cluster name"


def test_folders_made_for_the_state_are_private_and_those_above_untouched(tmp_path: Path):
    tmp_path.chmod(0o755)
    root = state.private_dir(tmp_path / "state" / "hpcbox" / "cluster")
    for folder in (root, root.parent, root.parent.parent):
        assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert tmp_path.stat().st_mode & 0o777 == 0o755
    assert state.private_dir(root) == root  # again: nothing to do


def test_the_lock_is_a_file_beside_the_clusters_folders_and_is_held_once(tmp_path: Path):
    import fcntl

    root = tmp_path / "root"
    with state.locked(root, NAME):
        lock = root / f"{NAME}.lock"
        assert lock.is_file() and lock.stat().st_mode & 0o777 == 0o600
        other = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    said: list[str] = []
    with state.locked(root, NAME, said.append):
        pass
    assert said == []  # free again: nobody waited
    assert not (root / NAME).exists()


# --- adoption of a checkout's old .hpcbox/cluster/<name> ---------------------------------------


def keys(directory: Path, port: int = 2222) -> str:
    """Real secrets for a cluster in ``directory`` (ssh-keygen), and the public host key the cluster's
    login node would be given."""
    made = generate(ClusterSpec(name=NAME, port=port), directory)
    (directory / RECORD).write_text("{}")
    return made.public(made.host_key)


def contents(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode & 0o777) for p in sorted(directory.iterdir())}


def test_a_checkouts_keys_of_the_cluster_that_runs_move_to_the_users_state(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    live = keys(legacy)
    before = contents(legacy)
    target = state_dir(tmp_path / "xdg" / "hpcbox" / "cluster", NAME)
    assert state.adopt(legacy, target, live) is True
    assert not legacy.exists()
    assert contents(target) == before  # every file, byte for byte, secrets still mode 0600
    assert before["munge.key"][1] == before["id_ed25519"][1] == 0o600
    assert target.stat().st_mode & 0o777 == 0o700
    assert target.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in target.parent.iterdir()] == [NAME]  # no staging folder left behind
    assert state.adopt(legacy, target, live) is False  # once


def test_both_present_the_keys_the_cluster_has_win(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    target = state_dir(tmp_path / "root", NAME)
    keys(target)  # an earlier cluster's, brought up by a newer hpcbox, replaced since by the checkout's
    live = keys(legacy)
    wanted = contents(legacy)
    assert state.adopt(legacy, target, live) is True
    assert contents(target) == wanted and not legacy.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [NAME]


def test_both_present_a_checkouts_keys_of_a_cluster_replaced_since_are_ignored(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    target = state_dir(tmp_path / "root", NAME)
    keys(legacy)
    live = keys(target)  # the cluster that runs now was brought up with the user's keys
    old, current = contents(legacy), contents(target)
    assert state.adopt(legacy, target, live) is False
    assert (contents(legacy), contents(target)) == (old, current)


def test_the_same_keys_in_both_places_are_kept_once(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    target = state_dir(tmp_path / "root", NAME)
    live = keys(legacy)
    target.parent.mkdir()
    subprocess.run(["cp", "-a", str(legacy), str(target)], check=True)
    kept = contents(target)
    assert state.adopt(legacy, target, live) is True
    assert not legacy.exists() and contents(target) == kept


def test_with_no_cluster_of_that_name_nothing_moves(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    keys(legacy)
    target = state_dir(tmp_path / "root", NAME)
    assert state.adopt(legacy, target, None) is False
    assert legacy.is_dir() and not target.parent.exists()


def test_an_override_naming_the_checkouts_folder_itself_adopts_nothing(tmp_path: Path):
    legacy = legacy_state_dir(tmp_path / "project" / ".hpcbox", NAME)
    live = keys(legacy)
    assert state.adopt(legacy, state_dir(legacy.parent, NAME), live) is False
    assert (legacy / "id_ed25519").is_file()


def test_with_no_old_folder_the_shared_state_is_found_without_touching_anything(monkeypatch, tmp_path):
    monkeypatch.delenv("HPCBOX_MINICLUSTER_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = tmp_path / "project" / ".hpcbox"
    said: list[str] = []
    assert shared_state(NAME, project, say=said.append) == tmp_path / "xdg" / "hpcbox" / "cluster"
    assert shared_state(NAME, None, say=said.append) == tmp_path / "xdg" / "hpcbox" / "cluster"
    assert said == [] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_command_that_only_connects_finds_the_cluster_without_loading_the_docker_sdk(tmp_path: Path):
    """`status` and `logs` reach the mini cluster through what `up` recorded in its state folder: the
    Docker SDK and testcontainers (about 0.7 s to import, most of such a command's own cost) stay
    unloaded."""
    spec = spec_like("local", port=2299)
    cluster = Cluster(
        spec, "hpcbox/node:recorded", generate(spec, state_dir(tmp_path, spec.name)), shape_like("local")
    )
    record(cluster, tmp_path)
    assert find(spec.name, tmp_path) == cluster
    connecting = (
        "import sys; import hpcbox.cli.tasks; from hpcbox import jobs; "
        "print(jobs.running_mini_cluster(None, like='local').ssh_target().address); "
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('docker', 'testcontainers')))"
    )
    environ = {**os.environ, "HPCBOX_MINICLUSTER_STATE": str(tmp_path), "HPCBOX_MINICLUSTER": spec.name}
    done = subprocess.run([sys.executable, "-c", connecting], env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{cluster.user}@127.0.0.1:2299", "[]"]


# --- the jobs a refusal names ----------------------------------------------------------------------


def test_unfinished_jobs_are_every_squeue_row_that_has_not_ended():
    text = (
        "17 RUNNING hpcbox-demo\n"
        "18 PENDING my job with spaces\n"
        "19_[2-4] PENDING sweep\n"
        "20 COMPLETING wrap\n"
        "21 COMPLETED done\n"
        "22 CANCELLED gone\n"
        "23 SUSPENDED paused\n"
        "24 TIMEOUT late\n"
        "25 REQUEUE_HOLD held\n"
        "\n"
    )
    assert parse_unfinished(text) == (
        UnfinishedJob("17", "RUNNING", "hpcbox-demo"),
        UnfinishedJob("18", "PENDING", "my job with spaces"),
        UnfinishedJob("19_[2-4]", "PENDING", "sweep"),
        UnfinishedJob("20", "COMPLETING", "wrap"),
        UnfinishedJob("23", "SUSPENDED", "paused"),
        UnfinishedJob("25", "REQUEUE_HOLD", "held"),
    )
    assert str(UnfinishedJob("18", "PENDING", "my job")) == "18 'my job' PENDING"
    assert parse_unfinished("") == ()


# --- bad cluster names on the command line --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cluster.down", "--name=../../tmp"], "name: '../../tmp' is not a valid cluster name"),
        (["cluster.status", "--name=Bad_Name"], "name: 'Bad_Name' is not a valid cluster name"),
        (["cluster.shell", "--name=x"], "name: 'x' is not a valid cluster name"),
        (["cluster.up", "--name=a/b"], "name: 'a/b' is not a valid cluster name"),
        (["cluster.up", "--like=nowhere"], "like: no profile named 'nowhere'"),
    ],
)
def test_a_bad_cluster_flag_is_one_line_and_makes_no_state(args: list[str], says: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCBOX_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "xdg"), HPCBOX_CLUSTERS_DIR=str(tmp_path / "no-profiles"))
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith(f"error: {says}"), done.stderr
    assert all(line.startswith("  hint: ") for line in rest), done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_misspelt_cluster_name_is_told_the_name_it_may_have_meant(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCBOX_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "hpcbox" / "cluster" / "hpcbox-local").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", "cluster.status", "--name=hpcbox-lcoal"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines()[1] == (
        "  hint: did you mean hpcbox-local? start it: `hpcbox cluster.up --name=hpcbox-lcoal`"
    ), done.stderr


def test_the_up_command_of_a_cluster_names_exactly_the_flags_it_was_made_with():
    """What a stopped cluster's hints tell to type: the flags that are not defaults, so that `cluster.up`
    finds the same cluster and starts it again instead of replacing it; --nodes always for a site's
    shape, whose default is its own."""
    from hpcbox.minicluster.spec import ClusterSpec, spec_like

    assert ClusterSpec().up_command == "hpcbox cluster.up"
    made = ClusterSpec(name="mine-2", nodes=1, port=2300, slurm="26.05", runtime="singularity", fuse=False)
    assert made.up_command == (
        "hpcbox cluster.up --name=mine-2 --nodes=1 --port=2300 --slurm=26.05 --runtime=singularity --fuse=no"
    )
    assert (
        spec_like("edi", name="rehearsal").up_command
        == "hpcbox cluster.up --name=rehearsal --like=edi --nodes=2"
    )


def test_a_cluster_command_names_the_cluster_unless_it_is_the_default_one():
    from hpcbox.minicluster.spec import DEFAULT_NAME, cluster_command

    assert cluster_command("status", DEFAULT_NAME) == "hpcbox cluster.status"
    assert cluster_command("down", "mine-2", "--force") == "hpcbox cluster.down --name=mine-2 --force"
