"""Progress off a terminal: plain lines on stderr once the work is long, none under --quiet."""

from __future__ import annotations

import time

import pytest

from autopar import progress


class Log:
    """stderr as the test sees it (pytest's capture: not a terminal)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys, self.text = capsys, ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Log:
    monkeypatch.setattr(progress, "LINE_DELAY_S", 0.05)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    progress.set_quiet(False)
    return Log(capsys)


def test_lines_when_stderr_is_not_a_terminal(log: Log) -> None:
    with progress.Bar(4, "study trials") as bar:
        bar.advance(1)  # quick: nothing yet
        assert log.getvalue() == ""
        time.sleep(0.06)
        bar.advance(1, "trial 2")
        time.sleep(0.06)
        bar.advance(2)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("study trials: 2/4 (50%), ") and lines[0].endswith("(trial 2)")
    assert lines[1].startswith("study trials: 4/4 (100%)")
    assert lines[-1].startswith("study trials: done in 0 s, 4/4 (100%)")


def test_short_work_writes_nothing(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "LINE_DELAY_S", 60.0)
    with progress.Bar(3, "cells") as bar:
        bar.advance(3)
    assert log.getvalue() == ""


def test_quiet_writes_nothing(log: Log) -> None:
    progress.set_quiet(True)
    try:
        with progress.Bar(2, "cells") as bar:
            time.sleep(0.06)
            bar.advance(2)
    finally:
        progress.set_quiet(False)
    assert log.getvalue() == ""


def test_spinner_writes_no_lines(log: Log) -> None:
    """A spinner (one serving search) stays silent off a terminal: a refusal after it is one line."""
    with progress.Spinner("serving search", delay_s=0.01):
        time.sleep(0.3)
    assert log.getvalue() == ""
