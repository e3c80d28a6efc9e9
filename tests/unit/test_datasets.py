"""A dataset directory as one deterministic, content-addressed archive, cached by a cheap manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.store import datasets, ship


def make_dataset(root: Path, *, reverse: bool = False, umask: int = 0o022) -> Path:
    """The same files, written in either order and with either umask: the archive must not care."""
    files = {
        "manifest.json": b'{"shards": 2}\n',
        "train/shard-0000.npz": b"train" * 1000,
        "val/shard-0000.npz": b"val",
        "tools/check.sh": b"#!/bin/sh\necho ok\n",
        "empty-folder/.keep": b"",
        "n\u00e4me with spaces/" + "long-" * 30 + "name.bin": b"long",
    }
    old = os.umask(umask)
    try:
        for name in sorted(files, reverse=reverse):
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(files[name])
        (root / "tools" / "check.sh").chmod(0o755 & ~umask)
        (root / "latest").symlink_to("train")  # a link inside stays a link
    finally:
        os.umask(old)
    return root


def test_the_same_contents_give_the_same_archive_whatever_their_times_order_and_owners(tmp_path: Path):
    first = make_dataset(tmp_path / "a")
    time.sleep(0.01)
    second = make_dataset(tmp_path / "b", reverse=True, umask=0o077)
    one = datasets.archive(first, tmp_path / "cache", say=lambda _: None)
    two = datasets.archive(second, tmp_path / "cache", say=lambda _: None)
    assert one.made and two.made
    assert one.sha256 == two.sha256 == hashlib.sha256(one.path.read_bytes()).hexdigest()
    assert one.path == tmp_path / "cache" / "sha256" / f"{one.sha256}.tar" and one.files == 6
    with tarfile.open(one.path) as tar:
        members = tar.getmembers()
    names = [member.name for member in members]
    assert names == sorted(names) and "train/shard-0000.npz" in names and "manifest.json" in names
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    modes = {member.name: member.mode for member in members if member.isfile()}
    assert modes["tools/check.sh"] == 0o755 and modes["manifest.json"] == 0o644


def test_the_archive_unpacks_to_the_directorys_contents(tmp_path: Path):
    source = make_dataset(tmp_path / "data")
    made = datasets.archive(source, tmp_path / "cache", say=lambda _: None)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xf", str(made.path), "-C", str(unpacked)], check=True)  # as the job does
    for path in source.rglob("*"):
        twin = unpacked / path.relative_to(source)
        if path.is_symlink():
            assert os.readlink(twin) == "train" and (twin / "shard-0000.npz").read_bytes() == b"train" * 1000
        elif path.is_file():
            assert twin.read_bytes() == path.read_bytes()
            assert os.access(twin, os.X_OK) == os.access(path, os.X_OK)
        else:
            assert twin.is_dir()


def test_an_unchanged_directory_is_not_archived_again_and_a_change_is(tmp_path: Path):
    source = make_dataset(tmp_path / "data")
    cache = tmp_path / "cache"
    said: list[str] = []
    first = datasets.archive(source, cache, say=said.append)
    made_at = first.path.stat().st_mtime_ns
    again = datasets.archive(source, cache, say=said.append)
    assert (again.made, again.sha256, again.path) == (False, first.sha256, first.path)
    assert first.path.stat().st_mtime_ns == made_at  # not rewritten
    assert "archiving the dataset directory" in said[0] and "is unchanged since it was archived" in said[1]

    # The same size, rewritten: the manifest moves, and so does the content address.
    (source / "val" / "shard-0000.npz").write_bytes(b"VAL")
    changed = datasets.archive(source, cache, say=said.append)
    assert changed.made and changed.sha256 != first.sha256

    # Touched but the same bytes: archived again (the manifest moved), to the same content address.
    (source / "val" / "shard-0000.npz").write_bytes(b"val")
    os.utime(source / "manifest.json")
    back = datasets.archive(source, cache, say=said.append)
    assert back.made and back.sha256 == first.sha256


def test_a_cached_archive_that_was_altered_is_not_trusted(tmp_path: Path):
    source = make_dataset(tmp_path / "data")
    cache = tmp_path / "cache"
    first = datasets.archive(source, cache, say=lambda _: None)
    with first.path.open("ab") as archive:
        archive.write(b"\0" * 512)
    again = datasets.archive(source, cache, say=lambda _: None)
    assert again.made and again.sha256 == first.sha256
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == first.sha256


def test_ship_sends_a_directory_as_its_archive(tmp_path: Path):
    source = make_dataset(tmp_path / "data")
    found = ship.dataset(source, tmp_path / "cache", say=lambda _: None)
    assert found.remote_name == f"{found.sha256}.tar"
    assert found.sha256 == hashlib.sha256(found.path.read_bytes()).hexdigest()


def bind_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))


def refusal(path: Path, cache: Path) -> str:
    with pytest.raises(HpcboxError) as refused:
        ship.dataset(path, cache, say=lambda _: None)
    message = refused.value.message
    assert "\n" not in message and message.startswith("data: ")
    assert not list(cache.rglob("*.tar")) and not list(cache.rglob("*partial*"))  # nothing half-done
    return message


def test_a_missing_path_or_an_empty_directory_is_refused(tmp_path: Path):
    cache = tmp_path / "cache"
    assert refusal(tmp_path / "nowhere", cache) == f"data: {tmp_path / 'nowhere'} does not exist"
    empty = tmp_path / "empty"
    (empty / "only" / "folders").mkdir(parents=True)
    assert refusal(empty, cache) == f"data: {empty} is an empty directory (no files in it)"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: (d / "escape").symlink_to(d.parent / "secret.txt"), "is a symbolic link to "),
        (lambda d: (d / "up").symlink_to("../secret.txt"), "outside"),
        (lambda d: (d / "gone").symlink_to("missing.bin"), "which does not exist"),
        (lambda d: os.mkfifo(d / "pipe"), "is a special file"),
        (lambda d: bind_socket(d / "sock"), "is a special file"),
    ],
)
def test_what_the_archive_cannot_carry_is_refused(tmp_path: Path, make, says: str):
    (tmp_path / "secret.txt").write_text("not part of the dataset")
    source = make_dataset(tmp_path / "data")
    make(source)
    assert says in refusal(source, tmp_path / "cache")


def test_no_dataset_is_one_empty_archive_the_same_everywhere(tmp_path: Path):
    """A job with no dataset stages the archive of no files: tar unpacks nothing from it, and two caches
    (two machines) hold the same bytes, so it is sent to a cluster once."""
    first, second = datasets.empty(tmp_path / "a"), datasets.empty(tmp_path / "b")
    assert first.sha256 == second.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.path.read_bytes() == second.path.read_bytes() and first.path.stat().st_size == 10240
    listed = subprocess.run(["tar", "-tf", str(first.path)], capture_output=True, text=True, check=True)
    assert listed.stdout == ""
    assert ship.dataset(None, tmp_path / "a").sha256 == first.sha256
    assert [path.name for path in (tmp_path / "a" / "sha256").iterdir()] == [first.path.name]


def test_a_job_with_no_dataset_goes_unless_it_runs_the_example_trainer(tmp_path: Path):
    from hpcbox.jobs import data_path
    from hpcbox.project.command import EXAMPLE_DATASET, EXAMPLE_TRAINER, NOTEBOOK, ContainerCommand
    from hpcbox.project.config import load_project

    # The repository's project with its state folder here: empty, whatever demo ran in the checkout.
    shutil.copyfile(Path(__file__).resolve().parents[2] / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "src" / "hpctrain").mkdir(parents=True)
    project = dataclasses.replace(load_project(tmp_path), data="")
    said: list[str] = []
    own = ContainerCommand("script", "train.py")
    assert data_path(project, None, own, say=said.append) is None
    assert data_path(project, None, NOTEBOOK, say=said.append) is None
    assert (
        said
        == ["hpcbox: no dataset (--data, or data in [tool.hpcbox]): the job's /scratch/data is empty"] * 2
    )
    with pytest.raises(HpcboxError, match="data: no dataset given, and the example trainer reads one"):
        data_path(project, None, EXAMPLE_TRAINER)
    assert data_path(project, "some.tar", EXAMPLE_TRAINER) == Path("some.tar").resolve()
    # Once `invoke demo` has made the example trainer's dataset, its jobs stage that one, said so.
    made = project.state_dir / EXAMPLE_DATASET
    made.parent.mkdir(parents=True)
    made.write_bytes(b"an archive")
    assert data_path(project, None, EXAMPLE_TRAINER, say=said.append) == made
    assert said[-1] == "hpcbox: dataset .hpcbox/data/digits.tar (the example trainer's, from invoke demo)"
    assert data_path(project, None, own, say=said.append) is None  # a program of one's own needs none
