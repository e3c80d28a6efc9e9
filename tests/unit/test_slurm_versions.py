"""The Slurm versions the mini cluster runs: the choice of one (`--slurm`, or the nearest to the version a
profile names), the node image per version, and a profile's `[slurm] version`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.errors import FieldError
from hpcbox.minicluster import node_image, versions
from hpcbox.minicluster.shape import slurm_like
from hpcbox.minicluster.spec import ClusterSpec, spec_like
from hpcbox.render import profiles

LOCAL = (profiles.SHIPPED_DIR / "local.toml").read_text()


def test_the_mini_cluster_runs_debians_slurm_versions_the_default_trixies():
    assert versions.SUITES == {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
    assert versions.DEFAULT == "24.11"
    assert ClusterSpec().slurm == "24.11"
    assert ClusterSpec(slurm="22.05").slurm == "22.05"
    assert ClusterSpec(slurm="26.05").slurm == "26.05"
    # sid's 26.05 needs a newer hwloc than trixie's; the others need nothing from their suite but Slurm.
    assert versions.SUITE_LIBRARIES == {"26.05": ("libhwloc15",)}


@pytest.mark.parametrize("bad", ["23.02", "22.05.8", "25.11", "26.05.5", "24", "latest", ""])
def test_a_version_it_does_not_run_is_one_line_naming_the_ones_it_does(bad):
    with pytest.raises(FieldError) as caught:
        ClusterSpec(slurm=bad)
    assert caught.value.field == "slurm"
    assert caught.value.message == (
        f"slurm: {bad!r} is not a Slurm version the mini cluster runs (allowed: 22.05, 24.11, 26.05)"
    )


@pytest.mark.parametrize(
    ("site", "ours"),
    [
        ("22.05", "22.05"),
        ("22.05.11", "22.05"),
        ("21.08", "22.05"),
        ("23.02", "22.05"),
        ("23.02.7", "22.05"),
        ("23.08", "22.05"),  # 15 months from either: the older, whose missing features a script meets
        ("23.11", "24.11"),
        ("24.05", "24.11"),
        ("25.05", "24.11"),
        ("25.08", "24.11"),  # 9 months from either: the older
        ("25.11", "26.05"),
        ("26.05", "26.05"),
        ("26.05.5", "26.05"),
        ("26.11", "26.05"),
    ],
)
def test_a_site_gets_the_nearest_version_by_release_date(site, ours):
    assert versions.nearest(site) == ours


def test_the_version_a_rehearsal_runs_and_the_line_that_says_so():
    assert versions.for_site(None, None) == "24.11"
    assert versions.for_site("23.02", None) == "22.05"
    assert versions.for_site("23.02", "24.11") == "24.11"  # the flag wins
    assert versions.note("m3", None, "24.11") == ""
    assert versions.note("m3", "24.11.5", "24.11") == ""  # the site's own release
    assert versions.note("m3", "23.02.7", "22.05") == (
        "hpcbox: m3 runs Slurm 23.02.7; its rehearsal runs Slurm 22.05, the nearest the mini cluster has "
        "(22.05, 24.11, 26.05)"
    )
    assert versions.for_site("25.11.3", None) == "26.05"
    assert versions.note("m3", "26.05.5", "26.05") == ""
    assert versions.note("m3", "25.11.3", "24.11") == (
        "hpcbox: m3 runs Slurm 25.11.3; its rehearsal runs Slurm 24.11, as asked (the nearest the mini "
        "cluster has is 26.05)"
    )
    assert versions.note("m3", "23.02", "24.11") == (
        "hpcbox: m3 runs Slurm 23.02; its rehearsal runs Slurm 24.11, as asked (the nearest the mini "
        "cluster has is 22.05)"
    )


def test_sids_version_follows_sid_and_says_so_once_sid_has_moved_on():
    """sid drops each Slurm release for the next: the version named for it is the newest Debian carries,
    and a cluster asked for it that runs a later release says which, in one line."""
    assert [version for version in versions.SUITES if versions.moves_on(version)] == ["26.05"]
    assert versions.moved_note("26.05", "26.05.5") == ""
    assert versions.moved_note("26.05", "26.05.12") == ""
    assert versions.moved_note("26.05", "26.11.1") == (
        "hpcbox: Debian sid serves Slurm 26.11.1 now, no longer 26.05: this cluster runs 26.11.1 "
        "(`--slurm 26.05` is the newest Slurm Debian carries)"
    )


def node_context(tmp_path: Path) -> Path:
    """A node image context with a Dockerfile and a lock per Slurm version."""
    (tmp_path / "lock").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "lock" / "apt-node.txt").write_text("apptainer=1.4.5-2\n")
    for version in versions.SUITES:
        (tmp_path / "lock" / f"apt-slurm-{version}.txt").write_text(f"slurm-wlm={version}.1-1\n")
    return tmp_path


def tag(context: Path, version: str) -> str:
    return node_image.content_hash(
        node_image.context_files(context, version), "sha256:base", node_image.build_args(version)
    )


def test_each_version_has_its_own_node_image_tag(tmp_path):
    context = node_context(tmp_path)
    tags = {version: tag(context, version) for version in versions.SUITES}
    assert len(set(tags.values())) == len(versions.SUITES)
    assert node_image.build_args("22.05") == {"SLURM_VERSION": "22.05", "SLURM_SUITE": "bookworm"}
    assert node_image.build_args("24.11") == {"SLURM_VERSION": "24.11", "SLURM_SUITE": "trixie"}
    # sid's: off-lock, whatever release sid serves when it is built, checked to be 26.05 or newer.
    assert node_image.build_args("26.05") == {
        "SLURM_VERSION": "26.05", "SLURM_SUITE": "sid", "SLURM_OR_NEWER": "1",
    }  # fmt: skip
    # The same inputs, the same tag: built once, then found.
    assert tag(context, "22.05") == tags["22.05"]


def test_a_node_image_is_built_from_the_common_lock_and_its_own_versions_alone(tmp_path):
    """Refreshing 26.05's pins re-tags 26.05's image, not 24.11's; the common lock re-tags every one."""
    context = node_context(tmp_path)
    files = node_image.context_files(context, "24.11")
    assert files["lock/apt-slurm.txt"] == context / "lock" / "apt-slurm-24.11.txt"
    assert files["add-suites.sh"].name == "add-suites.sh"
    assert not any(name.startswith("lock/apt-slurm-") for name in files)
    before = {version: tag(context, version) for version in versions.SUITES}
    (context / "lock" / "apt-slurm-26.05.txt").write_text("slurm-wlm=26.05.6-1\n")
    after = {version: tag(context, version) for version in versions.SUITES}
    assert after["24.11"] == before["24.11"] and after["22.05"] == before["22.05"]
    assert after["26.05"] != before["26.05"]
    (context / "lock" / "apt-node.txt").write_text("apptainer=1.4.6-1\n")
    assert all(tag(context, version) != after[version] for version in versions.SUITES)
    # an off-lock build's tag is another, so that it never passes for the locked one
    here = node_image.content_hash(files, "sha256:base", {})
    assert node_image.content_hash(files, "sha256:base", {}, off_lock_of=f"hpcbox/minicluster:{here}") != here
    with pytest.raises(FieldError, match="not a Slurm version the mini cluster runs"):
        node_image.context_files(context, "25.11")


def test_the_node_locks_pin_every_package_it_installs_at_an_exact_version():
    """The committed locks: every package the node installs, exactly one version each; each Slurm lock
    that version's release from its suite."""
    from hpcbox.build.offlock import apt_pins

    def lines(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]

    common = node_image.CONTEXT / "lock" / "apt-node.txt"
    pins = apt_pins(common.read_text())
    assert len(pins) == len(lines(common)) == len(node_image.NODE_PACKAGES)
    assert set(pins) == {package.partition("/")[0] for package in node_image.NODE_PACKAGES}
    assert {"apptainer", "mariadb-server", "munge", "openssh-server", "squashfuse"} <= set(pins)
    for version in versions.SUITES:
        lock = node_image.slurm_lock(version)
        slurm = apt_pins(lock.read_text())
        assert len(slurm) == len(lines(lock)), lock
        wanted = {
            *node_image.SLURM_PACKAGES,
            *node_image.TRIXIE_LIBRARIES,
            *versions.SUITE_LIBRARIES.get(version, ()),
        }
        assert set(slurm) == wanted, lock
        assert all(slurm[name].startswith(f"{version}.") for name in node_image.SLURM_PACKAGES), slurm


def test_an_off_lock_node_build_follows_each_pin_to_its_own_suite():
    """Where Debian moved on, bookworm's Slurm follows bookworm (not trixie's newer candidate), sid's
    Apptainer and 26.05's Slurm follow sid, the rest trixie; a moved pin is named with its lock."""
    from hpcbox.build import offlock

    def served(candidate: str, **newest: str) -> offlock.Served:
        return offlock.Served(candidate, frozenset({candidate, *newest.values()}), newest)

    serving = {
        "slurm-wlm": served("24.11.6-1", trixie="24.11.6-1", bookworm="22.05.8-4+deb12u4", sid="26.05.7-1"),
        "apptainer": served("1.4.6-1", sid="1.4.6-1"),
        "munge": served("0.5.17-1", trixie="0.5.17-1"),
    }
    for version, slurm in (("22.05", "22.05.8-4+deb12u4"), ("24.11", "24.11.6-1"), ("26.05", "26.05.7-1")):
        locked = node_image.locked(version)
        assert locked.suites == (versions.SUITES[version],)
        assert locked.folder == "src/hpcbox/minicluster/node/lock"
        assert [path.name for path in locked.locks.values()] == ["apt-node.txt", f"apt-slurm-{version}.txt"]
        pins = {"slurm-wlm": "0+gone", "apptainer": "0+gone", "munge": "0+gone"}
        moved = offlock.moved_pins(pins, serving, "lock", locked.releases)
        assert {pin.package: pin.served for pin in moved} == {
            "slurm-wlm": slurm, "apptainer": "1.4.6-1", "munge": "0.5.17-1",
        }  # fmt: skip
    text = "# header\nslurm-wlm=26.05.5-1\nslurmdbd=26.05.5-1\n"
    moved = [offlock.MovedPin("slurm-wlm", "26.05.5-1", "26.11.1-1", "x")]
    assert offlock.follow(text, moved) == "# header\nslurm-wlm=26.11.1-1\nslurmdbd=26.05.5-1\n"
    pinned = node_image.locked("24.11")
    slurm = offlock.apt_pins(node_image.slurm_lock("24.11").read_text())["slurm-wlm"]
    assert pinned.pinned_in("slurm-wlm", slurm) == "src/hpcbox/minicluster/node/lock/apt-slurm-24.11.txt"
    apptainer = offlock.apt_pins((node_image.CONTEXT / "lock" / "apt-node.txt").read_text())["apptainer"]
    assert pinned.pinned_in("apptainer", apptainer) == "src/hpcbox/minicluster/node/lock/apt-node.txt"


def test_the_node_dockerfile_installs_from_its_locks_and_checks_what_it_installed():
    dockerfile = (node_image.CONTEXT / "Dockerfile").read_text()
    assert "ARG SLURM_VERSION=24.11" in dockerfile and "ARG SLURM_SUITE=trixie" in dockerfile
    # Every package from the locks, the apt steps reading the snapshot archive where it is handed in.
    assert "COPY add-suites.sh lock/apt-node.txt /tmp/node/" in dockerfile
    assert "COPY add-suites.sh lock/apt-slurm.txt /tmp/node/" in dockerfile
    assert dockerfile.count("RUN --mount=type=secret,id=apt_mirror") == 2
    assert dockerfile.count("/tmp/hpcbox-apt /etc/apt/apt.conf.d/00hpcbox-mirror") == 2
    # Slurm's other packages from its suite, the rest of that suite pinned low by add-suites.sh.
    assert "Pin: release n=%s\\nPin-Priority: 990" in dockerfile
    assert 'sh /tmp/node/add-suites.sh "$SLURM_SUITE"' in dockerfile
    assert 'slurmd -V | grep -q "^slurm-wlm $SLURM_VERSION\\."' in dockerfile
    # A suite that moves on: an off-lock build's Slurm whatever release it is, checked to be the version
    # or newer.
    assert "ARG SLURM_OR_NEWER=" in dockerfile
    assert 'dpkg --compare-versions "$installed" ge "$SLURM_VERSION"' in dockerfile


# --- a profile's [slurm] version ------------------------------------------------------------------


def profile_dir(tmp_path: Path, name: str, extra: str) -> Path:
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    # A table goes after the profile's own; a top-level key before its first table.
    (folder / f"{name}.toml").write_text(LOCAL + extra if "[" in extra else extra + LOCAL)
    return folder


def test_a_profile_may_name_its_sites_slurm_version(tmp_path):
    path = profile_dir(tmp_path, "site", '\n[slurm]\nversion = "23.02.7"\n') / "site.toml"
    assert profiles.parse_profile_file(path).slurm_version == "23.02.7"
    assert profiles.load_profile("edi").slurm_version is None  # the shipped ones do not know theirs


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('\n[slurm]\nversion = "23"\n', "slurm.version: '23' is not a Slurm version such as 23.02"),
        ('\n[slurm]\nversion = "v23.02"\n', "slurm.version: 'v23.02' is not a Slurm version"),
        ("\n[slurm]\nversion = 23.02\n", "slurm.version: 23.02 must be a string"),
        ('\n[slurm]\nrelease = "23.02"\n', "release"),
        ('slurm = "23.02"\n', "slurm: '23.02' must be a table"),
    ],
)
def test_a_bad_slurm_version_in_a_profile_names_its_field(tmp_path, extra, says):
    path = profile_dir(tmp_path, "site", extra) / "site.toml"
    with pytest.raises(FieldError) as caught:
        profiles.parse_profile_file(path)
    assert says in caught.value.message


def test_an_lsf_profile_names_no_slurm_version(tmp_path):
    dtu = (profiles.SHIPPED_DIR / "dtu.toml").read_text() + '\n[slurm]\nversion = "23.02"\n'
    (tmp_path / "dtu.toml").write_text(dtu)
    with pytest.raises(FieldError) as caught:
        profiles.parse_profile_file(tmp_path / "dtu.toml")
    assert caught.value.field == "slurm.version"


def test_a_rehearsal_takes_the_nearest_version_and_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "HPCBOX_CLUSTERS_DIR", str(profile_dir(tmp_path, "site", '[slurm]\nversion = "23.02"\n'))
    )
    said: list[str] = []
    assert slurm_like("site", say=said.append) == "22.05"
    assert said == [
        "hpcbox: site runs Slurm 23.02; its rehearsal runs Slurm 22.05, the nearest the mini cluster has "
        "(22.05, 24.11, 26.05)"
    ]
    said.clear()
    assert slurm_like("site", "24.11", say=said.append) == "24.11"
    assert said[0].endswith("runs Slurm 24.11, as asked (the nearest the mini cluster has is 22.05)")
    said.clear()
    assert slurm_like("edi", say=said.append) == "24.11" and said == []  # edi's is not known
    assert spec_like("site", slurm="22.05").slurm == "22.05"


def test_a_bad_flag_is_refused_before_the_profile_is_read():
    with pytest.raises(FieldError) as caught:
        slurm_like("nowhere", "23.02")
    assert caught.value.field == "slurm"


def test_cluster_up_with_a_version_it_does_not_run_is_one_line_and_starts_nothing(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCBOX_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "xdg"), DOCKER_HOST="unix:///nonexistent/docker.sock")
    done = subprocess.run(
        [sys.executable, "-m", "hpcbox", "cluster.up", "--slurm=23.02", "--name=hpcbox-never"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "error: slurm: '23.02' is not a Slurm version the mini cluster runs (allowed: 22.05, 24.11, 26.05)"
    ]
    # No engine was asked (it could not have answered) and no state was made.
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_job_rehearsed_via_local_says_which_slurm_runs_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hpcbox.jobs import connect

    monkeypatch.setenv(
        "HPCBOX_CLUSTERS_DIR", str(profile_dir(tmp_path, "site", '[slurm]\nversion = "23.02"\n'))
    )
    site = profiles.load_profile("site")
    running = SimpleNamespace(spec=ClusterSpec(like="site", slurm="22.05"))
    monkeypatch.setattr(connect, "_mini_cluster", lambda profile, project, name: running)
    said: list[str] = []
    connect.say_rehearsal_slurm(site, None, via="local", say=said.append)  # type: ignore[arg-type]
    assert said == [
        "hpcbox: site runs Slurm 23.02; its rehearsal runs Slurm 22.05, the nearest the mini cluster has "
        "(22.05, 24.11, 26.05)"
    ]
    said.clear()
    connect.say_rehearsal_slurm(site, None, via=None, say=said.append)  # type: ignore[arg-type]
    connect.say_rehearsal_slurm(profiles.load_profile("edi"), None, via="local", say=said.append)  # type: ignore[arg-type]
    assert said == []  # not a rehearsal; a profile that names no version
