"""Job signals: what a cluster sends before it takes the node away, turned into flags the loop polls.

SIGUSR1 (`sbatch --signal=B:USR1@120`, or `scancel --signal=USR1`) and SIGTERM (preemption, the
time limit) mean "checkpoint now and exit with EXIT_REQUEUE"; SIGUSR2 means "checkpoint now and
carry on". Handlers only set flags: the checkpoint is written between two steps, where the state
is consistent.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
CHECKPOINT_SIGNAL = signal.SIGUSR2
JOB_SIGNALS = (*STOP_SIGNALS, CHECKPOINT_SIGNAL)
# A rest between steps is slept in slices this long, each ending with a look at the flags: a signal
# ends it within a slice (Python resumes a sleep its handler interrupted).
REST_SLICE_S = 0.1


@contextlib.contextmanager
def held_while_starting() -> Iterator[None]:
    """Blocks the job signals in this thread while a launcher starts its workers, which inherit the
    block: a signal sent to a worker before its handlers are in place (from the launcher, or from Slurm,
    which signals every process of a step) then waits for `JobSignals.install` instead of killing it
    (the default action). This thread's own pending ones are delivered when the block ends."""
    signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)


class JobSignals:
    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.checkpoint_requested = False

    def install(self) -> JobSignals:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_stop)
        signal.signal(CHECKPOINT_SIGNAL, self._on_checkpoint)
        # A launcher starts its workers with these blocked (see `held_while_starting`): one that came
        # since is delivered now, to the handlers above.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)
        return self

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_signal = signum

    def _on_checkpoint(self, _signum: int, _frame: FrameType | None) -> None:
        self.checkpoint_requested = True

    @property
    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    def rest(self, seconds: float) -> None:
        """Sleeps ``seconds``, or until a signal asks for a checkpoint."""
        until = time.monotonic() + seconds
        while not (self.stop_requested or self.checkpoint_requested):
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, REST_SLICE_S))


def name_of(signum: int) -> str:
    return signal.Signals(signum).name


class EarlySignals:
    """Stop signals that come while a launcher starts, before it can act on them, remembered instead of
    ending it (their default action)."""

    def __init__(self) -> None:
        self._arrived: list[int] = []

    def hold(self) -> EarlySignals:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._remember)
        return self

    def _remember(self, signum: int, _frame: FrameType | None) -> None:
        self._arrived.append(signum)

    def take(self) -> list[int]:
        """The signals held so far, in order; held no longer."""
        taken, self._arrived = self._arrived, []
        return taken
