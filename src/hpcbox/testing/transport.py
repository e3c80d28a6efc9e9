"""`MockTransport`: a login node in memory, beside the SSH master (`tools.ssh.Connection`) a `Site` talks
to by default, as httpx's MockTransport stands beside its real transports.

``Site(..., login=Target("login"), transport=MockTransport(handler))`` runs hpcbox's own code from the
call down to each command line a login node would be given, and ``handler`` answers in the cluster's
place: a unit test of what hpcbox does with what a cluster says (which command a task's `cancel` sends,
how many `squeue` a wait asks, what an answer that never comes does) runs in milliseconds, beside the
integration tests that prove the same on the mini cluster. A user's tests of their own code over `Site`
can use it the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc
from hpcbox.tools.ssh import Target, Transfer


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the login node answers a command: its output and exit status."""

    stdout: str = ""
    returncode: int = 0
    stderr: str = ""


Handler = Callable[[str], "Reply | str"]


class MockTransport:
    """A login node in memory: each command a connection runs goes to ``handler`` (the command line as
    the login's shell would get it), whose answer comes back as the command's (a `Reply`, or a string:
    its output, exit status 0); a handler that raises `tools.ssh.Unreachable` is a login node that
    stopped answering. What is uploaded is kept in ``files`` (remote path → bytes), where downloads
    read from; ``commands`` lists every command run, in order."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.files: dict[str, bytes] = {}
        self.commands: list[str] = []

    def __call__(self, target: Target, *, deadline: proc.Deadline | None = None) -> MockConnection:
        return MockConnection(self, target)


class MockConnection:
    """`tools.ssh.Connection`'s surface over a `MockTransport`."""

    def __init__(self, transport: MockTransport, target: Target) -> None:
        self.transport = transport
        self.target = target

    def __enter__(self) -> MockConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def seconds_left(self) -> float | None:
        return None

    def run(
        self,
        command: str | Sequence[str],
        *,
        what: str,
        check: bool = True,
        hint: str = "",
        input_bytes: bytes | None = None,
    ) -> proc.Completed:
        line = command if isinstance(command, str) else shlex.join(command)
        self.transport.commands.append(line)
        answer = self.transport.handler(line)
        reply = Reply(answer) if isinstance(answer, str) else answer
        argv = ("ssh", self.target.host, line)
        if check and reply.returncode != 0:
            raise proc.failure(what, reply.returncode, reply.stderr or reply.stdout, hint, argv)
        return proc.Completed(argv, reply.returncode, reply.stdout, reply.stderr)

    def stream(self, command: str, *, what: str, on_line: Callable[[str], None]) -> None:
        for line in self.run(command, what=what).stdout.splitlines():
            on_line(line)

    def upload(self, source: Path, remote_path: str, **_options: object) -> Transfer:
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        sent = 0
        for path in files:
            where = f"{remote_path}/{path.relative_to(source)}" if source.is_dir() else remote_path
            self.transport.files[where] = path.read_bytes()
            sent += path.stat().st_size
        return Transfer(sent=sent, received=0, literal=sent)

    def download(
        self, remote_path: str, local: Path, *, in_place: bool = False, **_options: object
    ) -> Transfer:
        folder = remote_path.rstrip("/") + "/"
        found = {path: data for path, data in self.transport.files.items() if path.startswith(folder)}
        for path, data in found.items():
            _write(local / path.removeprefix(folder), data)
        return Transfer(sent=0, received=sum(map(len, found.values())))

    def download_together(self, remote_paths: Sequence[str], local: Path, **options: object) -> Transfer:
        received = sum(
            self.download(path, local, **options).received if path.endswith("/") else self._fetch(path, local)
            for path in remote_paths
        )
        return Transfer(sent=0, received=received)

    def _fetch(self, path: str, local: Path) -> int:
        if path not in self.transport.files:
            return 0
        _write(local / Path(path).name, self.transport.files[path])
        return len(self.transport.files[path])

    @contextlib.contextmanager
    def lock(self, path: str, **_options: object) -> Iterator[None]:
        yield

    def forward(self, local_port: int, host: str, port: int) -> None:
        raise HpcboxError("a MockTransport forwards no ports", "test a forward on the mini cluster")

    def interactive(self, command: str) -> int:
        raise HpcboxError("a MockTransport has no terminal", "test a shell on the mini cluster")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
