"""Off-lock builds: reading apt's answer, the pins that moved, the locks that follow them, the labels."""

from __future__ import annotations

import pytest

from hpcbox.build import offlock
from hpcbox.build.offlock import MovedPin
from hpcbox.errors import HpcboxError

# `apt-cache policy` in the helper's base with sid added (trimmed from a real run).
POLICY = """\
apptainer:
  Installed: (none)
  Candidate: 1.4.5-2
  Version table:
     1.4.5-2 100
        100 http://deb.debian.org/debian sid/main amd64 Packages
ca-certificates:
  Installed: 20250419+deb13u1
  Candidate: 20250419+deb13u1
  Version table:
     20260816+nmu1 100
        100 http://deb.debian.org/debian sid/main amd64 Packages
 *** 20250419+deb13u1 500
        500 http://deb.debian.org/debian trixie/main amd64 Packages
        100 /var/lib/dpkg/status
libgone1:
  Installed: (none)
  Candidate: (none)
  Version table:
"""
SYSTEM_LOCK = """\
# comment: kept
python3=3.13.5-1
ca-certificates=20250419+deb13u0
fuse2fs
"""


def test_apts_policy_gives_each_known_packages_candidate_and_every_version_it_offers():
    served = offlock.parse_policy(POLICY)
    assert served == {
        "apptainer": offlock.Served("1.4.5-2", frozenset({"1.4.5-2"}), {"sid": "1.4.5-2"}),
        "ca-certificates": offlock.Served(
            "20250419+deb13u1",
            frozenset({"20260816+nmu1", "20250419+deb13u1"}),
            {"sid": "20260816+nmu1", "trixie": "20250419+deb13u1"},
        ),
    }


def test_a_pin_resolved_from_sid_follows_sid_not_the_suites_older_candidate():
    # squashfs-tools: the helper asks sid for it (trixie's 4.6 does not clamp every time in a SIF)
    policy = """\
squashfs-tools:
  Installed: (none)
  Candidate: 1:4.6.1-1
  Version table:
     1:4.7.5-1 100
        100 http://deb.debian.org/debian sid/main amd64 Packages
     1:4.6.1-1 500
        500 http://deb.debian.org/debian trixie/main amd64 Packages
"""
    served = offlock.parse_policy(policy)
    pins = {"squashfs-tools": "1:4.7.4-1"}
    lock = "src/hpcbox/sif/helper-image/lock/apt-helper.txt"
    assert offlock.moved_pins(pins, served, lock, {"squashfs-tools": "sid"}) == [
        MovedPin("squashfs-tools", "1:4.7.4-1", "1:4.7.5-1", lock)
    ]
    assert offlock.moved_pins(pins, served, lock)[0].served == "1:4.6.1-1"  # asked of no release


def test_a_pin_moves_when_apt_no_longer_offers_its_version_and_follows_the_candidate():
    served = offlock.parse_policy(POLICY)
    pins = offlock.apt_pins(SYSTEM_LOCK)
    assert pins == {"python3": "3.13.5-1", "ca-certificates": "20250419+deb13u0"}  # bare names follow
    served["python3"] = offlock.Served("3.13.5-1", frozenset({"3.13.5-1"}))
    moved = offlock.moved_pins(pins, served, "docker/lock/apt-system.txt")
    assert moved == [
        MovedPin("ca-certificates", "20250419+deb13u0", "20250419+deb13u1", "docker/lock/apt-system.txt")
    ]
    assert offlock.follow(SYSTEM_LOCK, moved) == SYSTEM_LOCK.replace("deb13u0", "deb13u1")
    # a version Debian still offers, though not its candidate, is not a move
    assert offlock.moved_pins({"ca-certificates": "20260816+nmu1"}, served, "x") == []


def test_a_package_debian_dropped_entirely_cannot_be_followed():
    moved = offlock.moved_pins(
        {"libgone1": "1.0"}, offlock.parse_policy(POLICY), "apptainer/lock/apt-helper.txt"
    )
    assert moved == [MovedPin("libgone1", "1.0", "", "apptainer/lock/apt-helper.txt")]
    with pytest.raises(HpcboxError) as gone:
        offlock.follow("libgone1=1.0\n", moved)
    assert gone.value.message == "Debian no longer has the package libgone1 at all"


def test_the_label_reads_back_as_the_pins_it_was_written_from():
    moved = [
        MovedPin("zlib1g", "1:1.3", "1:1.3.1", "docker/lock/base.toml"),
        MovedPin("tar", "", "1.35", "docker/lock/base.toml"),
        MovedPin("apptainer", "1.4.5-2", "1.4.6-1", "apptainer/lock/apt-helper.txt"),
    ]
    labels = offlock.labels_for(moved, of="ab" * 32)
    assert labels[offlock.LABEL] == (
        "apptainer 1.4.5-2 -> 1.4.6-1 (apptainer/lock/apt-helper.txt); "
        "tar none -> 1.35 (docker/lock/base.toml); zlib1g 1:1.3 -> 1:1.3.1 (docker/lock/base.toml)"
    )
    assert labels[offlock.LABEL_OF] == "ab" * 32
    assert offlock.from_labels(labels) == tuple(sorted(moved))
    assert offlock.labels_for([]) == {} and offlock.from_labels({}) == ()


def test_strict_lock_refuses_in_one_line_naming_the_first_pin_and_how_many_more(monkeypatch):
    moved = [MovedPin("b", "1", "2", "l.txt"), MovedPin("a", "1", "2", "l.txt")]
    offlock.refuse_if(moved, strict=False, what="image")
    offlock.refuse_if([], strict=True, what="image")
    with pytest.raises(HpcboxError) as refused:
        offlock.refuse_if(moved, strict=True, what="image")
    assert refused.value.message == (
        "Debian moved on: a 1 -> 2 (l.txt) and 1 more; --strict-lock refuses an off-lock image"
    )
    assert "hpcbox lock" in refused.value.hint
    monkeypatch.delenv(offlock.STRICT_ENV, raising=False)
    assert not offlock.strict_lock() and offlock.strict_lock(True)
    for value, strict in (("1", True), ("yes", True), ("0", False), ("", False), ("false", False)):
        monkeypatch.setenv(offlock.STRICT_ENV, value)
        assert offlock.strict_lock() is strict, value


def test_each_moved_pin_is_announced_once_on_a_line_of_its_own():
    said: list[str] = []
    pin = MovedPin("ca-certificates", "20250419+deb13u1", "20250419+deb13u2", "docker/lock/apt-system.txt")
    offlock.announce([pin, pin], said.append)
    assert said == [
        "hpcbox: Debian moved on: ca-certificates 20250419+deb13u1 -> 20250419+deb13u2 "
        "(docker/lock/apt-system.txt); this build is off-lock: run hpcbox lock"
    ]


def test_locks_resolved_together_are_rewritten_only_when_a_pin_or_the_snapshot_time_is_new(tmp_path):
    from hpcbox.build import aptlocked

    one, two = tmp_path / "apt-one.txt", tmp_path / "apt-two.txt"
    texts = {
        one: aptlocked.lock_text("# one\n", None, ["a=1"]),
        two: aptlocked.lock_text("# two\n", None, ["b=2"]),
    }
    assert aptlocked.write_locks(texts, None) == [one, two]
    assert one.read_text() == "# one\na=1\n"
    # the same pins, a new header: left as they are
    assert aptlocked.write_locks({one: "# new\na=1\n", two: "# new\nb=2\n"}, None) == []
    # the same pins, now with the snapshot time they were resolved at: recorded, both together
    stamped = {
        path: aptlocked.lock_text("# h\n", "20261205T000000Z", [pin])
        for path, pin in ((one, "a=1"), (two, "b=2"))
    }
    assert aptlocked.write_locks(stamped, "20261205T000000Z") == [one, two]
    locked = aptlocked.AptLocked("thing", {"one": one, "two": two}, "src/x/lock")
    assert locked.snapshot() == "20261205T000000Z"
    assert locked.pinned_in("b", "2") == "src/x/lock/apt-two.txt"
    assert locked.pinned_in("c", "3") == "src/x/lock/apt-one.txt"  # none pins it: the first lock
    # a later time with the same pins keeps the first one
    assert aptlocked.write_locks({one: "# h\n# snapshot: 20261206T000000Z\na=1\n"}, "20261206T000000Z") == []
    # one pin moved: both written
    assert aptlocked.write_locks({one: "a=9\n", two: "b=2\n"}, None) == [one, two]
