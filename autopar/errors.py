"""The small exception tree of autopar: every user-facing failure names the problem and the fix.

The CLI turns any :class:`AutoparError` into one line on stderr and exit status 2.
"""

from __future__ import annotations


class AutoparError(Exception):
    """Base class: a problem with the user's input that autopar can explain.

    ``hint`` says what to do about it; the CLI prints ``error: <message> (<hint>)``.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ModelConfigError(AutoparError):
    """A model preset or Hugging Face config that cannot be normalized (unknown or missing field)."""


class UnsupportedArchitecture(ModelConfigError):
    """A config whose architecture autopar does not model; it refuses instead of guessing."""


class DeviceError(AutoparError):
    """An unknown device id or an invalid device/cluster profile."""


class LayoutError(AutoparError):
    """A parallel layout that is not legal for the model, cluster or workload.

    ``reasons`` holds the structured :class:`autopar.layout.Reason` objects behind the message.
    """

    def __init__(self, message: str, hint: str | None = None, reasons: list | None = None) -> None:
        super().__init__(message, hint)
        self.reasons = list(reasons or [])


class SearchSpaceError(AutoparError):
    """A malformed or inconsistent search-space file."""


class InfeasibleError(AutoparError):
    """Nothing in the search space satisfies the request (memory, latency target, ...)."""


class RunError(AutoparError):
    """A validation or calibration run that could not be launched or crashed."""


class FileError(AutoparError):
    """A file autopar cannot read (missing, not a regular file, binary, malformed, invalid) or cannot
    write (a directory, device or FIFO, a missing or unwritable directory); see :mod:`autopar.files`."""
