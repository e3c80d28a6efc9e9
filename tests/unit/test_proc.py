"""The one place hpcbox runs programs: what they inherit from the caller."""

from __future__ import annotations

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
