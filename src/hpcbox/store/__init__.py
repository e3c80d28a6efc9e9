"""The cluster's content-addressed store (SIFs under `images/sha256/`, dataset archives under
`data/sha256/`) and the index beside it: which project used which stored file, of which flavour and
compression, and when last. Its modules: `ship` (what a job needs, sent where the cluster lacks it),
`prune` (what no kept job uses, removed), `datasets` (a dataset directory as one archive).

The store is shared by every project of the user on that cluster and addressed by content alone, so it
cannot say by itself which file is this project's previous environment. The index can: a delta upload
picks its basis from it (the newest SIF of the same project, flavour and compression) and `hpcbox
prune` reads it to know which files another project still uses. It is one small file per (stored file,
project), `<kind's folder>/index/<file>@<project>`, each written whole under a unique temporary name
and renamed into place, so that two submits at once never leave half an entry or lose one another's.

What hpcbox puts there is the user's alone (`Access`): folders 0700, files 0600, written under umask
077, since a home directory is often readable by every user of the site. A profile's `[store] group`
shares it with one group, read only: the group owns it (set-group-id folders, so what is made in them
later is the group's too), folders 2750, files 0640, umask 027. A store made with looser modes is
tightened where hpcbox touches it: its folders at every submit, a job's SIF, dataset and code snapshot
when a job uses them, the index entries it writes.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from hpcbox.files import slug

# The store's folders under the remote root, by what they hold.
FOLDERS = {"sif": "images", "dataset": "data"}
# A project's folders under the remote root: its code snapshots, and its submit directory's own.
PROJECT_FOLDERS = ("code", "scripts", "logs", "runs")


@dataclass(frozen=True)
class Access:
    """Who may read what hpcbox puts on the cluster: the user alone, or with ``group`` that group's
    members too (read only); nobody else, either way."""

    group: str | None = None

    @property
    def umask(self) -> str:
        return "027" if self.group else "077"

    @property
    def folder_mode(self) -> str:
        return "2750" if self.group else "700"

    @property
    def file_mode(self) -> str:
        return "640" if self.group else "600"

    @property
    def rsync_chmod(self) -> str:
        """rsync's --chmod for an upload: the modes above, whatever the local file's are."""
        return f"D{self.folder_mode},F{self.file_mode}"

    def settle(self, paths: Iterable[str], *, folders: bool = False, recursive: bool = False) -> str:
        """Shell that gives each of ``paths`` that is the user's own this access (group, then mode); a
        missing path, or another user's (a shared root's), is left as it is. ``recursive``: a folder
        and everything in it, each file keeping its own execute bit."""
        if recursive:
            modes = "g+rX,g-w,o=" if self.group else "go="
            change = f'chgrp -R {shlex.quote(self.group)} "$@" && ' if self.group else ""
            change += f'chmod -R {modes} "$@"'
        else:
            change = f'chgrp {shlex.quote(self.group)} "$@" && ' if self.group else ""
            change += f'chmod {self.folder_mode if folders else self.file_mode} "$@"'
        quoted = " ".join(shlex.quote(path) for path in paths)
        # The user's own gathered first, then one chgrp and one chmod for them all: a submit settles a
        # dozen folders, and each program started on the login node costs the command a millisecond or
        # more. In braces: one command, which `&&` chains with the steps around it.
        return (
            f'{{ set --; for p in {quoted}; do if test -O "$p"; then set -- "$@" "$p"; fi; done; '
            f"if test $# -gt 0; then {change} || exit 4; fi; }}"
        )

    def check_script(self) -> str:
        """Shell that fails (exit 3, `notmember<TAB>the user's groups`) where the login user is not in
        the group: chgrp would refuse every file."""
        if self.group is None:
            return ":"
        return (
            f"if ! id -Gn | tr ' ' '\\n' | grep -qxF -- {shlex.quote(self.group)}; then "
            'printf "notmember\\t%s\\n" "$(id -Gn)"; exit 3; fi'
        )


# The default: the user's alone.
PRIVATE = Access()


@dataclass(frozen=True)
class StoredUse:
    """One project's use of one stored file (an index entry)."""

    kind: str  # "sif" or "dataset"
    name: str  # the file's name in its store folder
    project: str
    flavour: str = ""  # a SIF's: cpu, cuda, ...
    compression: str = ""  # a SIF's: zstd:3, gzip:1, ...
    used_at: float = 0.0  # seconds since the epoch, of the last submit that used it

    @property
    def entry(self) -> str:
        return f"{self.name}@{slug(self.project)}"

    def to_line(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_line(cls, line: str) -> StoredUse | None:
        """The entry in ``line``; None for anything that is not one (a foreign or damaged file is
        ignored: the index only ever narrows what hpcbox may do)."""
        try:
            fields = json.loads(line)
            if not isinstance(fields, dict):
                return None
            return cls(
                kind=str(fields["kind"]),
                name=str(fields["name"]),
                project=str(fields["project"]),
                flavour=str(fields.get("flavour", "")),
                compression=str(fields.get("compression", "")),
                used_at=float(fields.get("used_at", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def folder(root: str, kind: str) -> str:
    return f"{root}/{FOLDERS[kind]}/sha256"


def index_folder(root: str, kind: str) -> str:
    return f"{root}/{FOLDERS[kind]}/index"


# What an upload leaves beside the file NAME it makes (ship.py), hidden: the lock every upload of NAME
# holds for its whole duration (`.NAME.lock`, empty), the part rsync --partial keeps where an upload
# stops (`.NAME.partial`, as big as what arrived), rsync's own temporary that it writes and renames
# to that name (`.NAME.partial.XXXXXX`; a small file sent whole in ship's last command, which takes no
# lock, is written under such a name too), and the copy of a basis that was not ours to link
# (`.NAME.copy.PID`); a code snapshot is unpacked in `<project>/code/.incoming-XXXXXX` and renamed
# into place. Each pattern gives NAME; a code snapshot's folder has none (its upload takes no lock).
_LEFTOVERS = {
    "lock": re.compile(r"\.(.+)\.lock"),
    "partial": re.compile(r"\.(.+)\.partial"),
    "temporary": re.compile(r"\.(.+)\.partial\.[A-Za-z0-9]{6}"),
    "copy": re.compile(r"\.(.+)\.copy\.[0-9]+"),
}
INCOMING = ".incoming-"


@dataclass(frozen=True)
class Leftover:
    """A hidden file an upload left in the store's folder of ``kind`` (or, of kind "code", a folder in
    the project's code folder): an upload's lock, or what an upload that was interrupted or failed, or
    is running now, wrote."""

    kind: str  # "sif", "dataset" or "code"
    name: str  # its own (hidden) name in its folder
    size: int  # bytes (a folder's: what its files take on the disk)
    changed: float  # seconds since the epoch, by the cluster's clock: its last change (ctime), a
    # folder's the newest of anything in it. Not the mtime: rsync gives its files the local file's, tar
    # the archive's.

    @property
    def what(self) -> str:
        """ "lock", "partial", "temporary", "copy", "incoming" (a code snapshot's folder), or "" for a
        name of none of these forms."""
        if self.kind == "code":
            return "incoming" if self.name.startswith(INCOMING) else ""
        return next((what for what, pattern in _LEFTOVERS.items() if pattern.fullmatch(self.name)), "")

    @property
    def lock(self) -> str | None:
        """The name of the lock (in the same folder) that an upload which writes this holds; None for a
        code snapshot's folder, which no lock guards."""
        found = _LEFTOVERS[self.what].fullmatch(self.name) if self.what in _LEFTOVERS else None
        return f".{found.group(1)}.lock" if found else None

    @classmethod
    def from_fields(cls, kind: str, size: str, changed: str, name: str) -> Leftover | None:
        """The leftover a listing line names; None for anything else."""
        known = cls(kind, name, 0, 0.0)
        if kind not in (*FOLDERS, "code") or "/" in name or not known.what or not size.isdigit():
            return None
        try:
            when = float(changed)
        except ValueError:
            when = 0.0
        return cls(kind, name, int(size), when)


@dataclass(frozen=True)
class Store:
    """What the probe saw of the store: each kind's files with their sizes, the index, and what uploads
    left beside them (hidden)."""

    files: Mapping[str, Mapping[str, int]]  # kind -> name -> size in bytes
    uses: tuple[StoredUse, ...]
    leftovers: tuple[Leftover, ...] = ()

    def has(self, kind: str, name: str) -> bool:
        return name in self.files.get(kind, {})

    def users(self, kind: str, name: str) -> set[str]:
        return {use.project for use in self.uses if use.kind == kind and use.name == name}


def listing_script(root: str, project: str | None = None) -> str:
    """Shell that prints the store's files (`stored<TAB>kind<TAB>size<TAB>name`), its index entries
    (`index<TAB>entry`) and what uploads left beside the files, hidden (`unfinished<TAB>kind<TAB>size
    <TAB>changed<TAB>name`: see Leftover); with ``project``, also what its code snapshots' uploads left
    (kind `code`). It ends with status 0 on any store, an index folder with no entry in it (a first
    upload's failure leaves one) included, as the commands run after it in one SSH command need."""
    lines = []
    hidden = "-name '.*.lock' -o -name '.*.partial' -o -name '.*.partial.??????' -o -name '.*.copy.*'"
    for kind in FOLDERS:
        files, index = shlex.quote(folder(root, kind)), shlex.quote(index_folder(root, kind))
        lines.append(
            f"if test -d {files}; then find {files} -maxdepth 1 -type f ! -name '.*' "
            f"-printf 'stored\\t{kind}\\t%s\\t%f\\n' -o -type f \\( {hidden} \\) "
            f"-printf 'unfinished\\t{kind}\\t%s\\t%C@\\t%f\\n'; fi"
        )
        # Every entry's first line (4096 characters at most) in one awk however many entries there are,
        # read with getline: an entry that cannot be read (another user's, or one a prune removed since
        # find saw it) is passed over, where awk's own reading of its files would stop at it (mawk).
        read_each = (
            "'BEGIN { for (i = 1; i < ARGC; i++) { if ((getline line < ARGV[i]) > 0) "
            'print "index\\t" substr(line, 1, 4096); close(ARGV[i]) } }\''
        )
        lines.append(
            f"if test -d {index}; then find {index} -maxdepth 1 -type f ! -name '.*' -exec awk {read_each} "
            "{} +; fi"
        )
    if project is not None:
        code = shlex.quote(f"{root}/{project}/code")
        lines.append(
            f'if test -d {code}; then for d in {code}/{INCOMING}*; do test -d "$d" || continue; '
            'k=$(du -sk -- "$d" 2>/dev/null | cut -f1); '
            "printf 'unfinished\\tcode\\t%s\\t%s\\t%s\\n' \"$((${k:-0} * 1024))\" "
            '"$(find "$d" -printf \'%C@\\n\' 2>/dev/null | sort -n | tail -n 1)" "${d##*/}"; done; fi'
        )
    return "; ".join(lines)


def parse_listing(lines: Iterable[str]) -> Store:
    files: dict[str, dict[str, int]] = {kind: {} for kind in FOLDERS}
    uses: list[StoredUse] = []
    leftovers: list[Leftover] = []
    for line in lines:
        tag, _, rest = line.partition("\t")
        if tag == "stored":
            kind, size, name = rest.split("\t", 2)
            if kind in files and size.isdigit():
                files[kind][name] = int(size)
        elif tag == "index":
            use = StoredUse.from_line(rest)
            if use is not None and use.kind in files:
                uses.append(use)
        elif tag == "unfinished" and rest.count("\t") >= 3:
            leftover = Leftover.from_fields(*rest.split("\t", 3))
            if leftover is not None:
                leftovers.append(leftover)
    return Store(files, tuple(uses), tuple(leftovers))


def folders_script(root: str, project: str, access: Access = PRIVATE) -> str:
    """Shell that makes the store's folders and a project's (code, scripts, logs, runs) under the
    store's umask and gives every one of them its access, a looser one made before included; exit 3
    where the login user is not in the store's group (`Access.check_script`)."""
    folders = [root]
    for kind in FOLDERS:
        folders += [f"{root}/{FOLDERS[kind]}", folder(root, kind), index_folder(root, kind)]
    folders += [f"{root}/{project}", *(f"{root}/{project}/{name}" for name in PROJECT_FOLDERS)]
    make = f"umask {access.umask} && mkdir -p -- {' '.join(shlex.quote(path) for path in folders)}"
    return f"{access.check_script()} && {make} && {access.settle(folders, folders=True)}"


def record_script(root: str, uses: Iterable[StoredUse], access: Access = PRIVATE) -> str:
    """Shell that writes each index entry whole: a unique temporary name, then a rename (under the
    store's umask, so that the entry has its access)."""
    commands = [f"umask {access.umask}"]
    for use in uses:
        index = index_folder(root, use.kind)
        entry = f"{index}/{use.entry}"
        temporary = f"{index}/.{use.entry}"
        commands.append(
            f"mkdir -p {shlex.quote(index)} && printf '%s\\n' {shlex.quote(use.to_line())} "
            f"> {shlex.quote(temporary)}.$$ && mv -f {shlex.quote(temporary)}.$$ {shlex.quote(entry)}"
        )
    return " && ".join(commands)


def used_by(sif: str, dataset_sha256: str, stored: Store, root: str) -> dict[str, str]:
    """The store's files a job used, by kind: its SIF (``sif``, an absolute path, when it is in this
    store under ``root``) and its dataset (named by ``dataset_sha256`` and its suffix); those the store
    still has."""
    found = {}
    folder_of_sif, _, name = sif.rpartition("/")
    if folder_of_sif == folder(root, "sif") and stored.has("sif", name):
        found["sif"] = name
    datasets = sorted(
        n for n in stored.files.get("dataset", {}) if dataset_sha256 and n.startswith(dataset_sha256)
    )
    if datasets:
        found["dataset"] = datasets[0]
    return found


def choose_basis(store: Store, want: StoredUse, last_used: str | None) -> str | None:
    """The stored file a delta upload of ``want`` starts from, or None: the file this project's last
    job on the cluster used (``last_used``) when it is still there and not of another compression,
    else the newest file this project used of the same kind, flavour and compression."""
    if last_used and last_used != want.name and store.has(want.kind, last_used):
        compressions = {u.compression for u in store.uses if u.kind == want.kind and u.name == last_used}
        if not compressions or want.compression in compressions:
            return last_used
    same = [
        use
        for use in store.uses
        if (use.kind, use.project, use.flavour, use.compression)
        == (want.kind, want.project, want.flavour, want.compression)
        and use.name != want.name
        and store.has(use.kind, use.name)
    ]
    return max(same, key=lambda use: use.used_at).name if same else None
