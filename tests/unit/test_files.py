"""The machine-wide lock two hpcbox commands take before making a shared image."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256, known_sha256, one_at_a_time

# A second process holding the lock for a while, as a second hpcbox command bootstrapping the base would.
HOLDER = """
import sys, time
from hpcbox.files import file_sha256, known_sha256, one_at_a_time
with one_at_a_time(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_second_taker_waits_for_the_holder_and_is_told_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches its first answer
    name = f"test {os.urandom(4).hex()}"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, "1.5"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        waits: list[float] = []
        started = time.monotonic()
        with one_at_a_time(name, on_wait=lambda: waits.append(time.monotonic())):
            got = time.monotonic() - started  # the holder sleeps 1.5 s after it has the lock
        assert len(waits) == 1 and waits[0] - started < 1.0 < got
    finally:
        holder.kill()
        holder.wait()
    with one_at_a_time(name, on_wait=lambda: pytest.fail("nobody holds it now")):
        pass
    folder = tmp_path / f"hpcbox-{os.getuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_lock_folder_others_can_enter_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches its first answer
    folder = tmp_path / f"hpcbox-{os.getuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(HpcboxError) as refused, one_at_a_time("anything"):
        pytest.fail("entered a lock in a folder others can write")
    assert refused.value.message == f"{folder} is not a private folder of this user's"
    assert list(folder.iterdir()) == []


def test_a_files_digest_is_read_again_exactly_when_the_file_changed(tmp_path):
    sif, memo = tmp_path / "image.sif", tmp_path / "cache" / ".sha256"
    sif.write_bytes(os.urandom(1 << 20))
    first = known_sha256(sif, memo)
    assert first == file_sha256(sif)
    # unchanged: the digest comes from the memo, as its one entry shows when it is made to say otherwise
    (entry,) = memo.iterdir()
    seen, _ = entry.read_text().split()
    entry.write_text(f"{seen} {'0' * 64}\n")
    assert known_sha256(sif, memo) == "0" * 64
    # the same size rewritten in place, its modification time set back: the inode's change time still
    # moves, so the file is read again
    facts = sif.stat()
    time.sleep(0.01)
    with sif.open("r+b") as handle:
        handle.write(b"x")
    os.utime(sif, ns=(facts.st_atime_ns, facts.st_mtime_ns))
    assert sif.stat().st_size == facts.st_size and sif.stat().st_mtime_ns == facts.st_mtime_ns
    assert known_sha256(sif, memo) == file_sha256(sif) != first
    # a memo that cannot be made (here a file stands where its folder would go) only costs the reading
    (tmp_path / "blocker").write_text("")
    assert known_sha256(sif, tmp_path / "blocker" / ".sha256") == file_sha256(sif)
