"""The demo's cluster beside its build (hpcbox.cli.demo.Beside): its lines held back until its stage,
then said as they come; its error raised in the demo's own thread. The demo itself, end to end:
tests/integration/test_submit.py."""

from __future__ import annotations

import threading

import pytest

from hpcbox.cli.demo import Beside


def test_lines_wait_for_their_stage_then_flow_and_the_result_comes_back():
    said: list[str] = []
    first_said, go_on = threading.Event(), threading.Event()

    def work(on_line):
        on_line("node image: built")
        first_said.set()
        go_on.wait(timeout=10)
        on_line("cluster up")
        return "cluster"

    beside = Beside(work, said.append)
    assert first_said.wait(timeout=10)
    said.append("build: done")  # the demo's own lines meanwhile
    assert said == ["build: done"]
    go_on.set()
    assert beside.result() == "cluster"
    assert said == ["build: done", "node image: built", "cluster up"]


def test_an_error_beside_is_raised_where_the_result_is_asked_for():
    def work(on_line):
        on_line("starting")
        raise RuntimeError("port 2222 is busy")

    said: list[str] = []
    beside = Beside(work, said.append)
    with pytest.raises(RuntimeError, match="port 2222 is busy"):
        beside.result()
    assert said == ["starting"]
