"""OpenSSH: the one place that runs `ssh`, `scp` and `ssh-keygen`.

Every connection pins the host key: StrictHostKeyChecking=yes against a known_hosts file the caller
names (for the mini cluster, one written from the host key generated at `up`), key-only auth, no
agent, no prompts.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc

INSTALL_HINT = "install the OpenSSH client (`apt-get install openssh-client`)"


@dataclass(frozen=True)
class Target:
    """Where to log in: ``user@host:port`` with ``key_path``, trusting only the keys in ``known_hosts``."""

    host: str
    port: int
    user: str
    key_path: Path
    known_hosts: Path
    connect_timeout_s: int = 10

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def options(target: Target) -> list[str]:
    """The `-o` options shared by ssh and scp for ``target``."""
    settings = {
        "IdentityFile": str(target.key_path),
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "UserKnownHostsFile": str(target.known_hosts),
        "GlobalKnownHostsFile": "/dev/null",
        "StrictHostKeyChecking": "yes",
        "BatchMode": "yes",
        "PasswordAuthentication": "no",
        "ConnectTimeout": str(target.connect_timeout_s),
        "ServerAliveInterval": "15",
        "LogLevel": "ERROR",
        "User": target.user,
    }
    return [arg for key, value in settings.items() for arg in ("-o", f"{key}={value}")]


def ssh_argv(target: Target, command: str | Sequence[str] | None = None, *, tty: bool = False) -> list[str]:
    """argv of `ssh` to ``target`` running ``command`` (a shell string, or argv quoted with shlex)."""
    argv = [proc.require("ssh", INSTALL_HINT), *options(target), "-p", str(target.port)]
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
    argv = [proc.require("scp", INSTALL_HINT), *options(target), "-P", str(target.port), "-r", "-q"]
    argv += [str(source) for source in sources]
    argv.append(f"{target.host}:{remote_dir}")
    proc.run(argv, what=what or f"copy files to {target.address}:{remote_dir}")


def copy_from(target: Target, remote_path: str, local_dir: Path, *, what: str = "") -> None:
    """`scp -r` ``remote_path`` on ``target`` into ``local_dir``."""
    argv = [proc.require("scp", INSTALL_HINT), *options(target), "-P", str(target.port), "-r", "-q"]
    argv += [f"{target.host}:{remote_path}", str(local_dir)]
    proc.run(argv, what=what or f"copy {target.address}:{remote_path} here")


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
