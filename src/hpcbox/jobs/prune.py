"""Keep the cluster's store tidy: the SIFs, dataset archives and code snapshots no job needs any more.

What a job needs is its SIF, dataset and code snapshot. Every job Slurm still holds for the user, of
any project and from any checkout, keeps the files its own batch script names (read from slurmctld
with `scontrol write batch_script`, not from a ledger): the store and a project's code snapshots are
shared by every checkout of it, a ledger is one checkout's. Where a held job's script is not one hpcbox
rendered, or cannot be read (an srun or salloc job, an older or edited script), that job could use any
file: nothing is pruned, and the plan names the job. Of this checkout's ledger the jobs kept are, by
default, every one Slurm still holds or that ended in the last KEEP_DAYS days; with ``keep=N``, the
last N submitted and every one Slurm still holds. The next delta's basis stays too: the last job's SIF
and dataset, and this project's newest file of each flavour and compression in the store's index.

The store is shared by the user's projects on the cluster: a file another project's index entry
names is never removed, nor one that neither the index nor this project's ledger names (uploaded
before the index, or by hand); both are only counted. Code snapshots are the project's own.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hpcbox.errors import HpcboxError
from hpcbox.jobs import store
from hpcbox.jobs.ledger import JobRecord
from hpcbox.jobs.ship import remote_root
from hpcbox.tools import slurm, ssh

KEEP_DAYS = 30


@dataclass(frozen=True)
class Removable:
    kind: str  # "sif", "dataset" or "code"
    path: str  # absolute, on the cluster
    size: int  # bytes


@dataclass(frozen=True)
class Plan:
    """What pruning would remove, and what it keeps."""

    removable: tuple[Removable, ...]
    kept_jobs: tuple[str, ...]  # of this checkout's ledger
    left_alone: int  # files in the store that other projects, or none hpcbox knows, use
    index_entries: tuple[str, ...]  # this project's index entries of the removable files
    held_jobs: tuple[str, ...] = ()  # jobs Slurm holds for the user whose scripts say what they use
    unknown_jobs: tuple[tuple[str, str], ...] = ()  # (job, why) held jobs whose files cannot be told

    @property
    def size(self) -> int:
        return sum(item.size for item in self.removable)


def plan(
    connection: ssh.Connection,
    project: str,
    records: Sequence[JobRecord],
    *,
    root: str,
    keep: int | None = None,
    now: datetime | None = None,
) -> Plan:
    """What `prune` would remove from the store under ``root`` and from ``project``'s code snapshots,
    given the ledger's ``records`` of jobs on this cluster (oldest first)."""
    if keep is not None and keep < 0:
        raise HpcboxError(
            f"keep: {keep} is negative", "give how many of the last jobs to keep, e.g. --keep 3"
        )
    home, stored, code, held = _look(connection, root, project)
    absolute = remote_root(home, root)
    kept = _kept_jobs(connection, records, keep, now or datetime.now(UTC), {job.job_id for job in held})
    uses = [held_use(job) for job in held]
    unknown = tuple((use.job_id, use.unknown) for use in uses if use.unknown)
    named = _in_root(connection, {path for use in uses for path in use.paths}, absolute)
    mine = _files_of(project, records, stored, absolute)
    needed = (
        _files_used(kept, stored, absolute)
        | _next_basis(project, records[-1:], stored, absolute)
        | _files_named(named, stored, absolute)
    )
    removable: list[Removable] = []
    entries: list[str] = []
    left_alone = 0
    for kind, names in stored.files.items():
        for name, size in sorted(names.items()):
            others = stored.users(kind, name) - {project}
            if (kind, name) not in mine or others:
                left_alone += 1
            elif (kind, name) not in needed and not unknown:
                removable.append(Removable(kind, f"{store.folder(absolute, kind)}/{name}", size))
                if project in stored.users(kind, name):
                    entry = store.StoredUse(kind, name, project).entry
                    entries.append(f"{store.index_folder(absolute, kind)}/{entry}")
    # Entries of files no longer there (removed by hand) would only mislead the next delta's choice.
    entries += [
        f"{store.index_folder(absolute, use.kind)}/{use.entry}"
        for use in stored.uses
        if use.project == project and not stored.has(use.kind, use.name)
    ]
    code_folder = f"{absolute}/{project}/code"
    needed_code = {record.code_snapshot[:16] for record in [*kept, *records[-1:]]}
    held_code = posixpath.normpath(code_folder)
    needed_code |= {name for folder, _, name in (p.rpartition("/") for p in named) if folder == held_code}
    if not unknown:
        removable += [
            Removable("code", f"{code_folder}/{name}", size)
            for name, size in sorted(code.items())
            if name not in needed_code
        ]
    return Plan(
        tuple(removable),
        tuple(record.job_id for record in kept),
        left_alone,
        tuple(entries),
        held_jobs=tuple(use.job_id for use in uses if not use.unknown),
        unknown_jobs=unknown,
    )


def apply(connection: ssh.Connection, plan: Plan) -> None:
    """Remove what ``plan`` lists: the files (and their upload locks), then their index entries."""
    if not plan.removable and not plan.index_entries:
        return
    files = [item.path for item in plan.removable if item.kind != "code"]
    locks = [f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[1]}.lock" for path in files]
    folders = [item.path for item in plan.removable if item.kind == "code"]
    command = shlex.join(["rm", "-f", "--", *files, *locks, *plan.index_entries])
    if folders:
        command += " && " + shlex.join(["rm", "-rf", "--", *folders])
    connection.run(command, what=f"remove {len(plan.removable)} unused files on {connection.target.address}")


def describe(plan: Plan, *, keep: int | None) -> list[str]:
    """The plan for people: which jobs keep their files and why, then a line per file with its size."""
    lines = []
    if plan.held_jobs:
        lines.append(
            f"{len(plan.held_jobs)} jobs Slurm still holds for you (of any project or checkout) keep every "
            f"file their scripts name: {_some(plan.held_jobs)}"
        )
    elif not plan.unknown_jobs:
        lines.append("Slurm holds no job of yours")
    why = f"the last {keep}" if keep is not None else f"those that ended in the last {KEEP_DAYS} days"
    lines.append(
        f"{len(plan.kept_jobs)} jobs of this checkout's ledger kept ({why}, and any still queued or running)"
    )
    lines += [f"  {item.kind:<8} {item.size / 1e6:>10,.1f} MB  {item.path}" for item in plan.removable]
    if plan.left_alone:
        lines.append(
            f"{plan.left_alone} files in the store belong to other projects, or to none hpcbox knows: "
            "left alone"
        )
    if plan.unknown_jobs:
        jobs = _some([f"{job} ({why})" for job, why in plan.unknown_jobs])
        lines.append(
            "nothing to prune: Slurm holds jobs of yours whose files hpcbox cannot tell, which could use "
            f"any file here: {jobs}"
        )
    elif not plan.removable:
        lines.append("nothing to prune: every file here is one a kept job or the next upload needs")
    return lines


def _some(items: Sequence[str], most: int = 10) -> str:
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


@dataclass(frozen=True)
class HeldUse:
    """What one job Slurm holds uses, as its script says."""

    job_id: str
    paths: tuple[str, ...]  # absolute: its SIF, code snapshot and dataset
    unknown: str = ""  # why its files cannot be told ("" where they can)


def held_use(job: slurm.HeldJob) -> HeldUse:
    if job.script is None:
        return HeldUse(job.job_id, (), f"no batch script from Slurm: {job.problem}")
    paths, why = script_inputs(job.script)
    return HeldUse(job.job_id, paths, why)


# The line every job script hpcbox renders carries (render/sbatch.py's provenance), and the variables
# that name the job's inputs, each `name=<path>` as `shlex.quote` writes an absolute path.
_RENDERED = "# Rendered by hpcbox for cluster "
_INPUTS = ("sif", "code_dir", "dataset")


def script_inputs(text: str) -> tuple[tuple[str, ...], str]:
    """The absolute paths of the SIF, code snapshot and dataset a job script hpcbox rendered names (its
    first `sif=`, `code_dir=` and `dataset=` lines after `submit_dir=`), and ""; or no paths and why
    they cannot be told."""
    lines = text.splitlines()
    if not any(line.startswith(_RENDERED) for line in lines):
        return (), "its script is not one hpcbox rendered"
    start = next((i for i, line in enumerate(lines) if line.startswith("submit_dir=")), None)
    if start is None:
        return (), "its script is not in a form this hpcbox reads"
    paths = []
    for name in _INPUTS:
        value = next((line[len(name) + 1 :] for line in lines[start:] if line.startswith(f"{name}=")), "")
        if value.startswith('"$submit_dir"/'):
            return (), f"its {name} is relative to the folder it was submitted from"
        try:
            words = shlex.split(value)
        except ValueError:
            words = []
        # Exactly as hpcbox writes it: a path that quotes back to the same text has no expansion in it.
        if len(words) != 1 or not words[0].startswith("/") or shlex.quote(words[0]) != value:
            return (), f"its {name} line is not in a form this hpcbox reads"
        paths.append(posixpath.normpath(words[0]))
    return tuple(paths), ""


def _kept_jobs(
    connection: ssh.Connection,
    records: Sequence[JobRecord],
    keep: int | None,
    now: datetime,
    held: set[str],
) -> list[JobRecord]:
    if keep is not None:
        last = {record.job_id for record in records[len(records) - keep :]} if keep else set()
        return [record for record in records if record.job_id in held or record.job_id in last]
    cutoff = now - timedelta(days=KEEP_DAYS)
    older = [
        record for record in records if _when(record.submitted_at) < cutoff and record.job_id not in held
    ]
    ended = slurm.end_times(connection, [record.job_id for record in older])
    # Where accounting does not say when a job ended, the day it was submitted stands in.
    gone = {r.job_id for r in older if _when(ended.get(r.job_id, r.submitted_at)) < cutoff}
    return [record for record in records if record.job_id not in gone]


def _when(stamp: str) -> datetime:
    moment = datetime.fromisoformat(stamp)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _look(
    connection: ssh.Connection, root: str, project: str
) -> tuple[str, store.Store, dict[str, int], tuple[slurm.HeldJob, ...]]:
    """The remote home, the store's listing, the project's code snapshots with their sizes, and the jobs
    Slurm holds for the user with their scripts: one round trip."""
    code = shlex.quote(f"{root}/{project}/code")
    script = "\n".join(
        [
            slurm.held_jobs_script(),
            'printf "home\\t%s\\n" "$HOME"',
            store.listing_script(root),
            f"if test -d {code}; then cd {code} && for d in *; do "
            'test -d "$d" && printf "code\\t%s\\t%s\\n" "$(du -sk -- "$d" | cut -f1)" "$d"; done; fi',
        ]
    )
    what = f"look at {root} and the jobs Slurm holds for you on {connection.target.address}"
    lines = connection.run(script, what=what).stdout.splitlines()
    home = next((line.split("\t", 1)[1] for line in lines if line.startswith("home\t")), None)
    if home is None:
        raise HpcboxError(f"unexpected answer from {connection.target.address}: {lines[:3]!r}")
    snapshots = {}
    for line in lines:
        if line.startswith("code\t"):
            _, kilobytes, name = line.split("\t", 2)
            snapshots[name] = int(kilobytes) * 1024 if kilobytes.isdigit() else 0
    return home, store.parse_listing(lines), snapshots, slurm.parse_held_jobs(lines)


def _files_used(records: Iterable[JobRecord], stored: store.Store, root: str) -> set[tuple[str, str]]:
    return {
        (kind, name)
        for record in records
        for kind, name in store.used_by(record.sif, record.dataset_sha256, stored, root).items()
    }


def _in_root(connection: ssh.Connection, paths: set[str], root: str) -> set[str]:
    """``paths`` (absolute, on the cluster; normalised), and those of them in ``root`` by another name
    (a link, another spelling of the remote root) spelled as under ``root``: a job whose script reaches
    the store that way keeps its files too. The cluster resolves the paths not under ``root`` as
    written (one more round trip, only where there are such paths)."""
    under = posixpath.normpath(root).rstrip("/") + "/"
    paths = {posixpath.normpath(path) for path in paths}
    outside = sorted(path for path in paths if not path.startswith(under))
    if not outside:
        return paths
    done = connection.run(
        ["readlink", "-m", "--", under, *outside],
        what=f"resolve the paths your queued jobs name on {connection.target.address}",
    )
    resolved = done.stdout.splitlines()
    if len(resolved) != len(outside) + 1:
        raise HpcboxError(f"unexpected answer from readlink on {connection.target.address}: {resolved[:3]!r}")
    real_under = resolved[0].rstrip("/") + "/"
    return paths | {under + real[len(real_under) :] for real in resolved[1:] if real.startswith(real_under)}


def _files_named(paths: Iterable[str], stored: store.Store, root: str) -> set[tuple[str, str]]:
    """The store's files among ``paths`` (absolute, on the cluster, normalised, as under ``root``)."""
    found = set()
    for path in paths:
        folder, _, name = path.rpartition("/")
        found |= {
            (kind, name) for kind in store.FOLDERS if folder == posixpath.normpath(store.folder(root, kind))
        }
    return {(kind, name) for kind, name in found if stored.has(kind, name)}


def _files_of(
    project: str, records: Sequence[JobRecord], stored: store.Store, root: str
) -> set[tuple[str, str]]:
    """The store's files this project used: as its index entries say, or its ledger."""
    indexed = {(use.kind, use.name) for use in stored.uses if use.project == project}
    return indexed | _files_used(records, stored, root)


def _next_basis(
    project: str, last: Sequence[JobRecord], stored: store.Store, root: str
) -> set[tuple[str, str]]:
    """What the next delta upload may start from: the last job's files, and the project's newest
    file of each kind, flavour and compression."""
    newest: dict[tuple[str, str, str], store.StoredUse] = {}
    for use in stored.uses:
        key = (use.kind, use.flavour, use.compression)
        mine = use.project == project and stored.has(use.kind, use.name)
        if mine and (key not in newest or use.used_at > newest[key].used_at):
            newest[key] = use
    return _files_used(last, stored, root) | {(use.kind, use.name) for use in newest.values()}
