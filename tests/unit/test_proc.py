"""The one place hpcbox runs programs: what they inherit from the caller."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# A user's shell loop over a list of jobs (bash's `read` takes one line from the pipe and leaves the
# rest there), running a program through hpcbox's runner for each: `cat` stands in for ssh, which
# reads its standard input unless told otherwise.
LOOP = """
while read -r job; do
    "$0" -c "from hpcbox.tools import proc; proc.{call}(['cat'], what='read standard input'{extra})"
    echo "checked $job"
done
"""


@pytest.mark.parametrize(("call", "extra"), [("run", ""), ("stream", ", on_line=print")])
def test_a_program_hpcbox_runs_never_reads_the_callers_standard_input(call: str, extra: str):
    """`while read job; do hpcbox status -j "$job"; done < jobs.txt` checks every job, not the first."""
    done = subprocess.run(
        ["bash", "-c", LOOP.format(call=call, extra=extra), sys.executable],
        input="1\n2\n3\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines() == ["checked 1", "checked 2", "checked 3"]


def test_input_given_to_a_program_still_reaches_it():
    from hpcbox.tools import proc

    assert proc.run(["cat"], what="echo", input_bytes=b"given").stdout == "given"
    lines: list[str] = []
    proc.stream(["cat"], what="echo", input_bytes=b"given\n", on_line=lines.append)
    assert lines == ["given"]


def test_a_timed_program_is_killed_at_its_limit_with_what_it_said():
    from hpcbox.tools import proc

    with pytest.raises(proc.TimedOut) as late:
        proc.run(["sh", "-c", "echo started; exec sleep 600"], what="wait", timeout_s=1)
    assert late.value.output == "started\n"
    assert late.value.message == "cannot wait: no answer within 1 s"


def test_a_timed_stream_kills_what_its_program_started_too():
    """rsync's ssh holds rsync's output pipe: killing rsync alone would leave the pipe open and the read
    waiting on its child. The whole process group goes at the limit."""
    import time
    from pathlib import Path

    from hpcbox.tools import proc

    started = time.monotonic()
    with pytest.raises(proc.TimedOut) as late:
        proc.stream(["sh", "-c", "sleep 600 & echo $!; wait"], what="wait", on_line=print, timeout_s=1)
    assert time.monotonic() - started < 30
    status = Path(f"/proc/{int(late.value.output.split()[0])}/status")
    for _ in range(50):  # killed with its parent: gone, or dead and not yet reaped by init
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the program's child ({status}) still runs")


def test_a_timed_stream_that_ends_in_time_is_as_an_untimed_one():
    from hpcbox.tools import proc

    assert proc.stream(["sh", "-c", "echo one; echo two"], what="say", on_line=print, timeout_s=30) == [
        "one",
        "two",
    ]


def test_a_stream_passes_the_exit_statuses_its_caller_counts_as_done():
    """rsync's 24 (files vanished while a job's folder was read) is a download for `Connection.download`;
    any other status still fails with the program's last lines."""
    from hpcbox.errors import HpcboxError
    from hpcbox.tools import proc

    script = ["sh", "-c", "echo brought what stayed; exit 24"]
    assert proc.stream(script, what="download", on_line=lambda _: None, passing=(0, 24)) == [
        "brought what stayed"
    ]
    with pytest.raises(HpcboxError, match="brought what stayed"):
        proc.stream(script, what="download", on_line=lambda _: None)


# The terminal's Ctrl-C as a program run by the command sends it: SIGINT to the command's whole process
# group (the foreground job's), while the command waits on that program; then the outcome, as words.
CTRL_C_MEANWHILE = """
import os, signal, sys
from hpcbox.tools import proc

# as where neither is ignored (a suite run in the background, or by nohup, ignores them)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

told = []
with proc.signals_held(until_again=told.append) as held:
    done = proc.run(
        ["sh", "-c", f"kill -s {sys.argv[2]} -- -{os.getpgid(0)}; echo finished"], what="run",
        check=False, own_group=sys.argv[1] == "own group",
    )
print(repr(done.stdout.strip()), done.returncode, held, told)
"""


@pytest.mark.parametrize("name", ["INT", "HUP"])
@pytest.mark.parametrize(
    ("group", "outcome"),
    [("own group", "'finished' 0 ['SIGX'] ['SIGX']"), ("callers group", "'' -N ['SIGX'] ['SIGX']")],
)
def test_a_program_in_a_group_of_its_own_finishes_through_a_ctrl_c_this_process_holds(group, outcome, name):
    """What keeps a job sent at Ctrl-C (or as its terminal closes) recorded (ssh.Connection.uninterrupted):
    the program finishes, the signal waits; in the caller's group the terminal's signal ends the
    program, whatever waits."""
    number = getattr(signal, f"SIG{name}")
    outcome = outcome.replace("SIGX", f"SIG{name}").replace("-N", f"-{number}")
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_MEANWHILE, group, name],
        capture_output=True, text=True, check=True, start_new_session=True,
    )  # fmt: skip
    assert done.stdout.strip() == outcome, done.stderr


INSISTED = """
import os, signal
from hpcbox.tools import proc

signal.signal(signal.SIGINT, signal.default_int_handler)  # a suite run in the background ignores it

told = []
try:
    with proc.signals_held(until_again=told.append) as held:
        os.kill(os.getpid(), signal.SIGINT)
        print("held", held, told, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        print("held again", held, flush=True)
except KeyboardInterrupt:
    print("interrupted at once")
"""


def test_a_second_ctrl_c_acts_at_once_where_the_first_is_held_until_again():
    """A login node that hangs while the job is sent does not keep a user who insists waiting."""
    done = subprocess.run(
        [sys.executable, "-c", INSISTED], capture_output=True, text=True, check=True, start_new_session=True
    )
    assert done.stdout.splitlines() == ["held ['SIGINT'] ['SIGINT']", "interrupted at once"], done.stderr
