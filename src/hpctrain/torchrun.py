"""`python -m hpctrain.torchrun ...`: PyTorch's own torchrun, fixed for builds without libuv and for
cluster signals.

libuv: Debian's python3-torch 2.6 is built without libuv, yet its TCPStore still defaults to
use_libuv=True, and torchrun's rendezvous backends create TCPStores without passing the flag (nor
reading USE_LIBUV), so `torchrun` dies with "use_libuv was requested but PyTorch was build without
libuv support". This wrapper makes the default follow the build (and USE_LIBUV, if set); the
trainer's processes make their own store the same way. With a PyTorch that has libuv (PyPI wheels)
it changes nothing there.

Signals: torchrun's agent does not pass SIGUSR1 on (its default action kills the agent and orphans
the workers), and on SIGTERM it shuts the workers down and exits 1 whatever they did. Here both are
passed to every worker, which checkpoints at the same step as the others and exits 75 (EXIT_REQUEUE);
the agent then exits 75 too when every failed worker exited 75, so a job script can requeue.

Whatever the agent is doing when the signal comes, every node ends the same way. One that came while
the agent started (importing torch, in the rendezvous) is held, and the workers still start and are
told at once: they stop together at their first step. An agent that ended there instead would leave
the other nodes' workers waiting for peers that never come. And with HPCTRAIN_STOP_WITHIN_S set (the
job script sets it to half the time limit's margin), workers still running that many seconds after
the signal (waiting in a collective for a peer that is gone, stuck writing) are killed and the agent
exits 75: the requeued job resumes from the last checkpoint written whole.
Everything else is torch.distributed.run unchanged (same arguments).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType

from hpctrain.signals import STOP_SIGNALS, EarlySignals, held_while_starting

# Torch's import takes seconds on a busy node, and a time limit's USR1 meanwhile would end the agent
# (the signal's default action) with nothing checkpointed and no requeue: held from here on instead.
_EARLY = EarlySignals().hold()

import torch.distributed as dist  # noqa: E402  (after the hold above)
from torch.distributed.elastic.multiprocessing.api import PContext  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: E402

from hpctrain import EXIT_REQUEUE  # noqa: E402
from hpctrain.distributed import libuv_available  # noqa: E402


class _TCPStore(dist.TCPStore):
    use_libuv_default = True

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("use_libuv", self.use_libuv_default)
        super().__init__(*args, **kwargs)


def _forward_stop_signals(workers: PContext, stop_within_s: float | None) -> None:
    """From now on, USR1 and TERM reach the workers instead of stopping the agent; one held since the
    agent's start-up check is passed on now. The first starts the bound on how long they may take."""
    bound: list[threading.Timer] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        for pid in workers.pids().values():
            # One that already exited is the agent's monitor's business.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if stop_within_s is not None and not bound:
            bound.append(threading.Timer(stop_within_s, _end_workers, (workers, signum, stop_within_s)))
            bound[0].daemon = True
            bound[0].start()

    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    held = _EARLY.take()
    if held:
        name = signal.Signals(held[0]).name
        print(
            f"hpctrain.torchrun: {name} came as the workers started; they stop at their first step",
            file=sys.stderr,
        )
    for signum in held:
        forward(signum, None)


def _end_workers(workers: PContext, signum: int, within_s: float) -> None:
    name = signal.Signals(signum).name
    print(
        f"hpctrain.torchrun: the workers did not stop within {within_s:g} s of {name}; ending them and "
        f"exiting {EXIT_REQUEUE} (the job resumes from its last whole checkpoint)",
        file=sys.stderr,
        flush=True,
    )
    for pid in workers.pids().values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(EXIT_REQUEUE)


def _stop_within_s() -> float | None:
    value = os.environ.get("HPCTRAIN_STOP_WITHIN_S")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        sys.exit(f"hpctrain.torchrun: HPCTRAIN_STOP_WITHIN_S={value!r} is not a positive number of seconds")
    return seconds


def _start_forwarding(start, stop_within_s: float | None):
    # PContext.start installs torchrun's own SIGTERM handler (raise, kill the workers): replace it after.
    def start_then_forward(self: PContext) -> None:
        with held_while_starting():
            start(self)
            _forward_stop_signals(self, stop_within_s)

    return start_then_forward


def main() -> None:
    wanted = os.environ.get("USE_LIBUV")
    _TCPStore.use_libuv_default = wanted == "1" if wanted is not None else libuv_available()
    if not _TCPStore.use_libuv_default:
        dist.TCPStore = _TCPStore  # before torchrun's modules bind the name
    PContext.start = _start_forwarding(PContext.start, _stop_within_s())
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except ChildFailedError as failed:
        exit_codes = {failure.exitcode for failure in failed.failures.values()}
        if exit_codes == {EXIT_REQUEUE}:
            print(f"hpctrain.torchrun: the workers checkpointed; exiting {EXIT_REQUEUE}", file=sys.stderr)
            sys.exit(EXIT_REQUEUE)
        raise


if __name__ == "__main__":
    main()
