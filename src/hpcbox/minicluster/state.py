"""A user's mini clusters' keys and config: one folder per user and machine, shared by every project.

A mini cluster is the machine's and the user's, not a checkout's: its containers, port and Slurm state
are one, so its keys are kept once, under the user's state folder (``spec.state_root``), and every
project reaches the same cluster with them. hpcbox used to keep them in the checkout that brought the
cluster up (``<project>/.hpcbox/cluster/<name>``); a checkout that still has them for the cluster that
runs hands them over once (``adopt``), so an upgrade loses no running cluster's keys.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from hpcbox.minicluster.spec import check_name

HOST_KEY_PUBLIC = "ssh_host_ed25519_key.pub"  # ClusterSecrets.host_key's public half


def private_dir(path: Path) -> Path:
    """``path`` as a folder, with each folder made for it mode 0700 (mkdir's ``parents`` would make the
    ones above with the umask's mode: XDG asks 0700 of the state folder, and these hold keys)."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(root: Path, name: str, say: Callable[[str], None] = lambda _line: None) -> Iterator[None]:
    """Hold cluster ``name``'s lock (``<root>/<name>.lock``, never removed: removing a lock file races
    with whoever opens it next) while it is brought up, replaced, removed or its keys adopted: two
    projects running `cluster.up` at once get one cluster, the second finding the first's."""
    path = private_dir(root) / f"{check_name(name)}.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another hpcbox command that is bringing up or removing cluster {name}")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing the only descriptor of it releases the lock


def host_key(directory: Path) -> str | None:
    """The login node's public host key kept in a cluster's state ``directory``, if it has one."""
    try:
        return (directory / HOST_KEY_PUBLIC).read_text().strip() or None
    except OSError:
        return None


def adopt(legacy: Path, target: Path, live_host_key: str | None) -> bool:
    """Move a checkout's old state folder ``legacy`` to ``target`` (``state_dir(root, name)``) when it
    holds the keys of the cluster that exists under that name: its login node was given the host key
    ``live_host_key`` (None: no such cluster). Whether it moved. Call it holding ``locked``.

    Both present: the one whose host key the cluster's login node has is the cluster's; ``target`` is
    replaced only by keys that are. A ``legacy`` folder that holds another key (its cluster was replaced
    or removed since) is left where it is and ignored; with no cluster of that name there is nothing to
    tell the two apart by, so nothing moves either. The copy is made beside ``target`` and renamed into
    place before ``legacy`` is removed: a command reading meanwhile finds the keys in one place or the
    other, never in neither.
    """
    if live_host_key is None or not legacy.is_dir() or same_folder(legacy, target):
        return False
    if host_key(legacy) != live_host_key.strip():
        return False
    root = private_dir(target.parent)
    if host_key(target) != live_host_key.strip():
        staging = root / f".{target.name}.adopting-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(legacy, staging)  # copy2: the secrets keep their mode 0600
        staging.chmod(0o700)
        stale = root / f".{target.name}.replaced-{os.getpid()}"
        if target.exists():
            target.rename(stale)
        staging.rename(target)
        shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(legacy)
    return True


def same_folder(one: Path, other: Path) -> bool:
    """Whether two paths are one folder (HPCBOX_MINICLUSTER_STATE may name a checkout's old one)."""
    try:
        return one.resolve() == other.resolve() or (other.exists() and one.samefile(other))
    except OSError:
        return False
