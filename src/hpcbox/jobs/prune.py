"""Keep the cluster's store tidy: the SIFs, dataset archives and code snapshots no job needs any more.

What a job needs is its SIF, dataset and code snapshot. The jobs kept are, by default, every job of the
ledger that Slurm still holds or that ended in the last KEEP_DAYS days; with ``keep=N``, the last N
submitted and every one Slurm still holds. The next delta's basis stays too: the last job's SIF and
dataset, and this project's newest file of each flavour and compression in the store's index.

The store is shared by the user's projects on the cluster: a file another project's index entry
names is never removed, nor one that neither the index nor this project's ledger names (uploaded
before the index, or by hand); both are only counted. Code snapshots are the project's own.
"""

from __future__ import annotations

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
    kept_jobs: tuple[str, ...]
    left_alone: int  # files in the store that other projects, or none hpcbox knows, use
    index_entries: tuple[str, ...]  # this project's index entries of the removable files

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
    kept = _kept_jobs(connection, records, keep, now or datetime.now(UTC))
    home, stored, code = _look(connection, root, project)
    absolute = remote_root(home, root)
    mine = _files_of(project, records, stored, absolute)
    needed = _files_used(kept, stored, absolute) | _next_basis(project, records[-1:], stored, absolute)
    removable: list[Removable] = []
    entries: list[str] = []
    left_alone = 0
    for kind, names in stored.files.items():
        for name, size in sorted(names.items()):
            others = stored.users(kind, name) - {project}
            if (kind, name) not in mine or others:
                left_alone += 1
            elif (kind, name) not in needed:
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
    needed_code = {record.code_snapshot[:16] for record in [*kept, *records[-1:]]}
    removable += [
        Removable("code", f"{absolute}/{project}/code/{name}", size)
        for name, size in sorted(code.items())
        if name not in needed_code
    ]
    return Plan(tuple(removable), tuple(record.job_id for record in kept), left_alone, tuple(entries))


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
    """The plan for people: which jobs are kept, then a line per file with its size."""
    why = f"the last {keep}" if keep is not None else f"those that ended in the last {KEEP_DAYS} days"
    lines = [f"{len(plan.kept_jobs)} jobs kept ({why}, and any still queued or running)"]
    lines += [f"  {item.kind:<8} {item.size / 1e6:>10,.1f} MB  {item.path}" for item in plan.removable]
    if plan.left_alone:
        lines.append(
            f"{plan.left_alone} files in the store belong to other projects, or to none hpcbox knows: "
            "left alone"
        )
    if not plan.removable:
        lines.append("nothing to prune: every file here is one a kept job or the next upload needs")
    return lines


def _kept_jobs(
    connection: ssh.Connection, records: Sequence[JobRecord], keep: int | None, now: datetime
) -> list[JobRecord]:
    held = slurm.unfinished_jobs(connection)
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


def _look(connection: ssh.Connection, root: str, project: str) -> tuple[str, store.Store, dict[str, int]]:
    """The remote home, the store's listing, and the project's code snapshots with their sizes."""
    code = shlex.quote(f"{root}/{project}/code")
    script = "; ".join(
        [
            'printf "home\\t%s\\n" "$HOME"',
            store.listing_script(root),
            f"if test -d {code}; then cd {code} && for d in *; do "
            'test -d "$d" && printf "code\\t%s\\t%s\\n" "$(du -sk -- "$d" | cut -f1)" "$d"; done; fi',
        ]
    )
    lines = connection.run(script, what=f"look at {root} on {connection.target.address}").stdout.splitlines()
    home = next((line.split("\t", 1)[1] for line in lines if line.startswith("home\t")), None)
    if home is None:
        raise HpcboxError(f"unexpected answer from {connection.target.address}: {lines[:3]!r}")
    snapshots = {}
    for line in lines:
        if line.startswith("code\t"):
            _, kilobytes, name = line.split("\t", 2)
            snapshots[name] = int(kilobytes) * 1024 if kilobytes.isdigit() else 0
    return home, store.parse_listing(lines), snapshots


def _files_used(records: Iterable[JobRecord], stored: store.Store, root: str) -> set[tuple[str, str]]:
    return {
        (kind, name)
        for record in records
        for kind, name in store.used_by(record.sif, record.dataset_sha256, stored, root).items()
    }


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
