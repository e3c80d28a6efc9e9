"""The sif stage's pure parts: cache records, definitions, the SIF header, validation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256
from hpcbox.sif.compression import SifCompression
from hpcbox.sif.convert import (
    ARCHIVE,
    BUILD_DATE_LABEL,
    LABEL_IMAGE_ID,
    LABEL_IMAGE_REF,
    Sif,
    _set_build_date,
    build_sif,
    cached,
    definition,
    local_names,
    normalise_header,
    sif_path_for,
)
from hpcbox.sif.helper import engine
from hpcbox.tools.apptainer import parse_sif_list

EPOCH = 1_700_000_000


def test_definition_carries_the_image_id_in_labels():
    text = definition(
        local_names("sha256:abc", "hpcbox/trainer:123"), "trainer.tar", comment="made by hpcbox"
    )
    assert text.startswith("# made by hpcbox\nBootstrap: docker-archive\nFrom: trainer.tar\n\n%labels\n")
    assert (
        f"    {LABEL_IMAGE_ID} sha256:abc\n" in text and f"    {LABEL_IMAGE_REF} hpcbox/trainer:123\n" in text
    )


def test_a_reproducible_images_definition_names_nothing_local():
    assert definition({}) == f"Bootstrap: docker-archive\nFrom: {ARCHIVE}\n"


def test_build_date_is_replaced_without_touching_the_rest():
    labels = json.dumps({BUILD_DATE_LABEL: "Monday_01_January_2026_10:00:1_UTC", "a": "b"}, indent="\t")
    replaced = _set_build_date(labels, "Tuesday_14_November_2023_22:13:20_UTC")
    assert json.loads(replaced) == {BUILD_DATE_LABEL: "Tuesday_14_November_2023_22:13:20_UTC", "a": "b"}


def test_sif_list_rows_are_parsed():
    text = """\
------------------------------------------------------------------------------
ID   |GROUP   |LINK    |SIF POSITION (start-end)  |TYPE
------------------------------------------------------------------------------
1    |1       |NONE    |32176-32222               |Def.FILE
4    |1       |NONE    |40960-48562176            |FS (Squashfs/*System/amd64)
"""
    rows = parse_sif_list(text)
    assert [(row.id, row.start, row.end) for row in rows] == [(1, 32176, 32222), (4, 40960, 48562176)]
    assert rows[1].type.startswith("FS")


def test_cache_entry_is_named_by_content_and_compression_and_checked_by_sha256(tmp_path: Path):
    zstd = SifCompression("zstd", 3)
    path = sif_path_for("sha256:" + "ab" * 32, zstd, tmp_path)
    assert path == tmp_path / f"{'ab' * 32}.zstd-3.sif"
    path.write_bytes(b"SIF" * 1000)
    sif = Sif(path, file_sha256(path), path.stat().st_size, str(zstd), "sha256:" + "ab" * 32)
    path.with_suffix(".json").write_text(sif.record())
    assert cached(sif.image_id, zstd, tmp_path) == sif
    assert cached(sif.image_id, SifCompression("zstd", 4), tmp_path) is None
    path.write_bytes(b"SIX" + b"SIF" * 999)  # same size, different bytes
    assert cached(sif.image_id, zstd, tmp_path) is None


def test_unknown_conversion_names_its_option(tmp_path):
    with pytest.raises(HpcboxError, match=r"^--path: "):
        build_sif(SimpleNamespace(ref="any:1"), conversion="slow", cache=tmp_path)


def test_unknown_engine_names_the_option():
    with pytest.raises(HpcboxError, match=r"^--engine: unknown engine 'podman'"):
        engine("podman")


def test_a_file_that_is_not_a_sif_is_left_untouched(tmp_path: Path):
    path = tmp_path / "out.sif"
    path.write_bytes(b"#!/usr/bin/env run-singularity\n" + bytes(200))
    with pytest.raises(HpcboxError, match="is not a SIF file"):
        normalise_header(path, EPOCH, "content")
    assert path.read_bytes() == b"#!/usr/bin/env run-singularity\n" + bytes(200)


def test_the_helper_is_named_by_what_it_holds_not_by_the_local_name_of_its_base(monkeypatch):
    from hpcbox.sif import helper as sif_helper

    here = sif_helper.helper_ref()
    monkeypatch.setenv("HPCBOX_BASE_REPOSITORY", "elsewhere/debian")
    assert sif_helper.helper_ref() == here


def test_every_file_the_helper_is_built_from_names_it(monkeypatch, tmp_path: Path):
    """The libdeflate shim and its compiler's pins are part of the helper: changing one is another helper."""
    from hpcbox.sif import helper as sif_helper

    here = sif_helper.helper_ref()
    for constant in ("HELPER_ZLIB_SOURCE", "HELPER_BUILD_LOCK", "HELPER_LOCK"):
        changed = tmp_path / constant
        changed.write_bytes(getattr(sif_helper, constant).read_bytes() + b"\n")
        with monkeypatch.context() as patch:
            patch.setattr(sif_helper, constant, changed)
            assert sif_helper.helper_ref() != here, constant


def test_a_vanished_pin_is_named_with_the_lock_that_holds_it():
    from hpcbox.sif import helper as sif_helper

    dev = next(
        line
        for line in sif_helper.HELPER_BUILD_LOCK.read_text().splitlines()
        if line.startswith("libdeflate-dev=")
    )
    assert (
        sif_helper._locked().pinned_in(*dev.split("=", 1))
        == "src/hpcbox/sif/helper-image/lock/apt-helper-build.txt"
    )
    apptainer = sif_helper._locked().pinned_in("apptainer", "1.4.5-2")
    assert apptainer == "src/hpcbox/sif/helper-image/lock/apt-helper.txt"


def test_the_helper_pins_what_writes_a_sifs_bytes_and_lets_the_rest_follow_the_mirror():
    from hpcbox.build.offlock import apt_pins
    from hpcbox.sif import helper as sif_helper

    helper, build = (
        apt_pins(lock.read_text()) for lock in (sif_helper.HELPER_LOCK, sif_helper.HELPER_BUILD_LOCK)
    )
    assert set(helper) == {"apptainer", "squashfs-tools", "libdeflate0"} and set(build) == {"libdeflate-dev"}
    # what the shim is compiled against is what runs it
    assert helper["libdeflate0"] == build["libdeflate-dev"]
    bare = [line for line in sif_helper.HELPER_LOCK.read_text().splitlines() if line and "=" not in line]
    assert "squashfuse" in bare and "fuse2fs" in bare
