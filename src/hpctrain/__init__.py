"""hpctrain: an image-classification trainer that behaves well on a Slurm cluster.

Run as ``python -m hpctrain make-data ...`` and ``python -m hpctrain train ...``.
Only the standard library is imported at package import time: torch is loaded once the
configuration has been validated, so bad input fails in well under a second.
"""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
# EX_TEMPFAIL from sysexits.h: "checkpointed on SIGUSR1/SIGTERM, requeue me".
EXIT_REQUEUE = 75


class HpctrainError(Exception):
    """A user-facing failure: one line saying what is wrong and, in `hint`, how to fix it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
