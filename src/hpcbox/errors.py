"""The exceptions users see: one line saying what is wrong and how to fix it."""

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


class FieldError(HpcboxError):
    """Invalid input; `field` names the setting (a flag, a config key or a profile key) at fault."""

    def __init__(self, field_name: str, problem: str, hint: str = "") -> None:
        super().__init__(f"{field_name}: {problem}", hint)
        self.field = field_name
