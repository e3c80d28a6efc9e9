"""The SSH master connection against the mini cluster's real sshd: it outlives a session longer than its
idle bound (ControlPersist counts only the time nothing goes through it), and the master of a command
killed outright (SIGKILL: no `ssh -O exit`) ends by itself once that bound has passed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
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


def test_a_killed_commands_master_ends_once_idle_for_its_bound_and_not_while_in_use(minicluster):
    target = minicluster.ssh_target()
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
            subprocess.run(["rm", "-rf", str(Path(control_path).parent)], check=False)
