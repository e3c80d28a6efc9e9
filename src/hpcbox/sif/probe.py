"""The probe SIFs: a SIF of a few kilobytes for each compression hpcbox may ship, whose one program is a
static `true`. `hpcbox doctor` runs them on a site to learn which compressions its runtime can mount
(a zstd SIF "might not work with older installations", Apptainer's changelog) before a real one is
built or uploaded.

They are made the way the sif stage makes a SIF (mksquashfs, `apptainer sif`, the header normalised),
every time and owner fixed, so the same machine and compression give the same bytes anywhere: the
site keeps each under its content address and gets it once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.sif.compression import ALGORITHMS, SifCompression, fastest
from hpcbox.sif.convert import PARTITION_ARCHITECTURES, cache_dir, normalise_header
from hpcbox.sif.helper import engine
from hpcbox.tools.apptainer import Apptainer, Command

PROGRAM = "/usr/bin/true"  # where the probe SIF has its one program
_BASE = 0x400000  # the address the program is loaded at

# `uname -m` -> (the ELF machine, the image architecture, the code of exit(0)).
_MACHINES = {
    # xor edi, edi; mov eax, 60 (exit); syscall
    "x86_64": (0x3E, "amd64", bytes.fromhex("31ff b83c000000 0f05")),
    # mov x0, #0; mov x8, #93 (exit); svc #0
    "aarch64": (0xB7, "arm64", bytes.fromhex("000080d2 a80b80d2 010000d4")),
}
MACHINES = tuple(_MACHINES)


def compressions() -> list[SifCompression]:
    """One probe per algorithm hpcbox may ship."""
    return [fastest(algorithm) for algorithm in ALGORITHMS]


def true_program(machine: str) -> bytes:
    """A static ELF executable for ``machine`` (as `uname -m` names it) that exits 0: its header, one
    loadable segment (the whole file) and the code."""
    if machine not in _MACHINES:
        raise HpcboxError(f"no probe program for {machine} machines", f"hpcbox knows {', '.join(MACHINES)}")
    elf_machine, _, code = _MACHINES[machine]
    header_size, segment_size = 64, 56
    size = header_size + segment_size + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, elf_machine, 1, _BASE + header_size + segment_size, header_size, 0, 0,
        header_size, segment_size, 1, 0, 0, 0,
    )  # fmt: skip
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)  # PT_LOAD, read+execute
    return header + segment + code


@dataclass(frozen=True)
class ProbeSif:
    compression: SifCompression
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        """Its name on a site: the content address."""
        return f"{self.sha256}.sif"


def probe_sifs(
    machine: str,
    wanted: Iterable[SifCompression],
    *,
    tool: Apptainer | None = None,
    cache: Path | None = None,
    say: Callable[[str], None] = print,
    timeout_s: float | None = None,
) -> list[ProbeSif]:
    """The probe SIF of each compression in ``wanted`` for ``machine``, made once into the SIF cache.

    With ``timeout_s`` (a bounded command's), making them is killed past it (proc.TimedOut), and a
    helper image that is not built here is refused rather than built."""
    wanted = list(dict.fromkeys(wanted))
    folder = (cache or cache_dir()) / "probe"
    path_of = {compression: folder / f"{machine}.{compression.slug}.sif" for compression in wanted}
    missing = [compression for compression, path in path_of.items() if not path.exists()]
    if missing:
        say(f"hpcbox: making the probe SIFs for {machine} ({', '.join(map(str, missing))}) ...")
        _make(machine, missing, tool or engine(build=timeout_s is None, say=say), folder, timeout_s)
    return [
        ProbeSif(compression, path, hashlib.sha256(path.read_bytes()).hexdigest())
        for compression, path in path_of.items()
    ]


def _make(
    machine: str, missing: list[SifCompression], tool: Apptainer, folder: Path, timeout_s: float | None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / f".work-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        rootfs = work / "rootfs"
        program = rootfs / PROGRAM.lstrip("/")
        program.parent.mkdir(parents=True)
        program.write_bytes(true_program(machine))
        program.chmod(0o755)
        for path in (program, program.parent, program.parent.parent, rootfs):
            os.utime(path, (0, 0))
        architecture = PARTITION_ARCHITECTURES[_MACHINES[machine][1]]
        steps = []
        for compression in missing:
            squashfs, sif = f"{compression.slug}.squashfs", f"{compression.slug}.sif"
            steps += [
                Command("mksquashfs", ("rootfs", squashfs, "-noappend", "-quiet", "-no-progress",
                                       "-all-root", "-no-xattrs", "-mkfs-time", "0",
                                       *compression.mksquashfs_args())),
                Command("apptainer", ("sif", "new", sif)),
                Command("apptainer", ("sif", "add", "--groupid", "1", "--datatype", "4", "--partfs", "1",
                                      "--parttype", "2", "--partarch", str(architecture), sif, squashfs)),
            ]  # fmt: skip
        tool.script(steps, work, what="make the probe SIFs", timeout_s=timeout_s)
        for compression in missing:
            made = work / f"{compression.slug}.sif"
            normalise_header(made, 0, f"hpcbox probe {machine} {compression}")
            made.chmod(0o644)
            made.replace(folder / f"{machine}.{compression.slug}.sif")
    finally:
        shutil.rmtree(work, ignore_errors=True)
