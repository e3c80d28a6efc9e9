"""OpenSSH and rsync: the one place that runs `ssh`, `scp`, `rsync` and `ssh-keygen`.

A `Target` either names everything (key, pinned known_hosts: the mini cluster, whose host key is
generated at `up`) or leaves key, user, port and host keys to the user's own `~/.ssh/config`, so that
ProxyJump, Kerberos and site aliases work as they do for them. Host keys are always checked
(StrictHostKeyChecking=yes; a host not yet trusted is refused, never silently added).

A `Connection` runs every ssh and rsync of a command through one master connection (ControlMaster),
and leaves it for the next command: a command within CONTROL_PERSIST_S idle seconds of the last finds
it open and skips the handshake (and a second factor). Its socket is in this user's private folder
(files.private_folder), one per login (host, port, user, key, known hosts) and command running at once:
each command holds a master for itself while it runs (a flock'ed slot), so that commands run together
never share one connection (sshd allows MaxSessions sessions on one, 10 by default). However a command
ends, killed outright included, its master ends once CONTROL_PERSIST_S have passed since the last
session or forwarded connection through it ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import posixpath
import random
import re
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from hpcbox import files
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.tools import proc

INSTALL_HINT = "install the OpenSSH client (`apt-get install openssh-client`)"
RSYNC_HINT = "install rsync here (`apt-get install rsync`) and make sure the cluster has it too"
RSYNC_VANISHED = 24  # rsync's exit status where source files vanished between its listing and reading
# Within this many seconds a host that does not answer is reported, never waited on for longer.
CONNECT_TIMEOUT_S = 10
# How long a master connection stays with nothing going through it (ssh's ControlPersist): the next
# command within it skips the handshake, and none stays open, logged in, for longer. Only idle time counts:
# a session (`logs --follow`, a shell) or a connection through a forward (a notebook's browser) keeps
# it, and hpcbox's waits ask the cluster every few seconds. A command that leaves it idle for longer
# (the doctor's probe SIFs, where their helper image must be built first) makes its next ssh connect
# on its own: a key logs in again, a two-factor login cannot in batch mode.
CONTROL_PERSIST_S = 300


@dataclass(frozen=True)
class Target:
    """Where to log in. ``host`` may be an alias of ~/.ssh/config; None fields are left to that file.

    ``key_path`` and ``known_hosts``, when given, are the only key offered and the only host keys
    trusted (the mini cluster's generated ones).
    """

    host: str
    port: int | None = None
    user: str | None = None
    key_path: Path | None = None
    known_hosts: Path | None = None
    connect_timeout_s: int = CONNECT_TIMEOUT_S
    # What to do where it does not answer, where its owner knows better than "check that it is reachable".
    unreachable_hint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # ssh, scp and rsync would read either as an option (`-oProxyCommand=...`): never passed on.
        for name, value in (("host", self.host), ("user", self.user)):
            if value is not None and value.startswith("-"):
                raise FieldError(name, f"{value!r} begins with '-', which ssh would read as an option")

    @property
    def address(self) -> str:
        """user@host:port, each part where it is given ([host]:port for an IPv6 address)."""
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host and self.port else self.host
        port = f":{self.port}" if self.port else ""
        return f"{user}{host}{port}"


def options(target: Target, *, interactive: bool = False) -> list[str]:
    """The `-o` options shared by ssh, scp and rsync's ssh for ``target``.

    ``interactive`` lets ssh ask (a password, a second factor) on the user's terminal; otherwise it
    fails at once instead of waiting for an answer nobody will type.
    """
    settings: dict[str, str] = {}
    if target.key_path is not None:
        settings |= {"IdentityFile": str(target.key_path), "IdentitiesOnly": "yes", "IdentityAgent": "none"}
    if target.known_hosts is not None:
        settings |= {"UserKnownHostsFile": str(target.known_hosts), "GlobalKnownHostsFile": "/dev/null"}
    settings |= {
        "StrictHostKeyChecking": "yes",
        "BatchMode": "no" if interactive else "yes",
        "ConnectTimeout": str(target.connect_timeout_s),
        "ServerAliveInterval": "15",
        "ServerAliveCountMax": "3",
        "LogLevel": "ERROR",
    }
    if target.key_path is not None:
        settings["PasswordAuthentication"] = "no"
    if target.user:
        settings["User"] = target.user
    if target.port:
        settings["Port"] = str(target.port)
    return [arg for key, value in settings.items() for arg in ("-o", f"{key}={value}")]


def ssh_argv(
    target: Target,
    command: str | Sequence[str] | None = None,
    *,
    tty: bool = False,
    control_path: Path | None = None,
) -> list[str]:
    """argv of `ssh` to ``target`` running ``command`` (a shell string, or argv quoted with shlex)."""
    argv = [proc.require("ssh", INSTALL_HINT), *options(target, interactive=tty)]
    if control_path is not None:
        argv += ["-o", f"ControlPath={control_path}", "-o", "ControlMaster=no"]
    argv.append("-t" if tty else "-T")
    argv.append(target.host)
    if command is not None:
        argv.append(command if isinstance(command, str) else shlex.join(command))
    return argv


def run(
    target: Target,
    command: str | Sequence[str],
    *,
    what: str = "",
    check: bool = True,
    hint: str = "",
) -> proc.Completed:
    """Run ``command`` on ``target`` and capture its output; with ``check``, failure raises."""
    return proc.run(
        ssh_argv(target, command),
        what=what or f"run a command on {target.address}",
        hint=hint or f"check that {target.address} is reachable and accepts {target.key_path}",
        check=check,
    )


def copy_to(target: Target, sources: Sequence[Path], remote_dir: str, *, what: str = "") -> None:
    """`scp -r` local ``sources`` into ``remote_dir`` on ``target``."""
    if not sources:
        raise HpcboxError("nothing to copy", "name at least one file or folder")
    argv = [proc.require("scp", INSTALL_HINT), *options(target), "-r", "-q"]
    argv += [str(source) for source in sources]
    argv.append(f"{target.host}:{remote_dir}")
    proc.run(argv, what=what or f"copy files to {target.address}:{remote_dir}")


def keygen(path: Path, comment: str) -> str:
    """A new passphrase-less ed25519 key pair at ``path`` (+ ``.pub``); returns the public key line."""
    if path.exists() or Path(f"{path}.pub").exists():
        raise HpcboxError(f"refusing to overwrite the existing key {path}", "remove it first if it is unused")
    program = proc.require("ssh-keygen", INSTALL_HINT)
    proc.run(
        [program, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        what=f"generate an SSH key at {path}",
    )
    return Path(f"{path}.pub").read_text().strip()


def known_hosts_line(host: str, port: int, public_key: str) -> str:
    """A known_hosts entry for ``host:port`` (bracketed form for a non-default port), without comment."""
    key_type, key_data = public_key.split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key_type} {key_data}"


@dataclass(frozen=True)
class Transfer:
    """What one rsync moved: bytes sent and received over the wire, and of the files' bytes, how many
    went as literal data and how many the receiver already had (its --stats)."""

    sent: int
    received: int
    literal: int = 0
    matched: int = 0

    def __add__(self, other: Transfer) -> Transfer:
        """Two transfers' bytes together (several rsyncs of one fetch or watch)."""
        return Transfer(
            self.sent + other.sent,
            self.received + other.received,
            self.literal + other.literal,
            self.matched + other.matched,
        )


_STAT = re.compile(
    r"^(Total bytes sent|Total bytes received|Literal data|Matched data): ([\d,]+)", re.MULTILINE
)
_STAT_FIELDS = {
    "Total bytes sent": "sent",
    "Total bytes received": "received",
    "Literal data": "literal",
    "Matched data": "matched",
}


def parse_rsync_stats(lines: Sequence[str]) -> Transfer:
    found = {
        _STAT_FIELDS[name]: int(number.replace(",", "")) for name, number in _STAT.findall("\n".join(lines))
    }
    return Transfer(**{field: found.get(field, 0) for field in _STAT_FIELDS.values()})


# sshd drops connections beyond its MaxStartups (by default, at random once 10 are unauthenticated at
# once) before the key exchange: many hpcbox commands at once see this, or a busy login node. Such a
# drop is worth another try; a refused key or an unknown host key is not.
DROPPED_BEFORE_KEX = (
    "kex_exchange_identification",
    "ssh_exchange_identification",
    "Connection closed by remote host",
    "Connection reset by peer",
)
CONNECT_ATTEMPTS = 5
CONNECT_BACKOFF_S = 0.5
# What ssh says where the login node does not answer or went away (the network, the node down or
# rebooting), as against a login it refuses (a key, a host key): waiting may mend the former.
NOT_ANSWERING = (
    *DROPPED_BEFORE_KEX, "Connection refused", "Connection timed out", "Operation timed out",
    "No route to host", "Network is unreachable", "Could not resolve hostname", "Broken pipe",
    "Connection closed by", "Connection to", "Control socket connect",
)  # fmt: skip
# ssh's own exit status: it could not reach, or lost, the remote side.
SSH_FAILED = 255


class Unreachable(HpcboxError):
    """The login node did not answer, or stopped answering: what it was asked was not done there.
    A wait rides it out for a while (`slurm.poll`)."""


def not_answering(said: str) -> bool:
    """Whether ssh's message ``said`` is of a login node that does not answer (NOT_ANSWERING)."""
    return any(words in said for words in NOT_ANSWERING)


def end_idle_masters(target: Target) -> None:
    """End the masters left open for ``target`` that no running command holds: the next command logs in
    afresh, as it must once what a login gets has changed on the login node (the user's groups)."""
    folder, name = files.private_folder(), _login_name(target)
    slot = 0
    while (folder / f"{name}-{slot}.lock").exists():
        held = _claimed(folder / f"{name}-{slot}.lock")
        if held is not None:  # else a running command's: it ends with that command's idle time
            with held:
                _ask_master(
                    folder / f"{name}-{slot}", target, ["-O", "exit"], what="end an idle SSH connection"
                )
        slot += 1


def _claimed(lock: Path) -> IO[str] | None:
    """``lock`` opened and flock'ed for this process (freed when it is closed or the process ends,
    however it ends), or None where another process holds it."""
    handle = open(lock, "a")  # noqa: SIM115  (the caller holds it)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _ask_master(
    control_path: Path,
    target: Target,
    request: list[str],
    *,
    what: str,
    check: bool = False,
    timeout_s: float | None = None,
) -> proc.Completed:
    """Ask the master connection at ``control_path`` itself (`ssh -O ...`)."""
    argv = [proc.require("ssh", INSTALL_HINT), "-o", f"ControlPath={control_path}", *request, target.host]
    return proc.run(argv, what=what, check=check, timeout_s=timeout_s)


def _login_name(target: Target) -> str:
    """`ssh-<12 hex>`: the masters' name for ``target``'s login."""
    # The pinned host keys' content too: a mini cluster made again where the last one was (its port,
    # its key's path) is another login, and a master left for the last one is not its.
    pinned = target.known_hosts.read_bytes() if target.known_hosts and target.known_hosts.is_file() else b""
    login = (target.host, target.port, target.user, target.key_path, target.known_hosts, pinned)
    return f"ssh-{hashlib.sha256(repr(login).encode()).hexdigest()[:12]}"


def _master_slot(target: Target) -> tuple[IO[str], Path]:
    """The first master slot for ``target`` that no running command holds, flock'ed (freed when the
    process ends, however it ends), and its socket's path: `ssh-<login>-<n>` in the private folder."""
    folder = files.private_folder()
    name = _login_name(target)
    slot = 0
    while (held := _claimed(folder / f"{name}-{slot}.lock")) is None:
        slot += 1
    return held, folder / f"{name}-{slot}"


class Connection:
    """A master connection to ``target`` for the life of a `with` block, found open (left by an earlier
    command) or opened; every `run`, `stream` and rsync inside it goes through it, and it stays open
    after the block for the next command (CONTROL_PERSIST_S idle seconds at most).

    Opening it is where a host that is down, a refused key or an unknown host key shows up, as one
    error within about ``connect_timeout_s``; the master asks for a password or second factor on the
    terminal when there is one (and fails at once when there is not). A connection sshd drops before
    the key exchange (DROPPED_BEFORE_KEX) is tried again, CONNECT_ATTEMPTS times in all.

    With a ``deadline``, opening it, each `run` and `stream`, and each upload and download get the time
    left as their limit, and are killed at it (proc.TimedOut): together they end by the deadline. The
    time ssh spends asking on the terminal (a password, a second factor) is the user's and not
    counted. `lock`, `interactive` and `forward` are not bounded by it.
    """

    def __init__(self, target: Target, *, deadline: proc.Deadline | None = None) -> None:
        self.target = target
        self.deadline = deadline
        self._slot: IO[str] | None = None
        self._path: Path | None = None
        self._forwards: list[str] = []
        self._own_group = False  # within `uninterrupted`

    @property
    def control_path(self) -> Path:
        if self._path is None:
            raise HpcboxError("the SSH connection is not open", "use it inside `with Connection(...)`")
        return self._path

    def __enter__(self) -> Connection:
        self._slot, self._path = _master_slot(self.target)
        try:
            self._master_up()
        except BaseException:
            self._release()
            raise
        return self

    def _master_up(self) -> None:
        """The master answering at the connection's socket, opened again where it has ended."""
        assert self._path is not None  # within the `with` block
        if not self._master_answers():
            self._path.unlink(missing_ok=True)  # the socket of a master that has ended
            self._open_master()

    def _master_answers(self) -> bool:
        """Whether a master listens at the connection's socket: a connect to it, where `ssh -O check`
        would start a process for every command and every connection a command opens."""
        limit = self._limit()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(None if limit is None else max(limit, 0.0))  # a stopped master: the deadline's
            try:
                probe.connect(str(self.control_path))
            except OSError:  # no socket, one whose master has ended, or none answering in time
                return False
        return True

    def _open_master(self) -> None:
        interactive = sys.stdin.isatty()
        argv = [proc.require("ssh", INSTALL_HINT), *options(self.target, interactive=interactive)]
        argv += ["-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=yes"]
        argv += ["-o", f"ControlPersist={CONTROL_PERSIST_S}", "-f", "-N", self.target.host]
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            started = time.monotonic()
            try:
                proc.run(
                    argv,
                    what=f"connect to {self.target.address}",
                    hint=self._hint(),
                    timeout_s=None if interactive else self._limit(self.target.connect_timeout_s + 5),
                )
                if interactive and self.deadline is not None:
                    self.deadline = self.deadline.later_by(time.monotonic() - started)
                return
            except HpcboxError as failed:
                said = f"{failed.message}\n{failed.details}"
                if attempt == CONNECT_ATTEMPTS or not any(words in said for words in DROPPED_BEFORE_KEX):
                    if isinstance(failed, proc.TimedOut) or not_answering(said):
                        hint = self.target.unreachable_hint or failed.hint
                        raise Unreachable(failed.message, hint, failed.details) from failed
                    raise
                # Spread out, so that many commands dropped together do not all come back together.
                time.sleep(CONNECT_BACKOFF_S * 2 ** (attempt - 1) * random.uniform(1, 2))

    def __exit__(self, *exc_info: object) -> None:
        if self._path is None:
            return
        # The master stays for the next command; what this one forwarded through it does not.
        for spec in self._forwards:
            _ask_master(
                self.control_path, self.target, ["-O", "cancel", "-L", spec], what=f"end the forward {spec}"
            )
        self._release()

    def _release(self) -> None:
        if self._slot is not None:
            self._slot.close()  # frees the slot's flock for the next command
        self._slot, self._path, self._forwards = None, None, []

    def _limit(self, seconds: float | None = None) -> float | None:
        """``seconds`` (None: no limit), or the time left to the deadline where that is less."""
        if self.deadline is None:
            return seconds
        return self.deadline.left() if seconds is None else min(seconds, self.deadline.left())

    def seconds_left(self) -> float | None:
        """The time left to the deadline; None without one."""
        return self._limit()

    def _hint(self) -> str:
        key = f" and accepts {self.target.key_path}" if self.target.key_path else ""
        return (
            f"check that {self.target.address} is reachable{key}: try `ssh {self.target.host}` yourself "
            "(host, user and key come from the cluster profile, flags and ~/.ssh/config)"
        )

    def argv(self, command: str | Sequence[str], *, tty: bool = False) -> list[str]:
        return ssh_argv(self.target, command, tty=tty, control_path=self.control_path)

    @contextlib.contextmanager
    def uninterrupted(self, until_again: Callable[[str], None]) -> Iterator[list[str]]:
        """The block's `run`s finish whatever Ctrl-C, SIGTERM or SIGHUP comes meanwhile: the signal is held
        (its name into the list yielded, for the caller to act on once the block has done what must
        not be cut short: a job sbatch'ed and recorded), and ssh runs in a process group of its own,
        which the terminal's Ctrl-C does not reach. Otherwise a Ctrl-C while sbatch runs on the login
        node ends ssh, not sbatch: the job runs, and nobody here knows its id. ``until_again`` is told
        the first signal held; a second acts at once (`proc.signals_held`)."""
        with proc.signals_held(until_again=until_again) as held:
            self._own_group = True
            try:
                yield held
            finally:
                self._own_group = False

    def run(
        self,
        command: str | Sequence[str],
        *,
        what: str,
        check: bool = True,
        hint: str = "",
        input_bytes: bytes | None = None,
    ) -> proc.Completed:
        """Run ``command`` (a shell string, or argv) on the remote side and capture its output; where
        the login node stopped answering, Unreachable, whatever ``check``."""
        argv = self.argv(command)
        done = proc.run(
            argv, what=what, hint=hint, check=False, input_bytes=input_bytes, timeout_s=self._limit(),
            own_group=self._own_group,
        )  # fmt: skip
        if done.returncode == SSH_FAILED and not_answering(done.stderr):
            failed = proc.failure(what, done.returncode, done.stderr, self._hint(), argv)
            raise Unreachable(failed.message, failed.hint, failed.details)
        if check and done.returncode != 0:
            raise proc.failure(what, done.returncode, done.stderr or done.stdout, hint, argv)
        return done

    def forward(self, local_port: int, host: str, port: int) -> None:
        """Forward 127.0.0.1:``local_port`` here to ``host``:``port`` as the remote side reaches it, for
        as long as the connection is open."""
        spec = f"127.0.0.1:{local_port}:{host}:{port}"
        # A forward needs the master, which ends once idle for CONTROL_PERSIST_S: a notebook's image
        # built and converted after the connection opened takes longer than that on a busy machine.
        self._master_up()
        _ask_master(
            self.control_path, self.target, ["-O", "forward", "-L", spec], what=f"forward {spec}", check=True
        )
        self._forwards.append(spec)

    def interactive(self, command: str) -> int:
        """Run ``command`` remotely on the user's own terminal (ssh -t); its exit status."""
        return proc.interactive(self.argv(command, tty=True))

    def stream(self, command: str, *, what: str, on_line: Callable[[str], None]) -> None:
        """Run ``command`` remotely, handing each line of its output to ``on_line`` as it arrives."""
        proc.stream(self.argv(command), what=what, on_line=on_line, tail_lines=5, timeout_s=self._limit())

    def _rsync(
        self,
        sources: Sequence[str],
        destination: str,
        *,
        what: str,
        on_progress: Callable[[str], None] | None,
        extra: Sequence[str] = (),
        passing: Collection[int] = (0,),
    ) -> Transfer:
        rsync = proc.require("rsync", RSYNC_HINT)
        shell = shlex.join([proc.require("ssh", INSTALL_HINT), *options(self.target)])
        shell += f" -o ControlPath={shlex.quote(str(self.control_path))} -o ControlMaster=no"
        argv = [rsync, "--archive", "--partial", "--stats", "--rsh", shell, *extra]
        if on_progress is not None:
            argv.append("--info=progress2")
        try:
            lines = proc.stream(
                [*argv, *sources, destination],
                what=what,
                hint=RSYNC_HINT,
                on_line=lambda line: on_progress(line.strip()) if on_progress and "%" in line else None,
                tail_lines=40,
                carriage_returns=True,
                timeout_s=self._limit(),
                passing=passing,
            )
        except proc.TimedOut:
            raise
        except HpcboxError as failed:  # rsync's ssh lost the login node: as `run` says it
            if not_answering(f"{failed.message}\n{failed.details}"):
                raise Unreachable(failed.message, self._hint(), failed.details) from failed
            raise
        return parse_rsync_stats(lines)

    def upload(
        self,
        source: Path,
        remote_path: str,
        *,
        on_progress: Callable[[str], None] | None = None,
        against_basis: bool = False,
        chmod: str = "D700,F600",
    ) -> Transfer:
        """rsync ``source`` (a file, or a folder's contents with a trailing /) to ``remote_path``, with
        the modes ``chmod`` (rsync's --chmod; by default the user's alone) and the group a new file
        gets there (the user's, or a set-group-id folder's), whatever its mode and group are here.

        --partial keeps what arrived of an interrupted upload, so the next try sends only the rest.
        Whatever is at ``remote_path`` already is rsync's basis: only the blocks it lacks are sent.
        rsync writes the result to a new file and renames it over ``remote_path``, never into the
        basis itself, so a basis linked there from elsewhere is left as it was (and --inplace would
        lose every block that moved to a later offset: bench/results/delta.json measures both).
        ``against_basis``: the file there is another file, which may have the same size and
        time as ``source``: compare the contents always.
        """
        name = str(source) + ("/" if source.is_dir() else "")
        extra = ["--no-group", f"--chmod={chmod}", *(["--ignore-times"] if against_basis else [])]
        return self._rsync(
            [name],
            f"{self.target.host}:{remote_path}",
            what=f"upload {source.name} to {self.target.address}",
            on_progress=on_progress,
            extra=extra,
        )

    @contextlib.contextmanager
    def lock(
        self, path: str, *, on_wait: Callable[[], None] | None = None, umask: str = "077"
    ) -> Iterator[None]:
        """Hold an exclusive flock(1) on the remote file ``path`` (created if missing, as its folder,
        under ``umask``) for the block.

        The lock lives in a remote shell that ends when its stdin closes: leaving the block, or this
        process or its connection dying, releases it. ``on_wait`` is called once if another holder
        makes this one wait. A cluster without flock(1) runs the block unlocked.
        """
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        script = (
            f"umask {shlex.quote(umask)} && mkdir -p {shlex.quote(folder)} && exec 9>>{shlex.quote(path)} "
            "|| exit 1; "
            "if command -v flock >/dev/null 2>&1; then flock -n 9 || { echo waiting; flock 9; }; fi; "
            "echo locked; exec cat >/dev/null"
        )
        with proc.held(
            self.argv(script),
            what=f"lock {path} on {self.target.address}",
            hint=self._hint(),
            ready="locked",
            on_line=lambda line: on_wait() if on_wait is not None and line == "waiting" else None,
        ):
            yield

    def download(
        self, remote_path: str, local: Path, *, in_place: bool = False, growing: Sequence[str] = ()
    ) -> Transfer:
        """rsync ``remote_path`` (a folder's contents with a trailing /) into ``local``; resumable.
        ``in_place``: each changed file updated where it is, not replaced by a new one, so that a reader
        holding it open (TensorBoard over a job's event files) sees what was appended. ``growing``: the
        names (rsync patterns) of files that only ever grow, each sent as the bytes past its copy here
        (`--append-verify`: one that changed otherwise fails its whole-file check and comes again whole)
        in a transfer of their own, where rsync's delta would first send a checksum of every block of
        the file here (53 KB for 4 KB appended to 20 MB: bench/results/watch.json).

        A folder a job still writes in loses files while rsync reads it (a checkpoint written aside and
        renamed, the job script's temporary files): rsync then ends with RSYNC_VANISHED, having brought
        everything that stayed, which is a download, not a failure (a full run's executor test fetched a
        20-task array as its first task ended, the others still writing)."""
        local.mkdir(parents=True, exist_ok=True)
        source, what = (
            [f"{self.target.host}:{remote_path}"],
            f"download {remote_path} from {self.target.address}",
        )
        appended = Transfer(0, 0)
        if growing:
            only = [
                "--prune-empty-dirs",
                "--include=*/",
                *(f"--include={name}" for name in growing),
                "--exclude=*",
            ]
            appended = self._rsync(
                source, str(local) + "/", what=what, on_progress=None, extra=[*only, "--append-verify"],
                passing=(0, RSYNC_VANISHED),
            )  # fmt: skip
        rest = self._rsync(
            source,
            str(local) + "/",
            what=what,
            on_progress=None,
            extra=[*(f"--exclude={name}" for name in growing), *(["--inplace"] if in_place else [])],
            passing=(0, RSYNC_VANISHED),
        )
        return appended + rest

    def download_together(
        self, remote_paths: Sequence[str], local: Path, *, in_place: bool = False
    ) -> Transfer:
        """rsync each of ``remote_paths`` (absolute: a file, or a folder's contents with a trailing /) into
        ``local``, side by side, in one transfer however many they are (``in_place`` as `download`'s):
        their list goes to rsync as --files-from, since the remote side of rsync takes only so many paths
        as arguments (a thousand array tasks' logs are too many); in it a `/./` marks where each path
        here begins. A folder still written in that loses files meanwhile is fetched as `download` says."""
        local.mkdir(parents=True, exist_ok=True)
        entries = [
            f"{path.rstrip('/')}/./"
            if path.endswith("/")
            else f"{posixpath.dirname(path)}/./{posixpath.basename(path)}"
            for path in remote_paths
        ]
        with tempfile.NamedTemporaryFile("w", prefix="hpcbox-files-", suffix=".txt") as listing:
            listing.write("".join(f"{entry}\n" for entry in entries))
            listing.flush()
            return self._rsync(
                [f"{self.target.host}:/"],
                str(local) + "/",
                what=f"download {len(remote_paths)} paths from {self.target.address}",
                on_progress=None,
                extra=[f"--files-from={listing.name}", "--recursive", *(["--inplace"] if in_place else [])],
                passing=(0, RSYNC_VANISHED),
            )


class Transport(Protocol):
    """What opens a connection to a login node for a `with` block: `Connection` (the SSH master), or a
    stand-in with its surface (`hpcbox.testing.MockTransport`, a login node in memory)."""

    def __call__(self, target: Target, *, deadline: proc.Deadline | None = None) -> Connection: ...


def progress_printer(
    total: int, write: Callable[[str], None] | None = None, *, against_basis: bool = False
) -> Callable[[str], None]:
    """An rsync --info=progress2 line handler that prints bytes, rate and ETA at most every 2 s.

    ``against_basis``: rsync's count is of the file's bytes in place on the cluster, most of them
    taken from the basis there, not sent: said so, and no rate, which would be no network's."""
    out = write or (lambda text: print(text, file=sys.stderr, flush=True))
    last = [0.0]
    finished = [False]

    def show(line: str) -> None:
        now = time.monotonic()
        done = "100%" in line
        if finished[0] or (now - last[0] < 2 and not done):
            return
        last[0], finished[0] = now, done
        fields = line.split()
        if len(fields) < 4:
            return
        # At 100 % rsync's last field is the time the file took, not the time left.
        when = f"in {fields[3]}" if done else f"ETA {fields[3]}"
        if against_basis:
            out(f"  {fields[0]} of {total:,} bytes in place ({fields[1]}), {when}")
        else:
            out(f"  {fields[0]} of {total:,} bytes ({fields[1]}), {fields[2]}, {when}")

    return show
