"""SIF compression as written in profiles and on the command line: `ALGORITHM[:LEVEL]`."""

from __future__ import annotations

import tomllib

import pytest

from hpcbox.errors import FieldError
from hpcbox.render.profiles import SHIPPED_DIR, parse_profile
from hpcbox.sif.compression import DEFAULT, SifCompression, parse_compression


@pytest.mark.parametrize(
    ("written", "parsed", "args"),
    [
        ("zstd:3", SifCompression("zstd", 3), ["-comp", "zstd", "-Xcompression-level", "3"]),
        ("gzip", SifCompression("gzip", 9), ["-comp", "gzip", "-Xcompression-level", "9"]),
        (" GZIP:1 ", SifCompression("gzip", 1), ["-comp", "gzip", "-Xcompression-level", "1"]),
        ("zstd", SifCompression("zstd", 15), ["-comp", "zstd", "-Xcompression-level", "15"]),
        ("xz", SifCompression("xz", None), ["-comp", "xz"]),
    ],
)
def test_written_forms_parse_to_mksquashfs_arguments(written, parsed, args):
    compression = parse_compression(written, "--compression")
    assert compression == parsed
    assert compression.mksquashfs_args() == args


def test_a_level_left_out_is_mksquashfs_default_so_both_spellings_are_one_sif():
    assert parse_compression("gzip", "x").slug == parse_compression("gzip:9", "x").slug == "gzip-9"
    assert str(parse_compression("lz4", "x")) == "lz4"


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("bzip2", "unknown compression 'bzip2'"),
        ("zstd:0", "zstd level must be a whole number 1-22"),
        ("zstd:23", "zstd level must be a whole number 1-22"),
        ("gzip:fast", "gzip level must be a whole number 1-9"),
        ("gzip:", "gzip level must be a whole number 1-9"),
        ("xz:6", "xz takes no level"),
        ("", "unknown compression"),
    ],
)
def test_bad_compression_names_the_field(written, problem):
    with pytest.raises(FieldError, match=f"^--compression: {problem}"):
        parse_compression(written, "--compression")


def _profile(apptainer: dict) -> dict:
    data = tomllib.loads((SHIPPED_DIR / "local.toml").read_text())
    return {**data, "apptainer": apptainer}


def test_profile_compression_defaults_to_fast_gzip_that_every_release_reads():
    assert parse_profile(_profile({}), name="t").apptainer.compression == DEFAULT == SifCompression("gzip", 1)
    zstd = parse_profile(_profile({"compression": "zstd:5"}), name="t").apptainer.compression
    assert zstd == SifCompression("zstd", 5)


def test_bad_profile_compression_names_the_profile_key():
    with pytest.raises(FieldError, match=r"^apptainer\.compression: unknown compression 'brotli'"):
        parse_profile(_profile({"compression": "brotli"}), name="t")
