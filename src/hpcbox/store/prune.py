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

What an upload that was interrupted or failed left is listed and removed too, whichever project's it
was, since no job can use it (store.Leftover): the hidden part of a SIF or dataset (as big as what
arrived), rsync's and cp's temporaries beside it, and this project's unfinished code snapshot folders.
A SIF's or dataset's are removed only while their upload's lock is free, taken in the command that
removes them (one an upload holds now is kept and named); a code snapshot's, which has no lock, only
once nothing in it changed for INCOMING_MIN_AGE_MIN minutes. The locks themselves stay (`apply`).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hpcbox import store
from hpcbox.errors import HpcboxError
from hpcbox.ledger import JobRecord
from hpcbox.store.ship import remote_root
from hpcbox.tools import slurm, ssh

KEEP_DAYS = 30
# An unfinished SIF or dataset upload is told by its lock: an upload takes `.NAME.lock` before it makes
# `.NAME.partial` (links or copies its basis there, or resumes it) and holds it until the result is in
# place, so a part whose lock is free is no running upload's, however new (no age rule: after an
# interrupted upload, the user prunes to submit again at once). A code snapshot's upload takes no
# lock: it is one command, whose archive is unpacked into `.incoming-XXXXXX` as it arrives and renamed
# into place straight after, so while it runs something in that folder changes every few seconds (its
# ctime: tar gives the files the archive's mtimes). One in which nothing changed for this many minutes
# is no running upload's: far longer than any code upload takes, than a stall ssh outlives
# (ServerAliveInterval 15 s, 3 times) or than the master connection stays idle (ssh.CONTROL_PERSIST_S,
# 5 min); and a code snapshot is small, so the wait holds on to little room. (A submit whose laptop
# slept longer than that, mid-upload, fails with tar's words when it wakes, nothing worse.)
INCOMING_MIN_AGE_MIN = 60
# Why what an unfinished upload left is kept.
RUNNING = "an upload of it is running now (it holds its lock)"
NO_FLOCK = "the cluster has no flock(1) to tell whether an upload of it is running"


def _recent() -> str:
    return f"it changed in the last {INCOMING_MIN_AGE_MIN} min: a submit may be sending it"


@dataclass(frozen=True)
class Removable:
    kind: str  # "sif", "dataset" or "code"
    path: str  # absolute, on the cluster
    size: int  # bytes
    unfinished: bool = False  # what an upload left (store.Leftover), not a stored file or snapshot
    lock: str = ""  # an unfinished SIF's or dataset's: its upload's lock (absolute), held to remove it


@dataclass(frozen=True)
class Plan:
    """What pruning would remove, and what it keeps."""

    removable: tuple[Removable, ...]
    kept_jobs: tuple[str, ...]  # of this checkout's ledger
    left_alone: int  # files in the store that other projects, or none hpcbox knows, use
    index_entries: tuple[str, ...]  # this project's index entries of the removable files
    held_jobs: tuple[str, ...] = ()  # jobs Slurm holds for the user whose scripts say what they use
    unknown_jobs: tuple[tuple[str, str], ...] = ()  # (job, why) held jobs whose files cannot be told
    # (path, size, why) what unfinished uploads left that is kept: an upload may be writing it
    unfinished_kept: tuple[tuple[str, int, str], ...] = ()

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
    looked = _look(connection, root, project)
    home, stored, code, held = looked.home, looked.store, looked.code, looked.held
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
    # No job uses what an unfinished upload left, whatever the jobs Slurm holds: it goes even then.
    unfinished, unfinished_kept = _unfinished(looked, absolute, project)
    return Plan(
        tuple(removable + unfinished),
        tuple(record.job_id for record in kept),
        left_alone,
        tuple(entries),
        held_jobs=tuple(use.job_id for use in uses if not use.unknown),
        unknown_jobs=unknown,
        unfinished_kept=tuple(unfinished_kept),
    )


def _unfinished(
    looked: _Looked, root: str, project: str
) -> tuple[list[Removable], list[tuple[str, int, str]]]:
    """What unfinished uploads left in the store under ``root`` (absolute) and in ``project``'s code
    folder: what may go, and what is kept, with why. The locks are neither (see `apply`)."""
    removable: list[Removable] = []
    kept: list[tuple[str, int, str]] = []
    kinds = [*store.FOLDERS, "code"]
    for item in sorted(looked.store.leftovers, key=lambda item: (kinds.index(item.kind), item.name)):
        if item.what == "lock":
            continue
        if item.kind == "code":
            path = f"{root}/{project}/code/{item.name}"
            # In whole seconds, as the cluster's clock is read.
            age = looked.now - int(item.changed) if looked.now is not None else 0.0
            if age < INCOMING_MIN_AGE_MIN * 60:
                kept.append((path, item.size, _recent()))
            else:
                removable.append(Removable("code", path, item.size, unfinished=True))
            continue
        folder = store.folder(root, item.kind)
        path = f"{folder}/{item.name}"
        if not looked.flock:
            kept.append((path, item.size, NO_FLOCK))
        elif (item.kind, item.lock) in looked.busy:
            kept.append((path, item.size, RUNNING))
        else:
            removable.append(
                Removable(item.kind, path, item.size, unfinished=True, lock=f"{folder}/{item.lock}")
            )
    return removable, kept


def apply(
    connection: ssh.Connection, plan: Plan, *, say: Callable[[str], None] = print
) -> tuple[Removable, ...]:
    """Remove what ``plan`` lists, in one command: the files and code snapshots, their index entries,
    and what unfinished uploads left, each SIF's or dataset's under its upload's lock, taken without
    waiting, and each code snapshot's folder only while nothing in it changed for
    INCOMING_MIN_AGE_MIN minutes. What an upload writes now is kept and said (``say``). What was
    removed.

    Lock files are never removed, not even under their own lock: an upload opens `.NAME.lock`, then
    locks it (ssh.Connection.lock), so one that opened it just before it was removed would wait, then
    lock the removed file, while the next upload of NAME makes a new one and locks that: two uploads of
    NAME at once, each sure it is alone (ship's sha256 check keeps a wrong file out of place, but both
    write one part). Closing that needs every upload to check, once it holds the lock, that the file
    it locked is still the one at that name, and start over where not; ssh.Connection.lock does not.
    Until it does, an empty file per uploaded name is what it costs."""
    if not plan.removable and not plan.index_entries:
        return ()
    stored = [item.path for item in plan.removable if item.kind != "code" and not item.unfinished]
    folders = [item.path for item in plan.removable if item.kind == "code" and not item.unfinished]
    lines = ["umask 077", "s=0"]
    if stored or plan.index_entries:
        lines.append(shlex.join(["rm", "-f", "--", *stored, *plan.index_entries]) + " || s=1")
    if folders:
        lines.append(shlex.join(["rm", "-rf", "--", *folders]) + " || s=1")
    by_lock: dict[str, list[str]] = {}
    for item in plan.removable:
        if item.unfinished and item.lock:
            by_lock.setdefault(item.lock, []).append(item.path)
    if by_lock:
        # Each under its lock, taken without waiting (made where it is not there, as an upload would):
        # exit 6, the lock is held; anything else but 0, the lock or the removal failed.
        guarded = [
            f"( exec 9>>{shlex.quote(lock)} || exit 5; flock -n 9 || exit 6; "
            f"{shlex.join(['rm', '-f', '--', *paths])} ); "
            f"case $? in 0) ;; 6) printf 'busy\\t%s\\n' {shlex.quote(lock)} ;; *) s=1 ;; esac"
            for lock, paths in by_lock.items()
        ]
        lines.append(
            "if command -v flock >/dev/null 2>&1; then " + "; ".join(guarded) + "; else echo noflock; fi"
        )
    for item in plan.removable:
        if item.unfinished and item.kind == "code":
            path = shlex.quote(item.path)
            lines.append(
                f'if test -n "$(find {path} -cmin -{INCOMING_MIN_AGE_MIN} -print -quit 2>/dev/null)"; '
                f"then printf 'recent\\t%s\\n' {path}; else rm -rf -- {path} || s=1; fi"
            )
    lines.append('exit "$s"')
    what = f"remove {len(plan.removable)} unused files on {connection.target.address}"
    done = connection.run("\n".join(lines), what=what, check=False)
    answers = done.stdout.splitlines()
    busy = {line.split("\t", 1)[1] for line in answers if line.startswith("busy\t")}
    recent = {line.split("\t", 1)[1] for line in answers if line.startswith("recent\t")}
    kept = []
    for item in plan.removable:
        if item.unfinished and item.lock in busy:
            why = RUNNING
        elif item.unfinished and item.lock and "noflock" in answers:
            why = NO_FLOCK
        elif item.unfinished and item.path in recent:
            why = _recent()
        else:
            continue
        kept.append(item)
        say(f"hpcbox: kept {item.path} ({item.size / 1e6:,.1f} MB): {why}")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise HpcboxError(
            f"failed to {what}: {said[-1] if said else f'exit status {done.returncode}'}",
            "the store's files must be yours to remove; check their owner and modes on the login node",
        )
    return tuple(item for item in plan.removable if item not in kept)


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
    lines += [
        f"  {item.kind:<8} {item.size / 1e6:>10,.1f} MB  {'unfinished upload: ' if item.unfinished else ''}"
        f"{item.path}"
        for item in plan.removable
    ]
    lines += [
        f"unfinished upload kept, {why}: {path} ({size / 1e6:,.1f} MB)"
        for path, size, why in plan.unfinished_kept
    ]
    if plan.left_alone:
        lines.append(
            f"{plan.left_alone} files in the store belong to other projects, or to none hpcbox knows: "
            "left alone"
        )
    if plan.unknown_jobs:
        jobs = _some([f"{job} ({why})" for job, why in plan.unknown_jobs])
        nothing = "only unfinished uploads to prune" if plan.removable else "nothing to prune"
        lines.append(
            f"{nothing}: Slurm holds jobs of yours whose files hpcbox cannot tell, which could use "
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


@dataclass(frozen=True)
class _Looked:
    """What one look at the cluster found (`_look`)."""

    home: str
    store: store.Store  # with what uploads left, this project's code snapshots' included
    code: dict[str, int]  # the project's code snapshots, by name, with their sizes
    held: tuple[slurm.HeldJob, ...]  # the jobs Slurm holds for the user, with their scripts
    now: float | None  # the cluster's clock
    flock: bool  # whether the cluster has flock(1)
    busy: frozenset[tuple[str, str]]  # (kind, lock name) the locks of unfinished uploads held now


def _look(connection: ssh.Connection, root: str, project: str) -> _Looked:
    """The remote home, the store's listing, the project's code snapshots with their sizes, the jobs
    Slurm holds for the user with their scripts, and which unfinished uploads' locks are held: one
    round trip."""
    code = shlex.quote(f"{root}/{project}/code")
    script = "\n".join(
        [
            slurm.held_jobs_script(),
            'printf "home\\t%s\\n" "$HOME"',
            'printf "now\\t%s\\n" "$(date +%s)"',
            store.listing_script(root, project),
            _held_locks_script(root),
            # A code folder with no snapshot in it ends well too (`*` then names none).
            f"if test -d {code}; then cd {code} && for d in *; do "
            'test -d "$d" || continue; printf "code\\t%s\\t%s\\n" "$(du -sk -- "$d" | cut -f1)" "$d"; '
            "done; fi",
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
    now = next((line.split("\t", 1)[1] for line in lines if line.startswith("now\t")), "")
    answers = [line.split("\t") for line in lines]
    busy = frozenset((fields[1], fields[2]) for fields in answers if fields[0] == "busy" and len(fields) == 3)
    return _Looked(
        home,
        store.parse_listing(lines),
        snapshots,
        slurm.parse_held_jobs(lines),
        now=float(now) if now.isdigit() else None,
        flock="noflock" not in lines,
        busy=busy,
    )


def _held_locks_script(root: str) -> str:
    """Shell that prints `busy<TAB>kind<TAB>lock name` for each lock of an unfinished upload in the
    store that is held now (taken and let go at once where it is free: an upload that asks for it at
    that moment waits that long), or `noflock` where the cluster has no flock(1). A lock file that is
    not there is not made."""
    lines = []
    for kind in store.FOLDERS:
        folder = shlex.quote(store.folder(root, kind))
        lines.append(
            f"for p in {folder}/.*.partial {folder}/.*.partial.?????? {folder}/.*.copy.*; do "
            'test -f "$p" || continue; b=${p##*/}; b=${b%.partial*}; b=${b%.copy.*}; l="${p%/*}/$b.lock"; '
            'test -f "$l" || continue; '
            f'( exec 9>>"$l" && flock -n 9 ) 2>/dev/null || printf "busy\\t{kind}\\t%s\\n" "${{l##*/}}"; done'
        )
    return "if command -v flock >/dev/null 2>&1; then " + "; ".join(lines) + "; else echo noflock; fi"


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
