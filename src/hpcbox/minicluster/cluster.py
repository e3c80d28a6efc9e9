"""A running mini cluster, as users, tests and the node classes reach it.

Finding one reads its state folder alone: a command that only connects to the cluster (status, logs)
does not load the Docker SDK and testcontainers."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING

from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.minicluster import state
from hpcbox.minicluster.secrets import ClusterSecrets
from hpcbox.minicluster.shape import ClusterShape
from hpcbox.minicluster.spec import (
    USER,
    ClusterSpec,
    cluster_command,
    legacy_state_dir,
    state_dir,
    state_root,
)
from hpcbox.tools import docker as engine
from hpcbox.tools import proc, ssh

if TYPE_CHECKING:
    from docker.models.containers import Container


# Docker can end an exec's output stream before the last of it was copied (moby/moby#27289; seen here
# once: `sinfo --version` in a node answered exit status 0 and nothing): a mark the command's shell prints
# last tells a whole output from a cut one.
_ANSWERED = "@@hpcbox-answered"
_ASKED_AT_MOST = 3


@dataclass(frozen=True)
class Incarnation:
    """One life of a mini cluster of some name, from the `up` that started it to its removal."""

    id: str
    up_at: str
    removed_at: str | None = None

    @classmethod
    def new(cls) -> Incarnation:
        return cls(token_hex(6), now())

    def __str__(self) -> str:
        removed = f", removed at {self.removed_at}" if self.removed_at else ""
        return f"brought up at {self.up_at}{removed}"


def files_archive(files: Mapping[str, tuple[bytes, int]], under: str = "") -> bytes:
    """One tar archive of ``files`` (name -> content, mode), each owned by root, in folder ``under`` of
    where it is unpacked (made there if missing): written into a node in one go, as dockerd re-executes
    itself to unpack each archive (about 60 ms each, measured here)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, (content, mode) in files.items():
            member = tarfile.TarInfo(f"{under.strip('/')}/{name}".lstrip("/"))
            member.size, member.mode = len(content), mode
            archive.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


@dataclass(frozen=True)
class Cluster:
    """A running mini cluster, as users and tests reach it."""

    spec: ClusterSpec
    image: str
    secrets: ClusterSecrets
    shape: ClusterShape
    # Which cluster of that name this is: made at each `up` that starts one (fresh Slurm state, its job
    # ids from 1 again), kept while it lives (a changed runtime or GPU type is the same cluster). A job
    # records it, so that job 1 of one cluster is never taken for job 1 of the next (ledger.JobRecord).
    incarnation: Incarnation = field(default_factory=lambda: Incarnation("", ""))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def login_port(self) -> int:
        return self.spec.port

    @property
    def user(self) -> str:
        return USER

    @property
    def key_path(self) -> Path:
        return self.secrets.user_key

    @property
    def known_hosts(self) -> Path:
        return self.secrets.known_hosts

    @property
    def start_again(self) -> str:
        """What brings its stopped containers back, in a sentence."""
        return (
            f"after the machine or Docker restarted, `{self.spec.up_command}` starts its containers again, "
            "its jobs and results kept"
        )

    def ssh_target(self) -> ssh.Target:
        status = cluster_command("status", self.name)
        then = self.start_again
        stopped = f"is mini cluster {self.name} running (`{status}`)? {then[:1].upper()}{then[1:]}"
        return ssh.Target(
            "127.0.0.1", self.login_port, USER, self.key_path, self.known_hosts, unreachable_hint=stopped
        )

    def ssh(self, command: str | Sequence[str], *, check: bool = False) -> proc.Completed:
        """Run ``command`` on the login node as the cluster user, over SSH: through the master connection
        an earlier command left open where there is one, as hpcbox's own commands do (a session on it
        costs sshd a fork, not a key exchange and a login), else one this call opens and leaves."""
        with ssh.Connection(self.ssh_target()) as connection:
            return connection.run(command, what=f"run a command on {self.name}'s login node", check=check)

    def node_container(self, host: str) -> Container:
        found = engine.container(self.spec.container(host))
        if found is None:
            raise HpcboxError(
                f"cluster {self.name} has no container for {host}",
                f"bring it up with `{cluster_command('up', self.name)}`",
            )
        return found

    def exec(self, host: str, argv: Sequence[str], *, user: str = "root") -> proc.Completed:
        """Run ``argv`` inside ``host``'s container (as ``user``), bypassing SSH: its output as far as
        Docker brought it (`ask` is for a command that only reads, whose answer matters)."""
        return self._exec(host, argv, user)[0]

    def ask(self, host: str, argv: Sequence[str], *, user: str = "root") -> proc.Completed:
        """What ``argv``, a command that only reads (or does what is done once), answers inside
        ``host``'s container: asked again where Docker lost the end of its output."""
        for _ in range(_ASKED_AT_MOST):
            done, whole = self._exec(host, argv, user)
            if whole:
                return done
        raise HpcboxError(
            f"cluster {self.name}: Docker lost the output of `{shlex.join(argv)}` in its {host} container "
            f"{_ASKED_AT_MOST} times",
            "the engine's log says why (dockerd's, or `journalctl -u docker`)",
        )

    def _exec(self, host: str, argv: Sequence[str], user: str) -> tuple[proc.Completed, bool]:
        """The command's outcome, and whether its output came whole (its mark came last)."""
        container = self.node_container(host)
        if container.status != "running":
            raise HpcboxError(f"cluster {self.name}: its {host} container is not running", self.start_again)
        marked = ["sh", "-c", f'"$@"; status=$?; printf %s {_ANSWERED}; exit "$status"', "sh", *argv]
        code, (out, err) = container.exec_run(marked, user=user, demux=True)
        stdout = (out or b"").decode(errors="replace")
        return proc.Completed(
            tuple(argv), code, stdout.removesuffix(_ANSWERED), (err or b"").decode(errors="replace")
        ), stdout.endswith(_ANSWERED)

    def put_files(self, host: str, directory: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        """Write ``files`` (name -> content, mode; owned by root) into ``directory`` of ``host``'s
        container, running or not."""
        engine.put_archive(
            self.node_container(host), directory, files_archive(files),
            what=f"write {', '.join(files)} into {self.name}'s {host}",
        )  # fmt: skip

    def add_account(self, account: str) -> bool:
        """Let the cluster's user submit under ``account``, as a member of it is allowed to at the
        site: the account and the user's association with it, with the QOS the user has already, in
        slurmdbd (which tells slurmctld). Whether it was new."""
        script = (
            'cluster=$(sed -n "s/^ClusterName=//p" /etc/slurm/slurm.conf); '
            f'if sacctmgr --noheader --parsable2 show assoc user={USER} account="$1" format=account '
            "| grep -q .; then echo known; exit 0; fi; "
            f"qos=$(sacctmgr --noheader --parsable2 show assoc user={USER} account=research format=qos "
            "| head -n 1); "
            'sacctmgr --immediate add account "$1" Cluster="$cluster" Description=rehearsal '
            "Organization=hpcbox >/dev/null && "
            f'sacctmgr --immediate add user {USER} Account="$1" Cluster="$cluster" QOS="${{qos:-normal}}" '
            "DefaultQOS=normal >/dev/null && echo added"
        )
        done = self.ask("accounting", ["sh", "-c", script, "sh", account])
        if done.returncode != 0 or done.stdout.strip() not in ("known", "added"):
            raise HpcboxError(
                f"could not add account {account} to cluster {self.name}'s accounting: "
                f"{(done.stderr or done.stdout).strip()}",
                f"is the cluster up? `{cluster_command('status', self.name)}`",
            )
        return done.stdout.strip() == "added"


RECORD = "cluster.json"  # in the cluster's state folder, beside its keys


def record(cluster: Cluster, state_root: Path) -> None:
    """Keep what `up` (or a later change) made of ``cluster`` where ``find`` reads it back."""
    saved = {
        "spec": asdict(cluster.spec), "image": cluster.image, "shape": asdict(cluster.shape),
        "incarnation": asdict(cluster.incarnation),
    }  # fmt: skip
    write_atomically(state_dir(state_root, cluster.name) / RECORD, json.dumps(saved))


def history_path(state_root: Path, name: str) -> Path:
    """The clusters of ``name`` removed so far (beside its lock: the state folder goes with a cluster)."""
    return state_root / f"{name}.removed.jsonl"


def note_removed(state_root: Path, name: str) -> None:
    """Add cluster ``name``'s incarnation, as recorded, to its history as removed now (nothing where no
    `up` recorded one). Call it holding ``state.locked``, before the state folder goes."""
    found = find(name, state_root)
    if found is None or not found.incarnation.id:
        return
    gone = dataclasses.replace(found.incarnation, removed_at=now())
    with history_path(state.private_dir(state_root), name).open("a") as history:
        history.write(json.dumps(asdict(gone)) + "\n")


def removed_incarnations(state_root: Path, name: str) -> dict[str, Incarnation]:
    """Cluster ``name``'s incarnations removed so far, by id."""
    try:
        lines = history_path(state_root, name).read_text().splitlines()
    except OSError:
        return {}
    found = [Incarnation(**json.loads(line)) for line in lines if line.strip()]
    return {incarnation.id: incarnation for incarnation in found}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def find(name: str, state_root: Path) -> Cluster | None:
    """The cluster ``name`` as its last `up` recorded it under ``state_root``, or None: no `up` there."""
    recorded = state_dir(state_root, name) / RECORD
    if not recorded.is_file():
        return None
    saved = json.loads(recorded.read_text())
    if "shape" not in saved:  # brought up by an hpcbox before shapes: `up` replaces it
        return None
    shape = ClusterShape.from_dict(saved["shape"])
    # One brought up by an hpcbox before incarnations has none: its jobs are told from no other's.
    incarnation = Incarnation(**saved.get("incarnation", {"id": "", "up_at": ""}))
    spec = ClusterSpec(**saved["spec"])
    return Cluster(spec, saved["image"], ClusterSecrets(recorded.parent), shape, incarnation)


def shared_state(name: str, project_state: Path | None, *, say: Callable[[str], None] = print) -> Path:
    """The state root every command reaching cluster ``name`` reads its keys from (``spec.state_root``),
    once the keys an older hpcbox kept in this checkout (``project_state``, its .hpcbox) have moved
    there, where they are the keys of the cluster that exists under that name (``state.adopt``)."""
    root = state_root()
    legacy = legacy_state_dir(project_state, name) if project_state is not None else None
    target = state_dir(root, name)
    if legacy is None or not legacy.is_dir() or state.same_folder(legacy, target):
        return root  # the usual case: no file read, no Docker call
    from hpcbox.minicluster.lifecycle import login_host_key  # the engine, only where old keys move

    with state.locked(root, name, say):
        if state.adopt(legacy, target, login_host_key(name)):
            say(f"hpcbox: cluster {name}'s keys moved from {legacy} to {target}, for every project to find")
    return root
