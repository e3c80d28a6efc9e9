"""hpcbox.rootfs's pure parts: which layers an inspect record names, the clamping definitions, and the
unpacking of a `docker save` stream into one folder per layer with overlayfs whiteouts."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.sif.rootfs import clamp_definitions, engine_layers, opaque_attribute, write_layers

EPOCH = 1_700_000_000
OVERLAY2 = "/var/lib/docker/overlay2"


def _inspect(driver: str = "overlay2", layers: int = 3) -> dict:
    ids = [f"{OVERLAY2}/{i:03d}{'x' * 23}/diff" for i in range(layers)]
    return {"GraphDriver": {"Name": driver, "Data": {"UpperDir": ids[0], "LowerDir": ":".join(ids[1:])}}}


def test_overlay2_layers_are_bound_once_and_named_top_first():
    layers = engine_layers(_inspect())
    assert layers is not None
    assert layers.binds == ((OVERLAY2, "/hpcbox-layers"),)
    assert layers.dirs == tuple(f"/hpcbox-layers/{i:03d}{'x' * 23}/diff" for i in range(3))


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (_inspect("vfs"), "another storage driver"),
        (_inspect("overlayfs"), "the containerd image store"),
        ({"GraphDriver": {"Name": "overlay2", "Data": None}}, "no folders named"),
        (_inspect(layers=120), "more layers than one mount can name"),
    ],
)
def test_layers_the_helper_cannot_mount_in_one_overlay_are_none(record, why):
    assert engine_layers(record) is None, why


def test_clamp_definitions_quote_names_and_keep_mode_and_owner():
    listing = b'755 0 0 usr/bin\x004755 0 0 usr/bin/su\x00644 1000 1000 a "quoted" name\\x\x00'
    assert clamp_definitions(listing, EPOCH).splitlines() == [
        f'"usr/bin" M {EPOCH} 755 0 0',
        f'"usr/bin/su" M {EPOCH} 4755 0 0',
        f'"a \\"quoted\\" name\\\\x" M {EPOCH} 644 1000 1000',
    ]


def test_a_name_that_is_not_utf8_is_written_back_byte_for_byte():
    text = clamp_definitions(b"644 0 0 caf\xe9\x00", EPOCH)
    assert text.encode("utf-8", "surrogateescape") == f'"caf\xe9" M {EPOCH} 644 0 0\n'.encode("latin-1")


def test_a_name_with_a_line_break_is_refused_in_one_line():
    with pytest.raises(HpcboxError, match=r"^the image has a file whose name holds a line break"):
        clamp_definitions(b"644 0 0 bad\nname\x00", EPOCH)


# --- docker save, unpacked ----------------------------------------------------------------------------


def _tar(entries: list[tuple[str, str, bytes | str]], *, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """(name, kind, data or link target) → tar bytes; kind: f file, d folder, l hard link, s symlink."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = EPOCH - 5, 0o644
            data = None
            if kind == "f":
                assert isinstance(payload, bytes)
                info.size, data = len(payload), io.BytesIO(payload)
            elif kind == "d":
                info.type, info.mode, info.uid = tarfile.DIRTYPE, 0o750, 7
            else:
                info.type = tarfile.LNKTYPE if kind == "l" else tarfile.SYMTYPE
                info.linkname = str(payload)
            tar.addfile(info, data)
    return buffer.getvalue()


LONG = "usr/lib/python3/" + "long" * 40 + ".py"
BOTTOM = _tar([("etc", "d", b""), ("etc/hostname", "f", b"base\n"), ("opt", "d", b""), ("opt/x", "f", b"x")])
TOP = _tar(
    [
        ("etc", "d", b""),
        ("etc/.wh.hostname", "f", b""),
        ("opt", "d", b""),
        ("opt/.wh..wh..opq", "f", b""),
        ("opt/new", "f", b"new"),
        ("opt/same", "l", "opt/new"),
        ("bin", "s", "usr/bin"),
        (LONG, "f", b"print('hi')\n"),
    ]
)


def _saved(members: list[tuple[str, bytes]]) -> list[bytes]:
    """A `docker save` stream as dockerd writes it (manifest last), in chunks that cut headers."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return [raw[i : i + 700] for i in range(0, len(raw), 700)]


def _manifest(*layers: str) -> tuple[str, bytes]:
    return "manifest.json", json.dumps([{"Config": "c.json", "Layers": list(layers)}]).encode()


@pytest.mark.parametrize(("rootless", "attribute"), [(False, "trusted"), (True, "user")])
def test_layers_unpack_in_manifest_order_with_overlayfs_whiteouts(rootless: bool, attribute: str):
    """An opaque folder is marked as the overlay mount of that engine reads it: a rootless engine's
    (userxattr) with user.overlay.opaque, whose trusted.* its helper, in a user namespace, cannot set."""
    stream = _saved(
        [
            ("top/layer.tar", TOP),  # the archive's order is not the layers' order
            ("bottom/layer.tar", BOTTOM),
            ("c.json", b'{"architecture": "amd64"}'),
            _manifest("bottom/layer.tar", "top/layer.tar"),
        ]
    )
    out = io.BytesIO()
    assert write_layers(stream, out, opaque_attribute(rootless)) == ["layers/1", "layers/0"]
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        entries = tar.getmembers()
        assert tar.extractfile(f"0/{LONG}").read() == b"print('hi')\n"
    members = {member.name: member for member in entries}
    whiteout = members["0/etc/hostname"]
    assert whiteout.ischr() and (whiteout.devmajor, whiteout.devminor) == (0, 0)
    opaque = [m for m in entries if m.name == "0/opt"]
    assert opaque[-1].pax_headers == {f"SCHILY.xattr.{attribute}.overlay.opaque": "y"}
    assert (opaque[-1].mode, opaque[-1].uid, opaque[-1].mtime) == (0o750, 7, EPOCH - 5)  # as the folder
    assert members["0/opt/same"].islnk() and members["0/opt/same"].linkname == "0/opt/new"
    assert members["0/bin"].issym() and members["0/bin"].linkname == "usr/bin"
    assert not any(".wh." in name for name in members)
    assert members["1/etc/hostname"].isfile() and members["1"].isdir() and members["0"].isdir()


def test_oci_blobs_that_are_not_layers_are_passed_over():
    stream = _saved(
        [
            ("blobs/sha256/aaa", b'{"schemaVersion": 2}'),
            ("blobs/sha256/bbb", BOTTOM),
            _manifest("blobs/sha256/bbb"),
        ]
    )
    assert write_layers(stream, io.BytesIO(), opaque_attribute(rootless=False)) == ["layers/0"]


def test_a_save_without_manifest_or_with_an_unreadable_layer_is_one_line():
    with pytest.raises(HpcboxError, match=r"^docker save wrote no manifest"):
        write_layers(_saved([("a/layer.tar", BOTTOM)]), io.BytesIO(), opaque_attribute(rootless=False))
    with pytest.raises(HpcboxError, match=r"^docker save's layer b/layer.tar is not a tar hpcbox can read"):
        write_layers(
            _saved([("b/layer.tar", b"\x28\xb5\x2f\xfd" * 200), _manifest("b/layer.tar")]),
            io.BytesIO(),
            opaque_attribute(rootless=False),
        )
