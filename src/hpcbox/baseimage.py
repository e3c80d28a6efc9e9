"""A Debian base image made without any registry: debootstrap into a folder, then `docker import`.

Air-gapped build hosts (and CI here) cannot pull from a registry but can reach a Debian mirror;
this is the base every offline image (trainer, Apptainer helper, mini cluster nodes) builds on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import docker, proc

DEFAULT_SUITE = "trixie"
SUITES = ("bookworm", "trixie", "sid")
_APT_NO_CACHE = """\
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dpkg::Options { "--force-confdef"; "--force-confold"; };
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
"""


@dataclass(frozen=True)
class BaseImage:
    ref: str
    id: str
    suite: str
    created: bool


def base_ref(suite: str = DEFAULT_SUITE) -> str:
    return os.environ.get("HPCBOX_BASE_REPOSITORY", "hpcbox/debian") + f":{suite}"


def ensure_base(
    suite: str = DEFAULT_SUITE,
    *,
    mirror: str | None = None,
    ref: str | None = None,
    force: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> BaseImage:
    """The bootstrapped base image for ``suite``, made only if missing (or when ``force``).

    ``mirror`` defaults to debootstrap's own default Debian mirror.
    """
    if suite not in SUITES:
        raise HpcboxError(f"unknown Debian suite {suite!r}", f"choose one of: {', '.join(SUITES)}")
    target = ref or base_ref(suite)
    existing = docker.image(target)
    if existing is not None and not force:
        return BaseImage(target, existing.id, suite, created=False)
    debootstrap = proc.require(
        "debootstrap", "install it: `apt-get install debootstrap` (`./bootstrap` does)"
    )
    if os.geteuid() != 0:
        raise HpcboxError(
            "bootstrapping a base image needs root (debootstrap creates device nodes)",
            "run `invoke base` as root, or pull a registry base instead",
        )
    work = Path(tempfile.mkdtemp(prefix="hpcbox-debootstrap-", dir=_scratch_dir()))
    try:
        rootfs = work / "rootfs"
        proc.stream(
            [debootstrap, "--variant=minbase", suite, str(rootfs), *([mirror] if mirror else [])],
            what=f"debootstrap Debian {suite}",
            hint="check that the Debian mirror is reachable from this machine (or pass another mirror)",
            on_line=on_line,
        )
        _tidy(rootfs)
        image_id = _import(rootfs, target, suite)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseImage(target, image_id, suite, created=True)


def _scratch_dir() -> str:
    # /tmp is often a small tmpfs; a root filesystem of ~200 MB belongs on disk.
    return "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()


def _tidy(rootfs: Path) -> None:
    """Drop what debootstrap leaves behind that an image should not carry."""
    for cached in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        cached.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
    (rootfs / "etc/apt/apt.conf.d/90hpcbox").write_text(_APT_NO_CACHE)


def _import(rootfs: Path, ref: str, suite: str) -> str:
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-c", "."],
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["bash"]',
        f"LABEL io.hpcbox.base.suite={suite}",
    ]
    try:
        image_id = docker.import_rootfs(tar.stdout, ref, changes)
    finally:
        tar.stdout.close()
        tar.wait()
    if tar.returncode != 0:
        raise HpcboxError(
            f"failed to archive the bootstrapped {suite} root filesystem (tar exit {tar.returncode})"
        )
    return image_id
