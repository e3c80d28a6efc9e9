"""The cluster's content-addressed store (SIFs under `images/sha256/`, dataset archives under
`data/sha256/`) and the index beside it: which project used which stored file, of which flavour and
compression, and when last.

The store is shared by every project of the user on that cluster and addressed by content alone, so it
cannot say by itself which file is this project's previous environment. The index can: a delta upload
picks its basis from it (the newest SIF of the same project, flavour and compression) and `hpcbox
prune` reads it to know which files another project still uses. It is one small file per (stored file,
project), `<kind's folder>/index/<file>@<project>`, each written whole under a unique temporary name
and renamed into place, so that two submits at once never leave half an entry or lose one another's.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from hpcbox.files import slug

# The store's folders under the remote root, by what they hold.
FOLDERS = {"sif": "images", "dataset": "data"}


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


@dataclass(frozen=True)
class Store:
    """What the probe saw of the store: each kind's files with their sizes, and the index."""

    files: Mapping[str, Mapping[str, int]]  # kind -> name -> size in bytes
    uses: tuple[StoredUse, ...]

    def has(self, kind: str, name: str) -> bool:
        return name in self.files.get(kind, {})

    def users(self, kind: str, name: str) -> set[str]:
        return {use.project for use in self.uses if use.kind == kind and use.name == name}


def listing_script(root: str) -> str:
    """Shell that prints the store's files (`stored<TAB>kind<TAB>size<TAB>name`) and its index entries
    (`index<TAB>entry`), hidden files (uploads in progress, locks) left out."""
    lines = []
    for kind in FOLDERS:
        files, index = shlex.quote(folder(root, kind)), shlex.quote(index_folder(root, kind))
        lines.append(
            f"if test -d {files}; then find {files} -maxdepth 1 -type f ! -name '.*' "
            f"-printf 'stored\\t{kind}\\t%s\\t%f\\n'; fi"
        )
        lines.append(
            f"if test -d {index}; then for f in {index}/*; do "
            'test -f "$f" && printf "index\\t%s\\n" "$(head -c 4096 "$f")"; done; fi'
        )
    return "; ".join(lines)


def parse_listing(lines: Iterable[str]) -> Store:
    files: dict[str, dict[str, int]] = {kind: {} for kind in FOLDERS}
    uses: list[StoredUse] = []
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
    return Store(files, tuple(uses))


def record_script(root: str, uses: Iterable[StoredUse]) -> str:
    """Shell that writes each index entry whole: a unique temporary name, then a rename."""
    commands = ["umask 022"]
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
