"""How a SIF's squashfs is compressed: an algorithm and its level, as written `zstd:3` or `gzip`.

A value below both the cluster profiles (a site reads some algorithms and not others) and the sif stage.
A level left out means mksquashfs's own default, written out, so `gzip` and `gzip:9` are one SIF.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcbox.errors import FieldError

# algorithm → (lowest level, highest level, mksquashfs's default); None: mksquashfs takes no level.
_LEVELS: dict[str, tuple[int, int, int] | None] = {
    "gzip": (1, 9, 9),
    "zstd": (1, 22, 15),
    "lzo": (1, 9, 8),
    "xz": None,
    "lz4": None,
}
ALGORITHMS = tuple(_LEVELS)


@dataclass(frozen=True)
class SifCompression:
    algorithm: str
    level: int | None

    def __str__(self) -> str:
        return self.algorithm if self.level is None else f"{self.algorithm}:{self.level}"

    @property
    def slug(self) -> str:
        """The form used in file names."""
        return str(self).replace(":", "-")

    def mksquashfs_args(self) -> list[str]:
        levelled = [] if self.level is None else ["-Xcompression-level", str(self.level)]
        return ["-comp", self.algorithm, *levelled]


# Every Apptainer and Singularity release (and the kernel's squashfs) reads gzip; level 1 costs 4 % in
# size against level 9 and converts the cuda image 3.6 times faster (bench/results/sif_cuda.json).
DEFAULT = SifCompression("gzip", 1)


def fastest(algorithm: str) -> SifCompression:
    """``algorithm`` at its lowest level: what reads a squashfs depends on the algorithm, not the level."""
    levels = _LEVELS[algorithm]
    return SifCompression(algorithm, None if levels is None else levels[0])


def parse_compression(text: str, field: str) -> SifCompression:
    """`ALGORITHM[:LEVEL]`, e.g. `zstd:3`; ``field`` names the option or profile key in the error."""
    algorithm, colon, level_text = text.strip().lower().partition(":")
    if algorithm not in _LEVELS:
        raise FieldError(
            field,
            f"unknown compression {text!r}: choose one of {', '.join(ALGORITHMS)}, e.g. zstd:3 or gzip:1",
        )
    levels = _LEVELS[algorithm]
    if levels is None:
        if colon:
            raise FieldError(field, f"{algorithm} takes no level: write {algorithm!r}")
        return SifCompression(algorithm, None)
    lowest, highest, default = levels
    if not colon:
        return SifCompression(algorithm, default)
    if not level_text.isdigit() or not lowest <= int(level_text) <= highest:
        raise FieldError(
            field, f"{algorithm} level must be a whole number {lowest}-{highest}, not {level_text!r}"
        )
    return SifCompression(algorithm, int(level_text))
