"""The base lock file and the package list read from a root filesystem tarball."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from hpcbox.build import baseimage
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


# snapshot.debian.org's answer to /mr/binary/bash/5.2.37-2+b5/binfiles?fileinfo=1, shortened to three of
# its architectures; the amd64 file is known under two names, one of them in another archive.
BINFILES = """\
{"_comment": "foo", "binary": "bash", "binary_version": "5.2.37-2+b5",
 "result": [{"architecture": "arm64", "hash": "0d1f1b3d6f5e0f1d8a7b3c2e1f0a9b8c7d6e5f40"},
            {"architecture": "amd64", "hash": "5b1c0e2bd5d1e6a4f5f0a0c7e8e1d3b2a1f0e9d8"},
            {"architecture": "i386", "hash": "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d"}],
 "fileinfo": {
  "0d1f1b3d6f5e0f1d8a7b3c2e1f0a9b8c7d6e5f40": [{"archive_name": "debian", "first_seen": "20250419T204027Z",
    "name": "bash_5.2.37-2+b5_arm64.deb", "path": "/pool/main/b/bash", "size": 1478244}],
  "5b1c0e2bd5d1e6a4f5f0a0c7e8e1d3b2a1f0e9d8": [
   {"archive_name": "debian-ports", "first_seen": "20250301T000000Z", "name": "bash_5.2.37-2+b5_amd64.deb",
    "path": "/pool/main/b/bash", "size": 1498512},
   {"archive_name": "debian", "first_seen": "20250420T084516Z", "name": "bash_5.2.37-2+b5_amd64.deb",
    "path": "/pool/main/b/bash", "size": 1498512},
   {"archive_name": "debian", "first_seen": "20250420T024117Z", "name": "bash_5.2.37-2+b5_amd64.deb",
    "path": "/pool/main/b/bash", "size": 1498512}],
  "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d": [{"archive_name": "debian", "first_seen": "20250421T084512Z",
    "name": "bash_5.2.37-2+b5_i386.deb", "path": "/pool/main/b/bash", "size": 1518408}]}}
"""
# /mr/binary/ca-certificates/20250419/binfiles?fileinfo=1: one file, for every architecture.
BINFILES_ALL = """\
{"_comment": "foo", "binary": "ca-certificates", "binary_version": "20250419",
 "result": [{"architecture": "all", "hash": "2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c"}],
 "fileinfo": {"2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c": [{"archive_name": "debian",
   "first_seen": "20250419T204027Z", "name": "ca-certificates_20250419_all.deb",
   "path": "/pool/main/c/ca-certificates", "size": 161744}]}}
"""


def test_a_versions_file_for_this_architecture_or_all_is_first_seen_at_its_earliest_time_in_debian():
    assert baseimage.files_first_seen(json.loads(BINFILES), "amd64") == {
        "5b1c0e2bd5d1e6a4f5f0a0c7e8e1d3b2a1f0e9d8": "20250420T024117Z"  # not debian-ports' time
    }
    assert baseimage.files_first_seen(json.loads(BINFILES), "arm64") == {
        "0d1f1b3d6f5e0f1d8a7b3c2e1f0a9b8c7d6e5f40": "20250419T204027Z"
    }
    assert baseimage.files_first_seen(json.loads(BINFILES), "riscv64") == {}
    assert baseimage.files_first_seen(json.loads(BINFILES_ALL), "arm64") == {
        "2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c": "20250419T204027Z"
    }
    # Without `architecture`, the file's name says it; without fileinfo, the time is left to ask ("").
    nameless = json.loads(BINFILES)
    for entry in nameless["result"]:
        del entry["architecture"]
    assert list(baseimage.files_first_seen(nameless, "i386").values()) == ["20250421T084512Z"]
    assert baseimage.files_first_seen({**json.loads(BINFILES_ALL), "fileinfo": {}}, "amd64") == {
        "2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c": ""
    }
    assert baseimage.files_first_seen({"_comment": "foo", "result": "?"}, "amd64") == {}


@pytest.fixture
def archive(monkeypatch):
    """The tests' stand-in for snapshot.debian.org, on this host only (it starts in milliseconds)."""
    from tests.fixtures.debian import SnapshotArchive

    with SnapshotArchive("127.0.0.1") as stand_in:
        monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", stand_in.url)
        yield stand_in


def test_the_snapshot_time_of_moved_pins_is_the_latest_moment_one_of_their_files_arrived(archive):
    archive.mr = {
        ("ca-certificates", "20250419+deb13u1"): (
            "2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c",
            "20250420T084516Z",
        ),
        ("libc6", "2.41-12"): ("5b1c0e2bd5d1e6a4f5f0a0c7e8e1d3b2a1f0e9d8", "20250718T202307Z", "amd64"),
        ("bash", "5.2.37-2+b5"): ("9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d", "20250419T204027Z"),
    }
    assert baseimage.snapshot_time_of({"ca-certificates": "20250419+deb13u1"}) == (
        "20250420T084516Z",
        "found the snapshot archive's time for ca-certificates 20250419+deb13u1: 20250420T084516Z "
        "(the lock records none)",
    )
    assert archive.mr_asked == ["/mr/binary/ca-certificates/20250419%2Bdeb13u1/binfiles?fileinfo=1"]
    # A version that arrived before the lock was made is looked for when it was made: the mirror's index
    # listed every pin then (a stable point release's files enter the pool weeks before its index does).
    locked_at = 1795428151  # 2026-11-23T10:02:31Z
    assert baseimage.snapshot_time_of({"ca-certificates": "20250419+deb13u1"}, locked_at) == (
        "20261123T100231Z",
        "found the snapshot archive's time for ca-certificates 20250419+deb13u1: 20261123T100231Z, when it "
        "was locked",
    )
    assert baseimage.snapshot_time_of({"ca-certificates": "20250419+deb13u1"}, 1_700_000_000)[0] == (
        "20250420T084516Z"
    )
    pins = {"bash": "5.2.37-2+b5", "ca-certificates": "20250419+deb13u1", "libc6": "2.41-12"}
    if baseimage._debian_arch() != "amd64":
        pins["libc6:amd64"] = pins.pop("libc6")
    found, line = baseimage.snapshot_time_of(pins)
    assert found == "20250718T202307Z" and archive.times_asked == set()  # the archive itself: not asked
    assert line.startswith("found the snapshot archive's time for libc6") and " and 2 more: " in line
    # Where its answer leaves fileinfo out, each file's own /mr/file/HASH/info says when it came.
    archive.fileinfo, archive.mr_asked = False, []
    assert baseimage.snapshot_time_of({"bash": "5.2.37-2+b5"})[0] == "20250419T204027Z"
    assert archive.mr_asked[1] == "/mr/file/9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d/info"


def test_no_snapshot_time_is_found_for_a_version_the_archive_lacks_or_where_it_cannot_be_reached(
    archive, monkeypatch
):
    archive.mr = {
        ("apptainer", "1.4.5-2"): ("0d1f1b3d6f5e0f1d8a7b3c2e1f0a9b8c7d6e5f40", "20251130T145813Z", "s390x")
    }
    found, why = baseimage.snapshot_time_of({"bash": "5.2.37-2+b5", "apptainer": "1.4.5-0+hpcbox.gone"})
    assert found is None and why == (
        "the snapshot archive does not know apptainer 1.4.5-0+hpcbox.gone "
        f"({archive.url}/mr/binary/apptainer/1.4.5-0%2Bhpcbox.gone/binfiles?fileinfo=1 answers 404 Not Found)"
    )
    assert len(archive.mr_asked) == 1  # the first a time cannot be found for ends the search
    found, why = baseimage.snapshot_time_of({"apptainer": "1.4.5-2"})
    assert (
        found is None
        and why.startswith("the snapshot archive has no ")
        and why.endswith(" or all file of apptainer 1.4.5-2")
    )
    assert baseimage.snapshot_time_of({}) == (None, "no pinned version to look one up by")
    # A build whose lock records no time and whose pin the archive lacks goes off-lock, saying so in one line.
    said: list[str] = []
    gone = "Debian no longer serves apptainer 1.4.5-0+hpcbox.gone, pinned in apptainer/lock/apt-helper.txt"
    built = baseimage.build_from_snapshot(
        None, "sid", said.append, gone, said.append, pins={"apptainer": "1.4.5-0+hpcbox.gone"}
    )
    assert built is False and len(said) == 1
    assert said[0].startswith(f"hpcbox: {gone}, and its lock records no snapshot time (the snapshot archive ")
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://127.0.0.1:9")
    found, why = baseimage.snapshot_time_of({"apptainer": "1.4.5-2"})
    assert found is None and why.startswith(
        "the snapshot archive cannot be reached (http://127.0.0.1:9/mr/binary/apptainer/1.4.5-2/binfiles"
    )
    assert "refused" in why.lower()


def test_the_bootstrapped_tarball_loses_its_device_nodes_gains_run_secrets_and_keeps_every_other_byte(
    tmp_path: Path,
):
    """What a rootless engine cannot keep (device nodes) and leaves out (BuildKit's /run/secrets) made
    the same for every engine: its images and SIFs differed from a rootful engine's (the rootless lane).
    /run/secrets goes where `tar --sort=name` puts it, so that tar, extracting, gives /run its own time
    back after making it (at the end of the archive, /run kept the moment it was unpacked)."""
    layer, epoch = tmp_path / "rootfs.tar", 1_700_000_000
    long_name = "./usr/share/" + "x" * 120  # a pax header of its own, as mmdebstrap's tar writes for it
    entries = [
        ("./dev/", tarfile.DIRTYPE, b""),
        ("./dev/null", tarfile.CHRTYPE, b""),
        ("./dev/zero", tarfile.CHRTYPE, b""),
        ("./etc/", tarfile.DIRTYPE, b""),
        ("./etc/hostname", tarfile.REGTYPE, b"node\n"),
        ("./run/", tarfile.DIRTYPE, b""),
        ("./run/lock/", tarfile.DIRTYPE, b""),
        ("./run/lock/held", tarfile.REGTYPE, b"1\n"),
        ("./run/user/", tarfile.DIRTYPE, b""),
        ("./usr/", tarfile.DIRTYPE, b""),
        ("./usr/share/", tarfile.DIRTYPE, b""),
        (long_name, tarfile.REGTYPE, b"kept\n" * 200),
    ]
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mtime, info.mode = kind, len(data), epoch - 60, 0o755
            archive.addfile(info, io.BytesIO(data))
    before = layer.read_bytes()

    baseimage._engine_neutral(layer, epoch)

    after = layer.read_bytes()
    with tarfile.open(layer) as archive:
        names = [member.name for member in archive.getmembers()]
        secrets = archive.getmember("./run/secrets")
    expected = [name.rstrip("/") for name, kind, _ in entries if kind != tarfile.CHRTYPE]
    expected.insert(expected.index("./run/user"), "./run/secrets")
    assert names == expected
    assert secrets.isdir() and (secrets.mode, secrets.mtime, secrets.uid) == (0o755, epoch, 0)
    # Every member kept is the same bytes, headers (pax ones included) and data alike.
    with tarfile.open(fileobj=io.BytesIO(before)) as archive:
        for member in archive.getmembers():
            if not member.isdev():
                assert before[member.offset : member.offset_data + member.size] in after, member.name
    # GNU tar, as the helper unpacks `docker save`'s layers: /run keeps its own time.
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-x", "-f", str(layer), "-C", str(unpacked)], check=True)
    assert (unpacked / "run").stat().st_mtime == epoch - 60
    assert (unpacked / "run" / "secrets").is_dir() and not (unpacked / "dev" / "null").exists()
