"""Progress on stderr, never under ``--quiet``: a rich bar on a terminal; elsewhere (a log file,
CI, a pipe) a plain line once the work has taken :data:`LINE_DELAY_S` and then every
:data:`LINE_EVERY_S`, so a long study is never silent.

Commands that can take more than a second report through :class:`Bar`; the CLI's ``--quiet``
(every command has it) turns them off with :func:`set_quiet`. Nothing is printed to stdout.
"""

from __future__ import annotations

import sys
import time
from typing import Any

_QUIET = False
LINE_DELAY_S = 5.0  # off a terminal: the first progress line after this many seconds of work
LINE_EVERY_S = 10.0  # and then one line per this many seconds


def set_quiet(quiet: bool) -> None:
    global _QUIET
    _QUIET = bool(quiet)


def enabled() -> bool:
    """A progress bar is shown: stderr is a terminal and ``--quiet`` was not given."""
    return not _QUIET and sys.stderr.isatty()


def lines_enabled() -> bool:
    """Progress lines are written: stderr is not a terminal and ``--quiet`` was not given."""
    return not _QUIET and not sys.stderr.isatty()


class Bar:
    """A transient rich progress bar with a total; it appears once the work has taken ``delay_s``."""

    def __init__(self, total: int | None, label: str, *, enabled: bool = True, delay_s: float = 0.5) -> None:
        self.total, self.label, self.delay_s = total, label, delay_s
        self.on = enabled and globals()["enabled"]()
        self.lines = enabled and not self.on and lines_enabled()
        self.next_line = LINE_DELAY_S
        self.wrote_line = False
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
        if self.lines:
            self._line(note)
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

    def _line(self, note: str, final: bool = False) -> None:
        from autopar.limits import terminal_safe

        elapsed = time.perf_counter() - self.t0
        if not final and elapsed < self.next_line:
            return
        self.next_line = elapsed + LINE_EVERY_S
        self.wrote_line = True
        count = (
            f"{self.done:,}/{self.total:,} ({self.done / self.total:.0%})"
            if self.total
            else f"{self.done:,} steps"
            if self.done
            else "working"
        )
        if final:
            text = f"{self.label}: done in {elapsed:.0f} s" + (f", {count}" if self.total else "")
        else:
            text = f"{self.label}: {count}, {elapsed:.0f} s"
        sys.stderr.write(terminal_safe(text + (f" ({note})" if note and not final else ""), 300) + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.lines and self.wrote_line:  # a log that showed progress also shows the end
            self.lines = False
            self._line("", final=True)
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class Spinner:
    """An elapsed-time bar for work that reports no steps; it appears only after ``delay_s``."""

    def __init__(self, label: str, *, delay_s: float = 1.0) -> None:
        import threading

        self.bar = Bar(None, label)
        # no lines off a terminal: a spinner's work (one serving search) is short and reports no
        # steps, and a refusal after it must stay the one line on stderr
        self.bar.lines = False
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
