"""Progress bars on stderr (rich), shown only on a terminal and never under ``--quiet``.

Commands that can take more than a second report through :class:`Bar`; the CLI's ``--quiet``
(every command has it) turns them off with :func:`set_quiet`. Nothing is printed to stdout.
"""

from __future__ import annotations

import sys
import time
from typing import Any

_QUIET = False


def set_quiet(quiet: bool) -> None:
    global _QUIET
    _QUIET = bool(quiet)


def enabled() -> bool:
    """Progress is shown: stderr is a terminal and ``--quiet`` was not given."""
    return not _QUIET and sys.stderr.isatty()


class Bar:
    """A transient rich progress bar with a total; it appears once the work has taken ``delay_s``."""

    def __init__(self, total: int | None, label: str, *, enabled: bool = True, delay_s: float = 0.5) -> None:
        self.total, self.label, self.delay_s = total, label, delay_s
        self.on = enabled and globals()["enabled"]()
        self.t0 = time.perf_counter()
        self.done = 0
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> Bar:
        """Show the bar now (work with no steps to count: an elapsed-time bar until :meth:`close`)."""
        self.delay_s = 0.0
        self.advance(0)
        return self

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if not self.on:
            return
        if self.bar is None and time.perf_counter() - self.t0 >= self.delay_s:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            from autopar.limits import markup_safe

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(markup_safe(self.label), total=self.total, note="")
        if self.bar is not None:
            from autopar.limits import markup_safe

            self.bar.update(self.task, completed=self.done, note=markup_safe(note))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class Spinner:
    """An elapsed-time bar for work that reports no steps; it appears only after ``delay_s``."""

    def __init__(self, label: str, *, delay_s: float = 1.0) -> None:
        import threading

        self.bar = Bar(None, label)
        self.lock = threading.Lock()
        self.done = False
        self.timer = threading.Timer(delay_s, self._show)
        self.timer.daemon = True

    def _show(self) -> None:
        with self.lock:
            if not self.done:
                self.bar.start()

    def start(self) -> Spinner:
        if self.bar.on:
            self.timer.start()
        return self

    def stop(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.done = True
            self.bar.close()

    def __enter__(self) -> Spinner:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
