"""The base lock file and the package list read from a root filesystem tarball."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path

import pytest

from hpcbox import baseimage
from hpcbox.errors import HpcboxError

REPO = Path(__file__).resolve().parents[2]

STATUS = """\
Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.37-2+b10
Description: GNU Bourne Again SHell
 with a continuation line: Version: 9

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: libstdc++6
Status: install ok installed
Architecture: amd64
Version: 14.2.0-19

Package: tzdata
Status: install ok installed
Architecture: all
Version: 2025b-4
"""


def test_the_repositorys_base_lock_reads_and_writes_back_unchanged():
    path = REPO / "docker" / "lock" / baseimage.LOCK_NAME
    lock = baseimage.read_lock(path)
    assert lock.suite == "trixie" and lock.source_date_epoch > 1_700_000_000
    assert "bash" in lock.packages and "libstdc++6" in lock.packages
    assert lock.to_toml() == path.read_text()
    assert baseimage.base_ref(lock=lock).endswith(f":trixie-{lock.digest}")


def test_the_base_tag_follows_the_locks_suite_and_a_local_repository_but_not_its_canonical_name(monkeypatch):
    lock = baseimage.BaseLock("bookworm", 1_700_000_000, {"bash": "5.2.15-2+b7"})
    monkeypatch.setenv("HPCBOX_BASE_REPOSITORY", "lab/debian")
    assert baseimage.base_ref("trixie", lock) == f"lab/debian:bookworm-{lock.digest}"
    assert baseimage.base_ref(lock=lock, canonical=True) == f"hpcbox/debian:bookworm-{lock.digest}"
    assert baseimage.base_ref("trixie") == "lab/debian:trixie"


def test_a_snapshot_time_is_kept_in_the_lock_but_not_in_the_base_it_names(tmp_path: Path):
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    snapshotted = dataclasses.replace(lock, snapshot="20261123T091500Z")
    path = tmp_path / "base.toml"
    path.write_text(snapshotted.to_toml())
    assert (
        "source_date_epoch = " in path.read_text() and '\nsnapshot = "20261123T091500Z"\n' in path.read_text()
    )
    assert baseimage.read_lock(path) == snapshotted
    # where the packages come from does not change the base: same digest, same tag
    assert snapshotted.digest == lock.digest and baseimage.base_ref(lock=snapshotted) == baseimage.base_ref(
        lock=lock
    )


def test_the_snapshot_archive_is_snapshot_debian_org_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("HPCBOX_SNAPSHOT_URL", raising=False)
    assert baseimage.snapshot_mirror("20261123T091500Z") == (
        "https://snapshot.debian.org/archive/debian/20261123T091500Z"
    )
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://cache.lab:8080/")
    assert (
        baseimage.snapshot_mirror("20261123T091500Z")
        == "http://cache.lab:8080/archive/debian/20261123T091500Z"
    )


def test_an_archive_nobody_answers_for_is_said_to_be_unreachable_with_the_reason(monkeypatch):
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://127.0.0.1:9")
    why = baseimage.snapshot_unreachable("20261123T091500Z", "trixie")
    assert why is not None
    assert why.startswith("http://127.0.0.1:9/archive/debian/20261123T091500Z/dists/trixie/Release: ")
    assert "refused" in why.lower()


def test_installed_packages_are_read_from_dpkgs_status_in_the_tarball(tmp_path: Path):
    layer = tmp_path / "rootfs.tar"
    with tarfile.open(layer, "w") as archive:
        data = STATUS.encode()
        info = tarfile.TarInfo("./var/lib/dpkg/status")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    assert baseimage.installed_packages(layer) == {
        "bash": "5.2.37-2+b10",
        "libstdc++6": "14.2.0-19",
        "tzdata": "2025b-4",
    }


def test_every_package_at_another_version_gone_or_added_is_a_moved_pin_of_the_base_lock():
    lock = baseimage.BaseLock("trixie", 1, {"bash": "5.2", "sed": "4.9", "zlib1g": "1.3"})
    assert baseimage.moved_packages(lock, dict(lock.packages), "docker/lock/base.toml") == []
    moved = baseimage.moved_packages(
        lock, {"bash": "5.2", "zlib1g": "1.3.1", "tar": "1.35"}, "env/lock/base.toml"
    )
    assert [pin.describe() for pin in moved] == [
        "sed 4.9 -> none (env/lock/base.toml)",
        "tar none -> 1.35 (env/lock/base.toml)",
        "zlib1g 1.3 -> 1.3.1 (env/lock/base.toml)",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            'suite = "buster"\nsource_date_epoch = 1\n[packages]\nbash = "5"\n',
            "suite: 'buster' is not one of",
        ),
        ('suite = "trixie"\nsource_date_epoch = "today"\n[packages]\nbash = "5"\n', "source_date_epoch"),
        ('suite = "trixie"\nsource_date_epoch = 1\n', "packages: must map each package"),
        (
            'suite = "trixie"\nsource_date_epoch = 1\n[packages]\nbash = 5\n',
            "packages: must map each package",
        ),
        ("suite = trixie\n", "cannot read the base lock"),
        (
            'suite = "trixie"\nsource_date_epoch = 1\nsnapshot = "2026-11-23"\n[packages]\nbash = "5"\n',
            "snapshot: '2026-11-23' is not a snapshot.debian.org time such as 20261123T091500Z",
        ),
    ],
)
def test_a_malformed_base_lock_is_one_line_naming_the_file(tmp_path: Path, text: str, says: str):
    path = tmp_path / "base.toml"
    path.write_text(text)
    with pytest.raises(HpcboxError) as refused:
        baseimage.read_lock(path)
    assert refused.value.message.startswith(f"{path}: ") and says in refused.value.message
    assert "\n" not in refused.value.message


def test_superseded_pin_is_read_from_apts_words():
    output = "#8 3.1 E: Version '1.4.5-2' for 'apptainer' was not found\n#8 ERROR: process did not complete"
    assert baseimage.superseded_pin(output) == ("apptainer", "1.4.5-2")
    assert baseimage.superseded_pin("E: Unable to locate package apptainer") is None
