"""Study journals survive what machines do: a write cut at any byte (kill -9), a full disk, a
storage file that belongs to another program."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.errors import AutoparError
from autopar.objectives import Objectives
from autopar.prediction import training_job
from autopar.search import study as study_mod
from autopar.search.space import load_space
from autopar.search.study import StudyConfig, list_studies, load_report, run_study

JOB = ["--model", "llama-3.1-8b", "--device", "a100-80gb", "--num-devices", "8"]
JOB += ["--seq-len", "4096", "--global-batch", "32"]
RUN = ["study", "run", "--name", "s", *JOB, "--sampler", "random", "--seed-top-k", "0", "--batch", "1"]


def _lines_ok(p: Path) -> int:
    """Every line of the journal is complete and an Optuna log entry; how many there are."""
    data = p.read_bytes()
    assert data.endswith(b"\n")
    lines = data.splitlines(keepends=True)
    for line in lines:
        assert line.endswith(b"\n") and "op_code" in json.loads(line)
    return len(lines)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A study of 4 trials written by another process (now dead, as after a kill -9)."""
    d = tmp_path_factory.mktemp("journal")
    cmd = [sys.executable, "-m", "autopar", *RUN, "--n-trials", "4", "--storage", "j.log"]
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return (d / "j.log").read_bytes()


def _cfg(storage: Path) -> StudyConfig:
    job = training_job(
        model="llama-3.1-8b",
        device="a100-80gb",
        num_devices=8,
        seq_len=4096,
        global_batch=32,
        devices_per_node=None,
    )
    return StudyConfig(
        name="s",
        job=job,
        space=load_space("default"),
        objectives=Objectives.parse("throughput"),
        sampler="random",
        storage=str(storage),
        seed_top_k=0,
        batch=1,
    )


def test_a_cut_at_every_byte_of_the_last_entry_resumes_lists_and_shows(
    journal: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = journal.splitlines(keepends=True)
    head, last = b"".join(lines[:-1]), lines[-1]
    assert last.endswith(b"\n") and len(last) > 50
    # through the CLI at a few cuts (its commands cost ~0.1 s each), through the same functions at every one
    via_cli = {0, 1, 11, len(last) // 2, len(last) - 1}
    for k in range(len(last)):  # k bytes of the last entry reached the disk (never its newline)
        d = tmp_path / f"cut{k}"
        d.mkdir()
        j = d / "j.log"
        j.write_bytes(head + last[:k])
        st = ["--storage", str(j)]
        cli = k in via_cli
        # the read-only commands work on the cut journal and leave it as it is
        if cli:
            assert main(["study", "list", *st]) == 0
            assert main(["study", "show", "--name", "s", *st]) == 0
        else:
            assert [r["trials"] for r in list_studies(str(j))] == [4]
        assert j.read_bytes() == head + last[:k]
        capsys.readouterr()
        # resuming repairs it: the torn bytes go to the side file, nothing is written after them
        if cli:
            assert main([*RUN, "--n-trials", "5", *st]) == 0, k
        else:
            run_study(_cfg(j), n_trials=5)
        err = capsys.readouterr().err
        torn = study_mod.torn_path(j)
        if k == 0:
            assert not torn.exists() and "was cut" not in err
        else:
            assert torn.read_bytes() == last[:k] + b"\n", k
            notes = [x for x in err.splitlines() if "was cut" in x]
            assert len(notes) == 1 and f"({k} bytes" in notes[0] and str(torn) in notes[0]
        assert _lines_ok(j) > len(lines) - 1
        assert j.read_bytes().startswith(head)
        if cli:
            assert main(["study", "list", *st]) == 0
            assert main(["study", "show", "--name", "s", *st]) == 0
            assert "s: 5 trials" in capsys.readouterr().out
        rep = load_report("s", str(j))
        # the cut entry was the last trial's "complete": it is failed (its writer is dead), not lost
        assert rep.n_complete + rep.n_failed == 5 and rep.n_running == 0, k


def test_a_damaged_middle_line_or_a_foreign_last_line_is_refused_not_repaired(tmp_path: Path) -> None:
    j = tmp_path / "notes.log"
    j.write_bytes(b"some notes\nwithout a final newline")
    before = j.read_bytes()
    with pytest.raises(AutoparError, match="not an Optuna journal"):
        study_mod.resolve_storage(str(j))
    assert j.read_bytes() == before and not study_mod.torn_path(j).exists()
    j.write_bytes(b'{"op_code":0,"worker_id":"w","study_name":"x","directions":[1]}\nhello')
    before = j.read_bytes()
    with pytest.raises(AutoparError, match="its last line is not a log entry"):
        study_mod.resolve_storage(str(j))
    assert j.read_bytes() == before and not study_mod.torn_path(j).exists()


def _enospc_after(limit: int, journal: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """os.write to ``journal`` writes ``limit`` more bytes in all, then fails with ENOSPC (a full disk)."""
    real = os.write
    left = {"bytes": limit, "failures": 0}

    def write(fd: int, data: bytes) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target != str(journal.resolve()):
            return real(fd, data)
        if left["bytes"] <= 0:
            left["failures"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[: left["bytes"]]))  # a short write, as on a disk filling up
        left["bytes"] -= n
        return n

    monkeypatch.setattr(os, "write", write)
    return left


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd to tell the journal's fd")
def test_a_full_disk_never_leaves_an_empty_or_half_written_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    j = tmp_path / "j.log"
    st = ["--storage", str(j)]
    # a new study on a full disk: one line, exit 2, no journal at all (not an empty one)
    left = _enospc_after(0, j, monkeypatch)
    assert main([*RUN, "--n-trials", "3", *st]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "no journal was created" in err[0]
    assert left["failures"] >= 1 and not j.exists()
    monkeypatch.undo()
    assert main([*RUN, "--n-trials", "3", *st]) == 0
    n_before = _lines_ok(j)
    good = j.read_bytes()
    # the disk fills up in the middle of an entry, at several points of a resumed study
    for limit in (1, 100, 1000, 3000):
        left = _enospc_after(limit, j, monkeypatch)
        assert main([*RUN, "--n-trials", "40", *st]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "No space left on device" in err[0], err
        assert left["failures"] == 1
        monkeypatch.undo()
        data = j.read_bytes()
        assert data.startswith(good) and _lines_ok(j) >= n_before  # whole entries only
        assert not study_mod.torn_path(j).exists()
        assert main(["study", "list", *st]) == 0
        good = data
    assert main([*RUN, "--n-trials", "40", *st]) == 0  # space again: the study resumes to its total
    rep = study_mod.load_report("s", str(j))
    # the trials in flight when the disk filled stay "running" while their writer (this process) lives
    assert rep.n_complete + rep.n_failed + rep.n_running == 40 and rep.n_complete >= 36


def test_setting_torn_bytes_aside_on_a_full_disk_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = tmp_path / "j.log"
    entry = b'{"op_code":0,"worker_id":"w","study_name":"x","directions":[1]}\n'
    j.write_bytes(entry + entry[:30])
    real = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".torn"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(AutoparError, match="cannot be set aside"):
        study_mod.resolve_storage(str(j))
    assert j.read_bytes() == entry + entry[:30]
    assert not study_mod.torn_path(j).exists()  # no empty side file left behind


def test_a_sqlite_file_of_another_program_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "app.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes (x TEXT)")
    con.execute("INSERT INTO notes VALUES ('keep me')")
    con.commit()
    con.close()
    before = db.read_bytes()
    for argv in ([*RUN, "--n-trials", "2"], ["study", "list"], ["study", "show", "--name", "s"]):
        assert main([*argv, "--storage", str(db)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "SQLite database of another program (tables notes)" in err[0]
        assert db.read_bytes() == before
    text = tmp_path / "plain.db"
    text.write_text("not a database\n")
    assert main(["study", "list", "--storage", str(text)]) == 2
    assert "is not an SQLite database" in capsys.readouterr().err
    assert text.read_text() == "not a database\n"
    # an Optuna database and a new (or empty) file are accepted
    fresh = tmp_path / "fresh.db"
    assert main([*RUN, "--n-trials", "2", "--storage", str(fresh)]) == 0
    assert main([*RUN, "--n-trials", "3", "--storage", str(fresh)]) == 0
    capsys.readouterr()
    assert main(["study", "list", "--storage", str(fresh)]) == 0
    assert "s: 3 trials" in capsys.readouterr().out
    # the job's devices come from its recorded cluster (the header once read "on None x None")
    assert main(["study", "show", "--name", "s", "--storage", str(fresh)]) == 0
    assert "study s: llama-3.1-8b on 8 x a100-80gb, space default" in capsys.readouterr().out
    from autopar.cli.study import job_line

    assert job_line({"model": "m", "num_devices": 4, "device": "d"}) == "m on 4 x d"  # an older flat record
    assert job_line(None) == "? on ? x ?"


def test_a_second_cut_is_added_to_the_side_file_not_written_over_it(journal: bytes, tmp_path: Path) -> None:
    j = tmp_path / "j.log"
    lines = journal.splitlines(keepends=True)
    j.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    run_study(_cfg(j), n_trials=5)
    after = j.read_bytes().splitlines(keepends=True)
    j.write_bytes(b"".join(after[:-1]) + after[-1][:25])  # the resumed session is cut too
    run_study(_cfg(j), n_trials=6)
    assert study_mod.torn_path(j).read_bytes() == lines[-1][:40] + b"\n" + after[-1][:25] + b"\n"
    assert _lines_ok(j) and load_report("s", str(j)).n_complete >= 4


def test_a_journal_an_older_writer_appended_after_a_cut_is_repaired_keeping_every_whole_entry(
    journal: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    lines = journal.splitlines(keepends=True)
    j = tmp_path / "j.log"
    j.write_bytes(b"".join(lines[:-1]) + lines[-1][:60])
    # what autopar did before (and Optuna's own backend does): append after the cut bytes
    native = JournalStorage(JournalFileBackend(str(j)))
    optuna.load_study(study_name="s", storage=native).set_user_attr("written_after_the_cut", 1)
    damaged = j.read_bytes()
    st = ["--storage", str(j)]
    assert main(["study", "list", *st]) == 2  # read-only: refused in one line, file untouched
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cut start of an entry followed by a whole one" in err[0]
    assert j.read_bytes() == damaged
    assert main([*RUN, "--n-trials", "5", *st]) == 0  # a writer repairs it, then resumes
    notes = [x for x in capsys.readouterr().err.splitlines() if "1 line(s) held the cut start" in x]
    assert len(notes) == 1
    assert study_mod.torn_path(j).read_bytes() == lines[-1][:60] + b"\n"
    assert _lines_ok(j) and j.read_bytes().startswith(b"".join(lines[:-1]))
    assert main(["study", "list", *st]) == 0 and "s: 5 trials" in capsys.readouterr().out
    rep = load_report("s", str(j))
    assert rep.attrs["written_after_the_cut"] == 1 and rep.n_complete + rep.n_failed == 5
