"""The SSH master connection against the mini cluster's real sshd: the next command finds the last one's
master and uses it (commands at once each hold one of their own); it outlives a session longer than its
idle bound (ControlPersist counts only the time nothing goes through it), and the master of a command
killed outright (SIGKILL: no clean end) ends by itself once that bound has passed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

BOUND_S = 3

# A command that opens a connection, runs one session longer than the bound through it, and is then
# killed without closing it.
COMMAND = """
import sys, time
from pathlib import Path
from hpcbox.tools import ssh

ssh.CONTROL_PERSIST_S = int(sys.argv[1])
target = ssh.Target("127.0.0.1", int(sys.argv[2]), "researcher", Path(sys.argv[3]), Path(sys.argv[4]))
connection = ssh.Connection(target).__enter__()
print(connection.control_path, flush=True)
connection.run(["sleep", str(3 * ssh.CONTROL_PERSIST_S)], what="a session longer than the bound")
print("ran", flush=True)
time.sleep(600)
"""


def _master(control_path: str) -> int | None:
    """The pid of the master serving ``control_path``, or None where none answers there."""
    done = subprocess.run(
        ["ssh", "-o", f"ControlPath={control_path}", "-O", "check", "mini"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"pid=(\d+)", done.stderr)
    return int(found.group(1)) if done.returncode == 0 and found else None


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie nobody reaps here has ended all the same


def _own_tmpdir() -> str:
    """A short folder of the test's own as TMPDIR (a socket's path is limited to about 100 bytes), so
    that its masters are its own, whatever masters other tests left for the same cluster."""
    return tempfile.mkdtemp(prefix="hpcbox-mt-", dir="/tmp")


def test_a_killed_commands_master_ends_once_idle_for_its_bound_and_not_while_in_use(minicluster):
    target = minicluster.ssh_target()
    private = _own_tmpdir()
    command = subprocess.Popen(
        [
            sys.executable,
            "-c",
            COMMAND,
            str(BOUND_S),
            str(target.port),
            str(target.key_path),
            str(target.known_hosts),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": private},
    )
    control_path = ""
    try:
        assert command.stdout is not None
        control_path = command.stdout.readline().strip()
        assert control_path, command.stderr.read() if command.poll() is not None else "no control path"
        # The session ran three times the bound through the master, which was in use all along.
        assert command.stdout.readline().strip() == "ran", command.stderr.read() if command.poll() else ""
        master = _master(control_path)
        assert master is not None and _running(master)
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=10)
        deadline = time.monotonic() + BOUND_S + 20
        while _running(master) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _running(master), f"the master {master} outlived its bound of {BOUND_S} s"
        assert _master(control_path) is None and not os.path.exists(control_path)
    finally:
        if command.poll() is None:
            command.kill()
        if control_path:
            subprocess.run(["ssh", "-o", f"ControlPath={control_path}", "-O", "exit", "mini"], check=False)
        shutil.rmtree(private, ignore_errors=True)


# A command that opens a connection, says its socket and its master's pid, runs one session, and ends
# cleanly once it reads a line (or at once, given "now").
NEXT_COMMAND = """
import subprocess, sys
from pathlib import Path
from hpcbox.tools import ssh

target = ssh.Target("127.0.0.1", int(sys.argv[1]), "researcher", Path(sys.argv[2]), Path(sys.argv[3]))
with ssh.Connection(target) as connection:
    connection.run(["true"], what="one session")
    print(connection.control_path, flush=True)
    if sys.argv[4] != "now":
        sys.stdin.readline()
"""


def test_the_next_command_uses_the_last_ones_master_and_commands_at_once_hold_one_each(minicluster):
    target = minicluster.ssh_target()
    private = _own_tmpdir()

    def command(when: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", NEXT_COMMAND, str(target.port), str(target.key_path),
             str(target.known_hosts), when],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TMPDIR": private},
        )  # fmt: skip

    def socket_of(started: subprocess.Popen) -> str:
        assert started.stdout is not None
        path = started.stdout.readline().strip()
        assert path, started.communicate(timeout=30)[1]
        return path

    paths: set[str] = set()
    try:
        first = command("now")
        paths.add(first_path := socket_of(first))
        assert first.wait(timeout=30) == 0
        master = _master(first_path)
        assert master is not None, "the first command's master did not stay for the next"
        folder = Path(first_path).parent
        assert folder == Path(private) / f"hpcbox-{os.getuid()}" and folder.stat().st_mode & 0o777 == 0o700

        held = command("later")  # runs on, holding the master it found
        paths.add(held_path := socket_of(held))
        assert held_path == first_path and _master(held_path) == master

        beside = command("now")  # while the other runs: a master of its own, not a shared one
        paths.add(beside_path := socket_of(beside))
        assert beside.wait(timeout=30) == 0
        assert beside_path != first_path
        assert (other := _master(beside_path)) is not None and other != master

        held.communicate("\n", timeout=30)
        assert held.returncode == 0
        assert _master(first_path) == master and _master(beside_path) == other  # both kept for the next
    finally:
        for path in paths:
            subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "mini"], check=False)
        shutil.rmtree(private, ignore_errors=True)


# A command that opens a connection, leaves its master idle past its bound, then forwards a port
# through it and reaches the login's sshd there.
FORWARD_COMMAND = """
import socket, sys, time
from pathlib import Path
from hpcbox.tools import proc, ssh

ssh.CONTROL_PERSIST_S = 1
target = ssh.Target("127.0.0.1", int(sys.argv[1]), "researcher", Path(sys.argv[2]), Path(sys.argv[3]))
with ssh.Connection(target) as connection:
    deadline = time.monotonic() + 60
    while ssh._ask_master(connection.control_path, target, ["-O", "check"], what="check").returncode == 0:
        assert time.monotonic() < deadline, "the master outlived its bound"
        time.sleep(0.5)
    port = proc.free_local_port()
    connection.forward(port, "127.0.0.1", 22)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as forwarded:
        print(forwarded.recv(64).decode().splitlines()[0], flush=True)
"""


def test_a_forward_through_a_master_that_ended_while_idle_opens_it_again(minicluster):
    """Found under load (a notebook's image built for five minutes after its connection opened): the
    master had ended at its idle bound, and `-O forward` found no socket."""
    target = minicluster.ssh_target()
    private = _own_tmpdir()
    try:
        done = subprocess.run(
            [sys.executable, "-c", FORWARD_COMMAND, str(target.port), str(target.key_path),
             str(target.known_hosts)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": private}, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("SSH-2.0-"), done.stdout  # the login's sshd, through the forward
    finally:
        shutil.rmtree(private, ignore_errors=True)
