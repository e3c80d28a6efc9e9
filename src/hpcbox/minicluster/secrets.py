"""Secrets of one mini cluster, made fresh at each `up` and kept only under its state dir (mode 0600).

Nothing here goes into an image: `up` copies these files into the containers before they start.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from hpcbox.minicluster.spec import USER, ClusterSpec
from hpcbox.tools import ssh

MUNGE_KEY_BYTES = 1024


@dataclass(frozen=True)
class ClusterSecrets:
    directory: Path

    @property
    def munge_key(self) -> Path:
        return self.directory / "munge.key"

    @property
    def user_key(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def host_key(self) -> Path:
        return self.directory / "ssh_host_ed25519_key"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def db_password(self) -> Path:
        return self.directory / "db_password"

    def public(self, key: Path) -> str:
        return Path(f"{key}.pub").read_text().strip()


def generate(spec: ClusterSpec, directory: Path) -> ClusterSecrets:
    """Fresh secrets for ``spec`` in ``directory`` (replacing any old ones there)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True, mode=0o700)
    made = ClusterSecrets(directory)
    _write_private(made.munge_key, os.urandom(MUNGE_KEY_BYTES))
    _write_private(made.db_password, secrets.token_hex(24).encode())
    ssh.keygen(made.user_key, f"{USER}@{spec.name}")
    ssh.keygen(made.host_key, f"login.{spec.name}")
    line = ssh.known_hosts_line("127.0.0.1", spec.port, made.public(made.host_key))
    _write_private(made.known_hosts, (line + "\n").encode())
    return made


def _write_private(path: Path, content: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
