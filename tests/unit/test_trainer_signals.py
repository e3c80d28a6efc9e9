"""The trainer's rest between steps (`--step-pause`) ends when a job signal comes, not when it runs out."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from hpctrain.signals import JOB_SIGNALS, JobSignals, name_of


@pytest.fixture
def job_signals():
    """`JobSignals` installed in this process, and the handlers it replaced put back after."""
    before = {signum: signal.getsignal(signum) for signum in JOB_SIGNALS}
    try:
        yield JobSignals().install()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_checkpoint_signal_ends_a_long_rest(job_signals):
    sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2))
    started = time.monotonic()
    sender.start()
    job_signals.rest(600)
    sender.join()
    assert job_signals.checkpoint_requested and not job_signals.stop_requested
    assert time.monotonic() - started < 60  # the signal ended it, not its ten minutes


def test_a_rest_no_signal_ends_lasts_its_time(job_signals):
    started = time.monotonic()
    job_signals.rest(0.3)
    assert time.monotonic() - started >= 0.3
    assert not (job_signals.checkpoint_requested or job_signals.stop_requested)


def test_a_rest_after_a_stop_signal_does_not_sleep(job_signals):
    os.kill(os.getpid(), signal.SIGUSR1)
    started = time.monotonic()
    job_signals.rest(600)
    assert name_of(job_signals.stop_signal) == "SIGUSR1"
    assert time.monotonic() - started < 60
