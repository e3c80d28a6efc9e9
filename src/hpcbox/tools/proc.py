"""Running external programs: the one place subprocess is called."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from hpcbox.errors import HpcboxError

TAIL_LINES = 25


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class TimedOut(HpcboxError):
    """A program killed at its time limit; ``output``: what it had printed by then."""

    def __init__(self, message: str, hint: str = "", *, output: str = "") -> None:
        super().__init__(message, hint)
        self.output = output


@dataclass(frozen=True)
class Deadline:
    """An instant on the monotonic clock that a run of programs must end by: each program gets the
    time left (`left`) as its own time limit, so that together they end by it."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        """The seconds left, never below 0 (a program then gets no time)."""
        return max(0.0, self.at - time.monotonic())

    def later_by(self, seconds: float) -> Deadline:
        return Deadline(self.at + seconds)


def require(program: str, hint: str) -> str:
    """Absolute path of ``program`` on PATH, or an HpcboxError naming how to get it."""
    path = shutil.which(program)
    if path is None:
        raise HpcboxError(f"`{program}` is not installed or not on PATH", hint)
    return path


@contextlib.contextmanager
def signals_held(*, until_again: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """SIGINT, SIGTERM and SIGHUP (a terminal closed) noted (their names into the list yielded), not
    acted on, inside the block; in the main thread only (elsewhere Python delivers no signal), and not
    one this process ignores (started in the background, or by nohup). With ``until_again``, told the
    first one's name, a second acts at once as it would have outside: a user who insists is not kept
    waiting on what hangs."""
    held: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {
        signum: handler
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        if (handler := signal.getsignal(signum)) is not signal.SIG_IGN
    }

    def note(signum: int, frame: FrameType | None) -> None:
        held.append(signal.Signals(signum).name)
        if until_again is None:
            return
        if len(held) == 1:
            with contextlib.suppress(OSError):  # told on a terminal that is gone (SIGHUP)
                until_again(held[0])
            return
        for watched_signum, handler in previous.items():
            signal.signal(watched_signum, handler)
        signal.raise_signal(signum)

    for signum in previous:
        signal.signal(signum, note)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(
    argv: Sequence[str],
    *,
    what: str,
    hint: str = "",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdin: IO[bytes] | None = None,
    input_bytes: bytes | None = None,
    check: bool = True,
    timeout_s: float | None = None,
    own_group: bool = False,
) -> Completed:
    """Run ``argv`` to completion, capturing output; on failure raise with its stderr tail.

    ``timeout_s`` bounds the wait: past it the program is killed and that is the failure reported.
    ``own_group``: in a process group of its own, which the terminal's Ctrl-C does not reach: this
    process decides (it is killed where this process is interrupted, and finishes where the
    interrupt is held, `signals_held`).
    """
    try:
        proc = subprocess.run(
            list(argv),
            env=env,
            cwd=cwd,
            # Never the caller's own: `while read job; do hpcbox status -j $job; done < jobs.txt`
            # would lose the rest of jobs.txt to the first ssh.
            stdin=(stdin or subprocess.DEVNULL) if input_bytes is None else None,
            input=input_bytes,
            capture_output=True,
            check=False,
            timeout=timeout_s,
            process_group=0 if own_group else None,
        )
    except FileNotFoundError as exc:
        raise HpcboxError(f"cannot {what}: `{argv[0]}` not found", hint) from exc
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"").decode(errors="replace")
        raise TimedOut(f"cannot {what}: no answer within {timeout_s:.0f} s", hint, output=said) from exc
    done = Completed(
        tuple(argv),
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )
    if check and done.returncode != 0:
        raise failure(what, done.returncode, done.stderr or done.stdout, hint, argv)
    return done


def interactive(argv: Sequence[str]) -> int:
    """Run ``argv`` on this process's own terminal (stdin, stdout and stderr inherited); its exit status."""
    try:
        return subprocess.call(list(argv))
    except FileNotFoundError as exc:
        raise HpcboxError(f"`{argv[0]}` not found") from exc


def stream(
    argv: Sequence[str],
    *,
    what: str,
    hint: str = "",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdin: IO[bytes] | None = None,
    input_bytes: bytes | None = None,
    on_line: Callable[[str], None] | None = None,
    tail_lines: int = TAIL_LINES,
    carriage_returns: bool = False,
    timeout_s: float | None = None,
    passing: Collection[int] = (0,),
) -> list[str]:
    """Run ``argv`` with stdout and stderr merged, handing each line to ``on_line`` as it comes.

    ``input_bytes``, if given, is written to the program's stdin from a thread (so a large input
    cannot deadlock against unread output). ``carriage_returns`` also ends a line at "\r", where
    progress meters (rsync's) redraw one line. Returns the last ``tail_lines`` lines; on an exit
    status not in ``passing``, raises with them as details. ``timeout_s`` bounds it: past it the
    program and every process it started are killed (TimedOut).
    """
    echo = on_line if on_line is not None else _print_line
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    try:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if input_bytes is not None else (stdin or subprocess.DEVNULL),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Timed, in a process group of its own: what it starts (rsync's ssh) holds the output pipe
            # too, and is killed with it at the limit, or reading the pipe would wait on it.
            process_group=0 if timeout_s is not None else None,
        )
    except FileNotFoundError as exc:
        raise HpcboxError(f"cannot {what}: `{argv[0]}` not found", hint) from exc
    assert proc.stdout is not None
    if input_bytes is not None:
        threading.Thread(target=_feed, args=(proc.stdin, input_bytes), daemon=True).start()
    fired = threading.Event()

    def kill() -> None:
        if timeout_s is None:
            proc.kill()
            return
        with contextlib.suppress(ProcessLookupError):  # the whole group ended already
            os.killpg(proc.pid, signal.SIGKILL)

    def stop() -> None:
        fired.set()
        kill()

    limit = threading.Timer(timeout_s, stop) if timeout_s is not None else None
    if limit is not None:
        limit.daemon = True
        limit.start()
    try:
        with proc.stdout:
            for raw in _lines(proc.stdout, carriage_returns):
                line = raw.decode(errors="replace").rstrip("\r\n")
                if carriage_returns and not line.strip():
                    continue  # the empty pieces between "\r" and "\n"
                tail.append(line)
                echo(line)
    except BaseException:
        # Interrupted (Ctrl-C while following a log): the program goes with us, not on in the background.
        kill()
        proc.wait()
        raise
    finally:
        if limit is not None:
            limit.cancel()  # before the wait: until then the group's leader is there to be killed
    returncode = proc.wait()
    if fired.is_set() and returncode != 0:
        raise TimedOut(f"cannot {what}: no answer within {timeout_s:.0f} s", hint, output="\n".join(tail))
    if returncode not in passing:
        raise failure(what, returncode, "\n".join(tail), hint, argv)
    return list(tail)


@contextlib.contextmanager
def held(
    argv: Sequence[str],
    *,
    what: str,
    hint: str = "",
    ready: str,
    on_line: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Run ``argv``, which holds something (a lock) while its stdin stays open: the block runs once
    it prints the line ``ready``; leaving the block closes its stdin, and it ends. Lines before
    ``ready`` go to ``on_line``; if it ends without printing ``ready``, that is the failure raised.
    """
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except FileNotFoundError as exc:
        raise HpcboxError(f"cannot {what}: `{argv[0]}` not found", hint) from exc
    assert proc.stdin is not None and proc.stdout is not None
    said: list[str] = []
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == ready:
                break
            said.append(line)
            if on_line is not None:
                on_line(line)
        else:
            returncode = proc.wait()
            raise failure(what, returncode, "\n".join(said), hint, argv)
        yield
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a program to take."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def background(
    argv: Sequence[str], *, what: str, hint: str = "", ready: Callable[[], bool], timeout_s: float = 60
) -> Iterator[None]:
    """Run ``argv`` (a server) for the block, which starts once ``ready()`` says it answers; ended
    (TERM, then KILL) when the block does. One that ends first, or is not ready within ``timeout_s``,
    is the failure raised, with the last of what it said."""
    output: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError as exc:
        raise HpcboxError(f"cannot {what}: `{argv[0]}` not found", hint) from exc
    assert process.stdout is not None
    reader = threading.Thread(
        target=lambda: output.extend(line.decode(errors="replace").rstrip("\n") for line in process.stdout),
        daemon=True,
    )
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if process.poll() is not None:
                reader.join(timeout=5)
                raise failure(what, process.returncode, "\n".join(output), hint, argv)
            if time.monotonic() > deadline:
                raise HpcboxError(f"cannot {what}: it did not answer within {timeout_s:.0f} s", hint)
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=5)


def _lines(pipe: IO[bytes], carriage_returns: bool) -> Iterator[bytes]:
    if not carriage_returns:
        yield from pipe
        return
    pending = b""
    while chunk := pipe.read1(65536):  # type: ignore[attr-defined]
        pending += chunk
        *complete, pending = re.split(rb"[\r\n]", pending)
        yield from complete
    if pending:
        yield pending


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass  # the program exited early; its own error output says why
    finally:
        pipe.close()


def failure(what: str, returncode: int, output: str, hint: str, argv: Sequence[str]) -> HpcboxError:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit status {returncode}"
    return HpcboxError(
        f"failed to {what}: {last}",
        hint,
        details="$ " + shlex.join(argv) + "\n" + "\n".join(lines[-TAIL_LINES:]),
    )


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
