"""The one exception type users see."""

from __future__ import annotations


class HpcboxError(Exception):
    """A failure the user can act on: one line saying what is wrong, and a hint saying how to fix it.

    ``details`` carries supporting output (for example the last lines of a failed build) that is
    printed after the message but is not part of it.
    """

    def __init__(self, message: str, hint: str = "", details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message
