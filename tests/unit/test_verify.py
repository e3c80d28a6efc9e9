"""What `invoke verify` reads from an artifact's labels and how it reports a comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcbox.build.image import (
    LABEL_BASE_DIGEST,
    LABEL_BASE_NAME,
    LABEL_CONTENT,
    LABEL_FLAVOUR,
    LABEL_REVISION,
    LABEL_SOURCE_DATE_EPOCH,
)
from hpcbox.errors import HpcboxError
from hpcbox.sif.convert import LABEL_COMPRESSION
from hpcbox.sif.verify import SHOWN, Provenance, Verdict, _differences

LABELS = {
    LABEL_REVISION: "a" * 40,
    LABEL_FLAVOUR: "cpu",
    LABEL_CONTENT: "c" * 64,
    LABEL_BASE_NAME: "hpcbox/debian:trixie-0123456789ab",
    LABEL_BASE_DIGEST: "sha256:" + "b" * 64,
    LABEL_SOURCE_DATE_EPOCH: "1763596800",
    LABEL_COMPRESSION: "zstd:3",
}


def test_provenance_of_a_sif_on_the_pinned_base():
    origin = Provenance.from_labels(LABELS, "x.sif", is_sif=True)
    assert (origin.revision, origin.flavour, origin.compression, origin.pinned) == (
        "a" * 40,
        "cpu",
        "zstd:3",
        True,
    )
    unpinned = {key: value for key, value in LABELS.items() if key != LABEL_SOURCE_DATE_EPOCH}
    assert Provenance.from_labels(unpinned, "img:1", is_sif=False).pinned is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({LABEL_REVISION: "a" * 40 + "-dirty"}, "x.sif was built from uncommitted changes"),
        ({LABEL_REVISION: "unknown"}, "x.sif was built from outside git"),
        ({LABEL_CONTENT: ""}, f"x.sif does not record where it came from (no {LABEL_CONTENT} label)"),
        ({LABEL_COMPRESSION: ""}, f"x.sif does not record where it came from (no {LABEL_COMPRESSION} label)"),
    ],
)
def test_artifacts_that_cannot_be_rebuilt_say_why(change, message):
    with pytest.raises(HpcboxError) as raised:
        Provenance.from_labels({**LABELS, **change}, "x.sif", is_sif=True)
    assert raised.value.message.startswith(message)


def test_differences_name_each_path_and_what_differs():
    entry = ("file", "644", "0:0", "6", "100", "", "d1")
    artifact = {
        "etc/a": entry,
        "etc/b": entry,
        "only-here": entry,
        "link": ("symlink", "777", "0:0", "0", "100", "x", ""),
    }
    rebuilt = {
        "etc/a": entry,
        "etc/b": ("file", "600", "0:0", "6", "100", "", "d2"),
        "only-there": entry,
        "link": ("symlink", "777", "0:0", "0", "100", "y", ""),
    }
    assert _differences(artifact, rebuilt) == [
        "/etc/b: mode, content",
        "/link: link target",
        "/only-here: only in the artifact",
        "/only-there: missing from the artifact",
    ]


def test_verdict_lines():
    same = Verdict("x.sif", "a" * 40, (), "sha256 00")
    assert same.identical
    assert same.lines() == [f"identical: x.sif is what commit {'a' * 12} builds (sha256 00)"]
    many = Verdict("x.sif", "a" * 40, tuple(f"/f{n}: content" for n in range(SHOWN + 3)), "sha256 00")
    lines = many.lines()
    assert lines[0] == f"differs: x.sif is not what commit {'a' * 12} builds ({SHOWN + 3} differences)"
    assert lines[1:3] == ["  /f0: content", "  /f1: content"]
    assert lines[-1] == "  ... and 3 more"
    assert len(lines) == SHOWN + 2


def test_recorded_digests_read_back_as_written_and_name_each_field_that_differs(tmp_path: Path):
    from hpcbox.sif.verify import DIGESTS_FILE, Digests, read_digests

    digests = Digests(
        "a" * 40, "cpu", "zstd:3", "sha256:" + "b" * 64, "c" * 64, "d" * 64, "e" * 64, 514, "x 1"
    )
    (tmp_path / DIGESTS_FILE).write_text(digests.to_toml("2026-11-25"))
    assert read_digests(tmp_path) == digests
    other = dataclasses.replace(digests, sif_sha256="f" * 64, off_lock="a 1 -> 2 (l)")
    assert digests.differences(other) == [f"sif_sha256: {'e' * 64} != {'f' * 64}"]
    (tmp_path / DIGESTS_FILE).write_text('revision = "a"\n')
    with pytest.raises(HpcboxError) as missing:
        read_digests(tmp_path)
    assert "hpcbox lock --record" in missing.value.hint and "\n" not in missing.value.message


def test_an_off_lock_artifact_says_so_in_the_first_line_whatever_the_verdict():
    moved = "ca-certificates 20250419+deb13u1 -> 20250419+deb13u2 (docker/lock/apt-system.txt)"
    for differences in ((), ("/etc/x: content differs",)):
        lines = Verdict("x.sif", "a" * 40, differences, "sha256 0", off_lock=moved).lines()
        assert lines[0] == (
            f"off-lock: x.sif was built past pins Debian had moved ({moved}); the rebuild follows what "
            "Debian serves now"
        )
        assert lines[1].startswith("identical: " if not differences else "differs: ")
    assert Verdict("x.sif", "a" * 40, (), "sha256 0").lines()[0].startswith("identical: ")
    labels = {**LABELS, LABEL_COMPRESSION: "zstd:3", "io.hpcbox.sif.off-lock": moved}
    assert Provenance.from_labels(labels, "x.sif", is_sif=True).off_lock == moved
