"""A dependency change ships megabytes, not gigabytes: submitting an environment with one package more to
a cluster that has the environment before it (a delta against it) beside the upload the same SIF needs
where the cluster has no basis (the whole file: what every dependency change cost before), side by side
in one run, for the cpu and the cuda environment; unlimited (the mini cluster's login node on this
machine) and through a 20 MB/s link (`rsync --bwlimit`, a campus uplink).

Each SIF is built before the clock starts (a user has built it); the clock runs around `jobs.submit`:
one SSH connection, the probe, the upload, the job script and `sbatch`, to the job id (what `hpcbox
submit` adds before it, the earlier stages' up-to-date checks, is bench_submit's: about half a
second). Each job is cancelled at once. The variants:

- cpu: one Debian package added (python3-tqdm in docker/lock/apt-cpu.txt);
- cuda: one PyPI package added (tqdm in docker/requirements/cuda.in, re-locked), and a version change
  of a large dependency (numpy 2.3.5 -> 2.3.4, re-locked), reported as it is.

Beside them, for the cpu pair, what rsync finds of the basis when it writes the result to a new file
and renames it (what hpcbox does) and when it writes into the basis in place (`--inplace`): the share
of the new SIF that matched, rsync's own count.

HPCBOX_BENCH_DELTA_FLAVOURS=cpu measures only those flavours.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchkit import build_cache_dropped, copy_project, free_port
from hpcbox import jobs, minicluster
from hpcbox.build.image import ENVIRONMENT, build_image
from hpcbox.build.lock import refresh_pip_locks
from hpcbox.cli.demo import make_dataset
from hpcbox.files import file_sha256
from hpcbox.project.config import load_project
from hpcbox.render.profiles import load_profile
from hpcbox.render.resources import ResourceRequest, resolve
from hpcbox.sif.convert import Sif, build_sif
from hpcbox.store import ship
from hpcbox.tools import docker, proc, ssh

REPO = Path(__file__).resolve().parents[1]
LIMIT_MB_S = 20
TARGET_SHARE = 0.005  # one added package: at most 0.5 % of the SIF sent
TARGET_LIMITED_S = 15  # a dependency change, resubmitted at 20 MB/s: to the job id within 15 s


def _quiet(_line: str) -> None:
    pass


def _add_debian_package(root: Path) -> None:
    lock = root / "docker" / "lock" / "apt-cpu.txt"
    lock.write_text(lock.read_text() + "python3-tqdm=4.67.1-5\n")


def _pip_change(old: str, new: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        source = root / "docker" / "requirements" / "cuda.in"
        text = source.read_text()
        source.write_text(text.replace(old, new) if old else text + new + "\n")
        refresh_pip_locks(load_project(root), say=_quiet)

    return change


VARIANTS: dict[str, tuple[tuple[str, Callable[[Path], None]], ...]] = {
    "cpu": (("one Debian package added (python3-tqdm)", _add_debian_package),),
    "cuda": (
        ("one PyPI package added (tqdm)", _pip_change("", "tqdm==4.67.1")),
        ("numpy 2.3.5 -> 2.3.4", _pip_change("numpy==2.3.5", "numpy==2.3.4")),
    ),
}


def _environment_sif(root: Path, flavour: str, cache: Path, compression) -> Sif:
    """The project's environment SIF, its image and the build cache it left removed again once converted
    (a cuda one is 7.5 GB, and as much again of build cache)."""
    project = load_project(root)
    with build_cache_dropped():
        image = build_image(
            project, flavour=flavour, offline=True, target=ENVIRONMENT, say=_quiet, on_line=_quiet
        )
        try:
            return build_sif(image, compression=compression, cache=cache, say=_quiet, on_line=_quiet)
        finally:
            docker.remove_image(image.ref)


def _limited(work: Path) -> Path:
    """A folder holding an `rsync` that is the real one at LIMIT_MB_S: first on PATH, every upload
    hpcbox makes goes through the limit."""
    shim = work / "limited"
    shim.mkdir(exist_ok=True)
    real = shutil.which("rsync")
    (shim / "rsync").write_text(f'#!/bin/sh\nexec {real} --bwlimit={LIMIT_MB_S * 1_000_000 // 1024} "$@"\n')
    (shim / "rsync").chmod(0o755)
    return shim


class _Submitter:
    def __init__(self, project, target: ssh.Target, data: Path) -> None:
        self.project = project
        self.target = target
        self.profile = load_profile("local")
        self.resources = resolve(self.profile, ResourceRequest(job_name="bench-delta", time="10"))
        self.dataset = ship.Dataset(data, file_sha256(data))

    def submit(self, sif: Sif, flavour: str, root: str) -> tuple[float, jobs.JobRecord, float]:
        """Seconds to the job id, the job, and the machine's 1-min load as it started."""
        payload = ship.Payload(
            sif.path,
            sif.sha256,
            sif.size,
            ship.code_snapshot(self.project),
            self.dataset,
            flavour,
            sif.compression,
        )
        load = os.getloadavg()[0]
        started = time.perf_counter()
        record = jobs.submit(
            self.project,
            self.profile,
            self.target,
            self.resources,
            ("--epochs", "1"),
            payload,
            image=f"bench/{flavour}",
            remote_root=root,
            say=_quiet,
        )
        elapsed = time.perf_counter() - started
        assert record is not None
        with ssh.Connection(self.target) as connection:
            connection.run(["scancel", record.job_id], what="cancel the bench's job")
        return elapsed, record, load


def _matched_rows(base: Sif, variant: Sif, work: Path, flavour: str) -> list[dict]:
    """rsync of the variant onto a copy of the base, here (--no-whole-file: the delta algorithm, as over
    SSH), writing a new file and, separately, in place."""
    rows = []
    for how, extra in (("a new file renamed over it (hpcbox)", ()), ("--inplace", ("--inplace",))):
        copy = work / "basis-copy.sif"
        shutil.copyfile(base.path, copy)
        argv = ["rsync", "--no-whole-file", "--stats", *extra, str(variant.path), str(copy)]
        stats = ssh.parse_rsync_stats(
            proc.stream(argv, what="rsync onto the basis", on_line=_quiet, tail_lines=40)
        )
        copy.unlink()
        rows.append(
            _row(f"{flavour}, one package added: rsync against the basis, {how}: matched",
                 stats.matched / variant.size * 100, "% of the SIF", None,
                 f"{stats.literal / 1e6:,.2f} MB literal, {stats.matched / 1e6:,.1f} MB matched"),
        )  # fmt: skip
    return rows


def _forget(connection: ssh.Connection, root: str, sif: Sif) -> None:
    """Remove a variant's SIF and its index entries from ``root``: the next delta starts from the base."""
    connection.run(
        f"rm -f {root}/images/sha256/{sif.sha256}.sif {root}/images/index/{sif.sha256}.sif@*",
        what="remove the variant's SIF",
    )


def _measure(flavour: str, work: Path, cluster, data: Path, cache: Path) -> list[dict]:
    compression = load_profile("local").apptainer.compression
    base_root = copy_project(work / f"{flavour}-base")
    base = _environment_sif(base_root, flavour, cache, compression)
    variants = []
    for number, (label, change) in enumerate(VARIANTS[flavour]):
        root = copy_project(work / f"{flavour}-variant-{number}")
        change(root)
        variants.append((label, _environment_sif(root, flavour, cache, compression)))
    rows = [
        _row(
            f"{flavour}: environment SIF",
            base.size / 1e6,
            "MB",
            None,
            f"{compression}, from docker/ as it is",
        )
    ]
    if flavour == "cpu":
        rows += _matched_rows(base, variants[0][1], work, flavour)
    submitter = _Submitter(load_project(base_root), cluster.ssh_target(), data)
    delta_root = f"bench-delta-{uuid.uuid4().hex[:8]}"
    submitter.submit(base, flavour, delta_root)  # the cluster has the environment before the change
    path = os.environ["PATH"]
    try:
        for limit in (None, LIMIT_MB_S):
            link = f"through {limit} MB/s" if limit else "unlimited"
            if limit:
                os.environ["PATH"] = f"{_limited(work)}{os.pathsep}{path}"
            for number, (label, sif) in enumerate(variants):
                delta_s, delta, load = submitter.submit(sif, flavour, delta_root)
                with ssh.Connection(cluster.ssh_target()) as connection:
                    _forget(connection, delta_root, sif)
                # The whole file, where the cluster has no basis; at the limit once (it is the same
                # size for every variant, and 3.5 minutes for the cuda SIF).
                full = None
                if not limit or number == 0:
                    full_root = f"bench-full-{uuid.uuid4().hex[:8]}"
                    full = submitter.submit(sif, flavour, full_root)
                    cluster.ssh(["rm", "-rf", full_root], check=True)
                rows += _rows(flavour, label, link, sif, (delta_s, delta, load), full, limited=bool(limit))
    finally:
        os.environ["PATH"] = path
        cluster.ssh(["rm", "-rf", delta_root])
    return rows


def _rows(flavour, label, link, sif, sent, full, *, limited: bool) -> list[dict]:
    delta_s, delta, load = sent
    share = delta.bytes_sent / sif.size
    what = f"{flavour}, {label}"
    rows = []
    if not limited:
        rows.append(
            _row(f"{what}: sent as a delta", share * 100, "% of the SIF",
                 f"<= {TARGET_SHARE * 100:g} %" if "added" in label else None,
                 f"{delta.bytes_sent / 1e6:,.2f} MB of {sif.size / 1e6:,.0f} MB (rsync's count, with the "
                 "code snapshot)"),
        )  # fmt: skip
    target = f"<= {TARGET_LIMITED_S} s" if limited else None
    rows.append(
        _row(f"{what}, {link}: submit to job id, delta", delta_s, "s", target, f"1-min load {load:.1f}")
    )
    if full is not None:
        full_s, full_record, full_load = full
        rows.append(
            _row(f"{what}, {link}: submit to job id, whole SIF", full_s, "s", None,
                 f"{full_record.bytes_sent / 1e6:,.0f} MB sent; the cluster had no basis; 1-min load "
                 f"{full_load:.1f}"),
        )  # fmt: skip
        rows.append(_row(f"{what}, {link}: delta / whole SIF", delta_s / full_s, "ratio", None, None))
    return rows


def run() -> list[dict]:
    chosen = os.environ.get("HPCBOX_BENCH_DELTA_FLAVOURS")
    flavours = [f.strip() for f in chosen.split(",")] if chosen else list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-delta-") as scratch:
        work = Path(scratch)
        cache = work / "sif"
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
        state = work / "cluster"
        dataset_project = load_project(copy_project(work / "data-project"))
        image = build_image(dataset_project, flavour="cpu", offline=True, say=_quiet, on_line=_quiet)
        data = make_dataset(dataset_project, image.ref, say=_quiet)
        rows: list[dict] = []
        try:
            cluster = minicluster.up(spec, state)
            for flavour in flavours:
                rows += _measure(flavour, work, cluster, data, cache)
        finally:
            minicluster.down(spec.name, state)
    return rows


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3) if isinstance(value, float) else value, "unit": unit,
            "target": target, "note": note}  # fmt: skip
