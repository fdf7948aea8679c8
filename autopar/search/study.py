"""Persistent Optuna studies over a search space: create, resume, inspect.

A study is named and stored (default: the journal file ``autopar-studies.log`` in the working
directory, which ``optuna-dashboard autopar-studies.log`` opens; ``*.db`` means SQLite; any Optuna
storage URL works). The sampler and its seed are chosen explicitly and recorded on the study with
the job, the search space and the objectives, so a resumed study continues the same search. Each
trial proposes one value per axis; a proposal that breaks a legality rule is moved to the nearest
legal layout (recorded as ``repaired``). Memory over capacity is a constraint
(``trial.set_constraint``), not a penalty. Identical proposals are answered from a cache (also
rebuilt from the storage on resume) instead of being scored again. Where the uniform part of the
space can be enumerated, its exhaustive top-k are enqueued as the first trials.

Trials are told one by one as soon as they are scored, so killing a running study loses no finished
trial; running the same command again resumes it (``--n-trials`` is the study's total).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autopar import __version__
from autopar.coefficients import Calibration, load_calibration
from autopar.engine import evaluate
from autopar.errors import AutoparError, SearchSpaceError
from autopar.job import SCHEMA_VERSION, Job, TrainingJob
from autopar.layout import (
    PRECISION_CODES,
    RECOMPUTE_CODES,
    RECOMPUTE_ORDER,
    Layout,
    LayoutTable,
    recompute_weight,
)
from autopar.memory import GIB
from autopar.objectives import DEFAULT_PRICE_PER_DEVICE_HOUR, TRAINING, Objectives, cost_per_mtok, pareto_mask
from autopar.search.enumerate import Enumeration, enumerate_space
from autopar.search.recommend import search_layouts
from autopar.search.space import SearchSpace
from autopar.search.uneven import StagePlan, UnevenScorer, best_monotone_split, check_model, even_split

DEFAULT_STORAGE = "autopar-studies.log"
SAMPLERS = ("tpe", "nsga2", "random", "gp", "bruteforce")
CONSTRAINT = "memory_over_capacity_gib"


def constraints_key() -> str:
    """The trial system attribute Optuna's samplers and optuna-dashboard read constraints from."""
    try:
        from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

        return str(_CONSTRAINTS_KEY)
    except ImportError:  # pragma: no cover - older Optuna
        return "constraints"


# ------------------------------------------------------------------------------------ storage
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
STORAGE_HINT = "pass --storage FILE.log (journal), FILE.db (SQLite) or an Optuna storage URL"


def storage_file(storage: str | Path | None) -> Path | None:
    """The local file behind a storage spec (journal or SQLite), or None for a URL."""
    s = str(storage or DEFAULT_STORAGE)
    return None if "://" in s else Path(s).expanduser()


def _check_storage_file(p: Path, *, must_exist: bool, journal: bool, spliced_ok: bool = True) -> None:
    """A storage file must be a regular file (a journal also UTF-8 text) or, if new, creatable."""
    import stat as _stat

    from autopar.files import check_output

    what = "study journal" if journal else "SQLite study database"
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if must_exist:
            raise AutoparError(
                f"no study storage at {p}", "run `autopar study run` first, or pass the right --storage"
            ) from None
        check_output(p, what, "--storage")  # the directory exists and is writable; not a device/dir
        return
    except OSError as exc:
        raise AutoparError(f"--storage {p}: {exc.strerror}", STORAGE_HINT) from None
    if not _stat.S_ISREG(st.st_mode):
        kind = "a directory" if _stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise AutoparError(f"--storage {p} is {kind}", STORAGE_HINT)
    if journal:
        with open(p, "rb") as fh:
            head = fh.read(1 << 16)
        try:
            head.decode("utf-8")
            bad = b"\x00" in head
        except UnicodeDecodeError as exc:
            bad = exc.start < len(head) - 4  # a character cut at the end of the sample is fine
        if bad:
            raise AutoparError(f"--storage {p} is not an Optuna journal (binary content)", STORAGE_HINT)
        _check_journal_lines(p, spliced_ok=spliced_ok)
    elif st.st_size:
        _check_optuna_sqlite(p)


# Optuna's journal writes each operation as one line of compact JSON whose first key is op_code.
_OP_PREFIX = b'{"op_code":'


def _is_cut_start(b: bytes) -> bool:
    """``b`` could be the first bytes of an Optuna log entry."""
    return _OP_PREFIX.startswith(b[: len(_OP_PREFIX)]) or b.startswith(_OP_PREFIX)


def _spliced_at(line: bytes) -> int | None:
    """Where the whole entry starts in a line that is the cut start of one entry followed by a whole
    one (what an older autopar or Optuna left by appending after a killed write), else None."""
    at = line.find(_OP_PREFIX, 1)
    while at > 0:
        try:
            d = json.loads(line[at:])
            if isinstance(d, dict) and "op_code" in d and _is_cut_start(line[:at]):
                return at
        except ValueError:
            pass
        at = line.find(_OP_PREFIX, at + 1)
    return None


def _check_journal_lines(p: Path, *, spliced_ok: bool = True) -> None:
    """Every complete line of a journal is an Optuna log entry (a JSON object with an ``op_code``;
    Optuna would fail on the first that is not, with a traceback, and only once it appends after
    it), and a cut last line (see :func:`repair_torn_tail`) is the start of one. A line spliced
    from a cut entry and a whole one (:func:`repair_spliced`) passes when ``spliced_ok`` (a
    command that writes, and so repairs it first)."""
    with open(p, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):  # a cut last line (a killed write, a full disk)
                if not _OP_PREFIX.startswith(line[: len(_OP_PREFIX)]) and not line.startswith(_OP_PREFIX):
                    raise AutoparError(
                        f"--storage {p} is not an Optuna journal (its last line is not a log entry)",
                        STORAGE_HINT,
                    )
                break
            try:
                d = json.loads(line)
                ok = isinstance(d, dict) and "op_code" in d
            except ValueError:
                ok = False
            if not ok and _spliced_at(line) is not None:
                if spliced_ok:
                    continue
                raise AutoparError(
                    f"--storage {p}: line {n} is the cut start of an entry followed by a whole one (an older "
                    "writer appended after a killed write)",
                    "any command that writes to the journal repairs it first, e.g. `autopar study run` "
                    "resuming the study",
                )
            if not ok:
                raise AutoparError(
                    f"--storage {p} is not an Optuna journal (line {n} is not a JSON log entry)", STORAGE_HINT
                )


def _check_optuna_sqlite(p: Path) -> None:
    """An existing non-empty ``*.db`` must be an SQLite database with Optuna's tables: Optuna would
    otherwise add its tables to another program's database (or fail on a file that is no database)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise AutoparError(f"--storage {p} is not an SQLite database ({exc})", STORAGE_HINT) from None
    if tables and not {"studies", "version_info"} <= tables:
        shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
        raise AutoparError(
            f"--storage {p} is an SQLite database of another program (tables {shown}), not an Optuna one; "
            "autopar does not add its tables to it",
            "pass a new or an Optuna *.db file",
        )


def torn_path(p: Path) -> Path:
    """Where :func:`repair_torn_tail` keeps the bytes of a cut last journal line."""
    return p.with_name(p.name + ".torn")


def _torn_tail(p: Path) -> int:
    """How many bytes follow the journal's last newline (0: it ends with a complete entry)."""
    size = os.path.getsize(p)
    if size == 0:
        return 0
    with open(p, "rb") as fh:
        pos, chunk = size, 1 << 16
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            buf = fh.read(pos - start)
            nl = buf.rfind(b"\n")
            if nl >= 0:
                return size - (start + nl + 1)
            pos = start
    return size


def repair_torn_tail(p: Path, lock: Any, *, say: Callable[[str], Any] | None = None) -> int:
    """Cut a torn last line off a journal, keeping its bytes in ``<journal>.torn``; the bytes moved.

    A writer killed mid-append (``kill -9``, a full disk) leaves a last line without its newline.
    Optuna's replay skips it, but its next append would be written after it, making one corrupt
    line that no later read gets past. Under the journal's lock (no writer is mid-append), the
    torn bytes are appended to the side file (fsynced) and only then cut from the journal, which
    ends at its last complete entry again; ``say`` gets one line about it.
    """
    if not p.exists() or _torn_tail(p) == 0:
        return 0
    try:
        lock.acquire()
    except OSError as exc:
        raise AutoparError(
            f"--storage {p}: its last line was cut and the journal cannot be locked to repair it: {exc.strerror}",
            "run the command where the journal's directory is writable",
        ) from None
    try:
        n = _torn_tail(p)  # again, under the lock
        if n == 0:
            return 0
        size = os.path.getsize(p)
        with open(p, "rb") as fh:
            fh.seek(size - n)
            torn = fh.read(n)
        side = torn_path(p)
        try:
            _append_side(side, torn + b"\n")
            os.truncate(p, size - n)
            with open(p, "rb+") as fh:
                os.fsync(fh.fileno())
        except OSError as exc:
            raise AutoparError(
                f"--storage {p}: its last line was cut ({n} bytes) and cannot be set aside in {side}: "
                f"{exc.strerror}",
                "free disk space and run the command again (the journal is unchanged)",
            ) from None
    finally:
        lock.release()
    if say is not None:
        say(
            f"note: study journal {p}: its last line was cut ({n} bytes: a killed write or a full disk); "
            f"kept them in {side} and resumed from the last complete entry"
        )
    return n


def _append_side(side: Path, data: bytes) -> None:
    """Append ``data`` to a file (a journal or its side file) and fsync it; on failure it is as it was
    (or absent again, where the append created it)."""
    existed = side.exists()
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                if not existed:
                    side.unlink()
            raise
    finally:
        os.close(fd)


def repair_spliced(p: Path, lock: Any, *, say: Callable[[str], Any] | None = None) -> int:
    """Split lines made of a cut entry followed by a whole one; the number of lines repaired.

    Optuna (and autopar before it repaired torn tails) appends after a cut last line, which leaves
    one line no replay gets past. Under the journal's lock, the cut bytes of each such line go to
    ``<journal>.torn`` (fsynced) and the journal is rewritten atomically with the whole entries only
    (the bytes before the first such line are unchanged, so no reader's offsets move).
    """
    with open(p, "rb") as fh:
        if not any(_spliced_at(ln) is not None for ln in fh if ln.endswith(b"\n") and not _is_entry(ln)):
            return 0
    from autopar.files import atomic_path

    lock.acquire()
    try:
        lines = p.read_bytes().splitlines(keepends=True)
        cut: list[bytes] = []
        out: list[bytes] = []
        for ln in lines:
            at = _spliced_at(ln) if ln.endswith(b"\n") and not _is_entry(ln) else None
            if at is None:
                out.append(ln)
            else:
                cut.append(ln[:at] + b"\n")
                out.append(ln[at:])
        if not cut:
            return 0
        side = torn_path(p)
        try:
            _append_side(side, b"".join(cut))
        except OSError as exc:
            raise AutoparError(
                f"--storage {p}: cannot set the cut bytes of {len(cut)} line(s) aside in {side}: {exc.strerror}",
                "free disk space and run the command again (the journal is unchanged)",
            ) from None
        with atomic_path(p, "study journal", "--storage") as tmp:
            tmp.write_bytes(b"".join(out))
    finally:
        lock.release()
    if say is not None:
        say(
            f"note: study journal {p}: {len(cut)} line(s) held the cut start of an entry followed by a whole "
            f"one (an earlier write was killed, then appended after); kept the cut bytes in {side} and the "
            "whole entries in the journal"
        )
    return len(cut)


def _is_entry(line: bytes) -> bool:
    try:
        d = json.loads(line)
    except ValueError:
        return False
    return isinstance(d, dict) and "op_code" in d


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _journal_backend(path: str, lock: Any) -> Any:
    """Optuna's journal file backend, except that an append either lands whole or not at all.

    Optuna's own writes with buffered I/O: a full disk leaves half a line (or, for a new study, an
    empty file it created up front). Here the file is created by the first append, each append is
    written with ``os.write`` under the lock, fsynced, and on any error cut back to its old size (a
    file the append created is removed); the error is one line.
    """
    from optuna.storages.journal import JournalFileBackend

    class SafeJournalFileBackend(JournalFileBackend):
        def __init__(self, file_path: str, lock_obj: Any) -> None:
            self._file_path = file_path
            self._lock = lock_obj
            self._log_number_offset = {0: 0}

        def read_logs(self, log_number_from: int) -> Any:
            if not os.path.exists(self._file_path):
                return iter(())
            return super().read_logs(log_number_from)

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
            try:
                self._lock.acquire()
                try:
                    _append_side(Path(self._file_path), data)
                finally:
                    self._lock.release()
            except OSError as exc:
                left = (
                    "the journal is left at its last complete entry"
                    if os.path.exists(self._file_path)
                    else "no journal was created"
                )
                raise AutoparError(
                    f"study journal {self._file_path}: cannot write: {exc.strerror} ({left})",
                    "free disk space, then run the same command again to resume",
                ) from None

    return SafeJournalFileBackend(path, lock)


def check_storage(storage: str | Path | None, *, must_exist: bool = False) -> None:
    """The checks of :func:`resolve_storage` that need no storage opened (nothing is created)."""
    s = str(storage or DEFAULT_STORAGE)
    if not s.strip():
        raise AutoparError("--storage is empty", STORAGE_HINT)
    if "://" in s:
        return
    p = Path(s).expanduser()
    _check_storage_file(p, must_exist=must_exist, journal=p.suffix not in SQLITE_SUFFIXES)


def resolve_storage(
    storage: str | Path | None,
    *,
    must_exist: bool = False,
    read_only: bool = False,
    heartbeat: Heartbeat | None = None,
) -> Any:
    """An Optuna storage: a URL (opened here, so a missing driver is one line), ``*.db``/``*.sqlite``
    as SQLite (an existing file must be an Optuna database), any other path a journal file (checked:
    regular UTF-8 file of Optuna log entries, or a new one in an existing directory; ``must_exist``
    for commands that only read). A journal whose last line was cut, or with a line spliced from a
    cut entry and a whole one, is repaired first (:func:`repair_torn_tail`, :func:`repair_spliced`)
    unless ``read_only`` (Optuna's replay skips a cut last line; a spliced one is refused).

    A database server URL (not SQLite) gets Optuna's heartbeats per ``heartbeat`` (default
    :class:`Heartbeat`): a running trial whose worker stops beating for the grace period is failed
    and retried (:func:`run_study`)."""
    from optuna.storages.journal import JournalFileSymlinkLock, JournalStorage

    s = str(storage or DEFAULT_STORAGE)
    if not s.strip():
        raise AutoparError("--storage is empty", STORAGE_HINT)
    if "://" in s:
        hb = heartbeat or Heartbeat()
        return _rdb(s, _shown_url(s), None if s.startswith("sqlite") or read_only else hb)
    p = Path(s).expanduser()
    if p.suffix in SQLITE_SUFFIXES:
        _check_storage_file(p, must_exist=must_exist, journal=False)
        return _rdb(f"sqlite:///{p.resolve()}", str(p))
    _check_storage_file(p, must_exist=must_exist, journal=True, spliced_ok=not read_only)
    # Optuna's default lock kind (so other Optuna writers of the same file interoperate). A writer
    # killed while holding it leaves the lock behind; the next writer breaks it after the grace
    # period (it is held only while one line is appended).
    lock = JournalFileSymlinkLock(str(p), grace_period=10)
    if not read_only and p.exists():
        repair_spliced(p, lock, say=lambda line: sys.stderr.write(line + "\n"))
        repair_torn_tail(p, lock, say=lambda line: sys.stderr.write(line + "\n"))
    try:
        st = JournalStorage(_journal_backend(str(p), lock))
        st.get_all_studies()  # replays the journal: a corrupt one fails here, as one line
        return st
    except Exception as exc:  # noqa: BLE001 - a corrupt journal: Optuna's replay raises anything
        raise AutoparError(
            f"--storage {p} is not a readable Optuna journal: {type(exc).__name__}: {_first_line(exc)}",
            STORAGE_HINT,
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else "no detail"


@dataclass(frozen=True)
class Heartbeat:
    """Optuna's heartbeat settings for a study on a database server: every ``interval`` seconds each
    worker records that its running trials are alive; a running trial whose last beat is older than
    ``grace_period`` (default: twice the interval, as in Optuna) is failed by the next worker that
    looks, and retried up to ``max_retry`` times (Optuna's ``RetryFailedTrialCallback``).
    ``interval`` 0 turns heartbeats off."""

    interval: int = 10
    grace_period: int | None = None
    max_retry: int = 3

    def __post_init__(self) -> None:
        if self.interval < 0:
            raise AutoparError(
                f"heartbeat interval {self.interval} must be >= 0 s", "pass --heartbeat-interval >= 0"
            )
        if self.grace_period is not None and self.grace_period <= self.interval:
            raise AutoparError(
                f"grace period {self.grace_period} s must be longer than the heartbeat interval {self.interval} s",
                "pass --grace-period above --heartbeat-interval (default: twice it)",
            )


def _shown_url(url: str) -> str:
    """A storage URL as printed: without its password."""
    try:
        from sqlalchemy.engine import make_url

        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: Optuna's open says why
        return url.split("@", 1)[-1] if "@" in url else url


# pg_advisory_lock key under which processes opening a PostgreSQL storage create Optuna's tables
# one at a time (Optuna's create_all, run by several processes on an empty database at once,
# fails with a unique violation in PostgreSQL's catalog).
_PG_SCHEMA_LOCK = 0x6175746F706172  # "autopar"


@contextlib.contextmanager
def _pg_schema_lock(url: str) -> Iterator[None]:
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_SCHEMA_LOCK})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_SCHEMA_LOCK})
                conn.commit()
    finally:
        engine.dispose()


def _rdb(url: str, shown: str, heartbeat: Heartbeat | None = None) -> Any:
    import optuna

    kw: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the heartbeat and retry APIs are marked experimental
            if heartbeat is not None and heartbeat.interval > 0:
                kw = {
                    "heartbeat_interval": heartbeat.interval,
                    "grace_period": heartbeat.grace_period,
                    "heartbeat_stale_trial_callback": optuna.storages.RetryFailedTrialCallback(
                        max_retry=heartbeat.max_retry
                    ),
                }
            if url.startswith("postgresql"):
                with _pg_schema_lock(url):
                    return optuna.storages.RDBStorage(url, **kw)
            return optuna.storages.RDBStorage(url, **kw)
    except Exception as exc:  # noqa: BLE001 - a missing driver, a bad URL, a file that is no database
        raise AutoparError(
            f"cannot open study storage {shown}: {type(exc).__name__}: {_first_line(exc)}", STORAGE_HINT
        ) from None


@contextlib.contextmanager
def _ask_lock(cfg_storage: Any, study: Any = None) -> Iterator[None]:
    """Serialize "count the trials, then ask one" across every process running the study.

    With a local journal or SQLite file: an exclusive ``flock`` on the file. With PostgreSQL: a
    transaction holding an advisory lock keyed by the study's id (``pg_advisory_xact_lock``), so the
    count and the new trial are one step in the database itself, whichever machine the processes
    run on (the lock goes with the transaction: a killed worker's connection closes and releases
    it). A row lock on the study's row would not do: Optuna's own connection locks that row
    ``FOR UPDATE`` to number a new trial, and would wait on this one forever. Other database
    servers have no such lock here and may overshoot by a trial per extra process.
    """
    engine = _pg_engine(study._storage) if study is not None else None
    if engine is not None:
        import sqlalchemy

        with engine.connect() as conn, conn.begin():
            conn.execute(
                sqlalchemy.text("SELECT pg_advisory_xact_lock(:k, :sid)"),
                {"k": _PG_CLAIM_LOCK, "sid": study._study_id},
            )
            yield
        return
    p = None if _is_storage_obj(cfg_storage) else storage_file(cfg_storage)
    if p is None and isinstance(cfg_storage, str) and cfg_storage.startswith("sqlite:///"):
        p = Path(cfg_storage[len("sqlite:///") :])
    if p is None or not p.exists():
        yield
        return
    import fcntl

    with open(p, "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# first key of the pg_advisory_xact_lock(key, study_id) that serializes a study's count-and-ask
_PG_CLAIM_LOCK = 0x61757470  # "autp"


def _pg_engine(storage: Any) -> Any:
    """The SQLAlchemy engine of an Optuna RDB storage on PostgreSQL, else None."""
    storage = getattr(storage, "_backend", storage)  # a study's RDB storage is wrapped in a cache
    engine = getattr(storage, "engine", None)
    dialect = getattr(getattr(engine, "dialect", None), "name", None)
    return engine if dialect == "postgresql" else None


def make_sampler(name: str, seed: int, *, multi: bool) -> Any:
    """One factory for every sampler autopar uses: explicit seed, recorded by the caller."""
    import optuna

    if name == "tpe":
        with (
            warnings.catch_warnings()
        ):  # group=True is "experimental" since 2.8; it is what conditional spaces need
            warnings.simplefilter("ignore")
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=50)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "bruteforce":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.samplers.BruteForceSampler(seed=seed)
    raise AutoparError(f"unknown sampler {name!r}", f"use one of: {', '.join(SAMPLERS)}")


# --------------------------------------------------------------------------------- trial space
@dataclass(frozen=True)
class Candidate:
    layout: Layout
    plan: StagePlan | None
    repaired: bool

    @property
    def key(self) -> str:
        d: dict[str, Any] = self.layout.model_dump()
        if self.plan is not None:
            d["stage_layers"] = list(self.plan.layers)
            d["stage_recompute"] = list(self.plan.recompute)
        return json.dumps(d, sort_keys=True)

    def short(self) -> str:
        s = self.layout.short()
        if self.plan is not None:
            s += f" | stages {self.plan.short()}"
        return s


def _log2(x: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0))


def shift_param(i: int) -> str:
    """Optuna parameter: layers of pipeline stage ``i`` minus its even share."""
    return f"stage{i}_layer_shift"


def recompute_param(i: int) -> str:
    """Optuna parameter: the recompute mode of pipeline stage ``i``."""
    return f"stage{i}_recompute"


def stages_param(mode: str) -> str:
    """Optuna parameter (monotone recompute): how many stages run recompute ``mode``."""
    return f"stages_with_{mode}_recompute"


class TrialSpace:
    """Optuna parameters of a search space and the map from a proposal to a legal layout.

    Uniform axes are one categorical parameter each (axes with a single value are not suggested);
    an uneven space adds ``stage<i>_layer_shift`` (layers of stage i minus the even split,
    i < pp-1; the last stage takes the rest) and ``stage<i>_recompute`` per stage, or, with monotone
    recompute, ``stages_with_<mode>_recompute`` (how many stages, heaviest mode first).
    """

    def __init__(self, job: TrainingJob, space: SearchSpace) -> None:
        self.job = job
        self.space = space
        self.uneven = space.uneven_pipeline
        uniform = space.model_copy(update={"uneven_pipeline": None})
        if self.uneven is not None:
            check_model(job.model)
        self.enum: Enumeration = enumerate_space(job, uniform, enforce_limit=False)
        en = self.enum
        if self.uneven is not None:
            keep = en.S["pp"] >= 2
            if not keep.any():
                raise SearchSpaceError(
                    f"search space {space.name}: no legal layout with pp >= 2 for this job",
                    "uneven splits need at least two pipeline stages",
                )
            en.S = {k: v[keep] for k, v in en.S.items()}
            en.vmask = en.vmask[keep]
        if en.size == 0:
            raise SearchSpaceError(
                f"search space {space.name} has no legal layout for this job",
                "run `autopar recommend` with the same space to see why",
            )
        S = en.S
        self.choices: dict[str, list[Any]] = {}
        for axis in ("tp", "pp", "cp", "ep", "micro_batch", "vpp"):
            vals = sorted({int(v) for v in S[axis]})
            self.choices[axis] = vals
        if job.model.is_moe:
            self.choices["etp"] = sorted(
                {"tp" if (e == t and t > 1) else "1" for e, t in zip(S["etp"], S["tp"], strict=True)}
            )
        self.choices["sp"] = sorted({int(v) for v in S["sp"]})
        self.choices["zero"] = [int(z) for z in en.zero]
        self.choices["shard_group"] = [int(g) for g in en.shard_group]
        self.choices["offload"] = [int(o) for o in en.offload]
        per_stage_rec = self.uneven is not None and self.uneven.per_stage_recompute
        rec_names = [RECOMPUTE_CODES[int(r)] for r in en.recompute]
        if not per_stage_rec:
            self.choices["recompute"] = rec_names
        self.stage_recompute = rec_names if per_stage_rec else None
        self.monotone = (
            per_stage_rec and self.uneven is not None and self.uneven.recompute_pattern == "monotone"
        )
        # heaviest mode first (full, ..., selective, none): the order of a monotone assignment
        self.modes_heavy_first = sorted(rec_names, key=lambda r: -RECOMPUTE_ORDER.index(r))
        self.pp_max = int(S["pp"].max())
        self.choices["precision"] = [PRECISION_CODES[int(p)] for p in en.precision]
        self._coords = np.stack(
            [
                _log2(S["tp"]),
                _log2(S["pp"]),
                _log2(S["cp"]),
                _log2(S["ep"]),
                0.5 * _log2(S["micro_batch"]),
                0.5 * _log2(S["vpp"]),
            ],
            axis=1,
        )

    @property
    def params(self) -> dict[str, list[Any]]:
        """Suggested parameters (axes with more than one value)."""
        return {k: v for k, v in self.choices.items() if len(v) > 1}

    # ----------------------------------------------------------------------------- proposals
    def _pick(self, trial: Any, name: str) -> Any:
        vals = self.choices[name]
        if len(vals) == 1:
            return vals[0]
        return trial.suggest_categorical(name, vals)

    def suggest(self, trial: Any) -> Candidate:
        want = {k: self._pick(trial, k) for k in self.choices}
        layout, repaired = self._nearest(want)
        plan = None
        if self.uneven is not None:
            p, L, k = layout.pp, self.job.model.layers, self.uneven.max_shift
            base = even_split(L, p)
            shifts = [trial.suggest_int(shift_param(i), -k, k) for i in range(p - 1)]
            recs = self._stage_recompute(trial, p) if self.stage_recompute else [layout.recompute] * p
            layers, fixed = _repair_split(base, shifts, k)
            plan = StagePlan(tuple(layers), tuple(RECOMPUTE_CODES.index(r) for r in recs))
            repaired = repaired or fixed
            heaviest = max(plan.recompute, key=recompute_weight)
            layout = layout.model_copy(update={"recompute": RECOMPUTE_CODES[heaviest]})
        return Candidate(layout, plan, repaired)

    def _stage_recompute(self, trial: Any, p: int) -> list[str]:
        if not self.monotone:
            return [trial.suggest_categorical(recompute_param(i), self.stage_recompute) for i in range(p)]
        out: list[str] = []
        for mode in self.modes_heavy_first[:-1]:
            n = min(trial.suggest_int(stages_param(mode), 0, self.pp_max), p - len(out))
            out += [mode] * n
        return out + [self.modes_heavy_first[-1]] * (p - len(out))

    def _nearest(self, want: dict[str, Any]) -> tuple[Layout, bool]:
        en = self.enum
        S = en.S
        target = np.array(
            [
                np.log2(want["tp"]),
                np.log2(want["pp"]),
                np.log2(want["cp"]),
                np.log2(want["ep"]),
                0.5 * np.log2(want["micro_batch"]),
                0.5 * np.log2(want["vpp"]),
            ]
        )
        dist = np.abs(self._coords - target).sum(axis=1)
        dist = dist + 0.25 * (S["sp"] != want["sp"])
        if "etp" in want:
            dist = dist + 0.25 * ((S["etp"] == S["tp"]) & (S["tp"] > 1) != (want["etp"] == "tp"))
        s = int(np.lexsort((np.arange(len(dist)), dist))[0])
        exact = dist[s] == 0
        zi = self.choices["zero"].index(want["zero"])
        gi = self.choices["shard_group"].index(want["shard_group"])
        oi = self.choices["offload"].index(want["offload"])
        ok = en.vmask[s]
        if not ok[zi, gi, oi]:
            exact = False
            Z, G, O = np.meshgrid(
                np.arange(ok.shape[0]), np.arange(ok.shape[1]), np.arange(ok.shape[2]), indexing="ij"
            )
            d = np.abs(Z - zi) + (G != gi) + (O != oi) + np.where(ok, 0, 1000)
            zi, gi, oi = (int(x) for x in np.unravel_index(int(np.argmin(d)), ok.shape))
        cols = {k: int(S[k][s]) for k in S}
        layout = Layout(
            tp=cols["tp"],
            pp=cols["pp"],
            vpp=cols["vpp"],
            dp=cols["dp"],
            cp=cols["cp"],
            ep=cols["ep"],
            etp=cols["etp"],
            zero=int(en.zero[zi]),
            shard_group=int(en.shard_group[gi]),
            sp=bool(cols["sp"]),
            micro_batch=cols["micro_batch"],
            grad_accum=cols["grad_accum"],
            recompute=want.get("recompute", RECOMPUTE_CODES[int(en.recompute[0])]),
            offload=bool(en.offload[oi]),
            precision=want["precision"],
        )
        return layout, not exact

    def params_for(self, layout: Layout, plan: StagePlan | None = None) -> dict[str, Any]:
        """Trial parameters that propose ``layout`` (split as ``plan``, or evenly): for enqueue_trial."""
        d = layout.model_dump()
        out: dict[str, Any] = {}
        for k in self.params:
            if k == "etp":
                out[k] = "tp" if (layout.etp == layout.tp and layout.tp > 1) else "1"
            elif k in ("sp", "offload"):
                out[k] = int(d[k])
            else:
                out[k] = d[k]
        if self.uneven is not None:
            p, L = layout.pp, self.job.model.layers
            even = even_split(L, p)
            layers = list(plan.layers) if plan is not None else even
            for i in range(p - 1):
                out[shift_param(i)] = layers[i] - even[i]
            recs: list[str] = (
                [RECOMPUTE_CODES[r] for r in plan.recompute]
                if plan is not None
                else [str(layout.recompute)] * p
            )
            if self.stage_recompute and self.monotone:
                for mode in self.modes_heavy_first[:-1]:
                    out[stages_param(mode)] = recs.count(mode)
            elif self.stage_recompute:
                for i in range(p):
                    out[recompute_param(i)] = recs[i]
        return out


def _repair_split(base: list[int], shifts: list[int], k: int) -> tuple[list[int], bool]:
    """Stage layers = even split + shifts, the last stage taking the rest, each within [1, base+k]."""
    L = sum(base)
    lo = [max(1, b - k) for b in base]
    hi = [b + k for b in base]
    layers = [min(max(b + s, lo[i]), hi[i]) for i, (b, s) in enumerate(zip(base[:-1], shifts, strict=True))]
    fixed = any(b + s != v for b, s, v in zip(base[:-1], shifts, layers, strict=True))
    rest = L - sum(layers)
    # Move layers into or out of the earlier stages until the last stage is within its bounds.
    i = 0
    while rest < lo[-1] or rest > hi[-1]:
        j = len(layers) - 1 - (i % len(layers))
        if rest < lo[-1] and layers[j] > lo[j]:
            layers[j] -= 1
            rest += 1
        elif rest > hi[-1] and layers[j] < hi[j]:
            layers[j] += 1
            rest -= 1
        i += 1
        fixed = True
    return layers + [rest], fixed


# ------------------------------------------------------------------------------------ scoring
class TrialScorer:
    """Scores candidates (uniform layouts with the engine, uneven ones with UnevenScorer)."""

    def __init__(self, job: TrainingJob, objectives: Objectives, calibration: Calibration) -> None:
        self.job, self.objectives, self.cal = job, objectives, calibration
        self._uneven: UnevenScorer | None = None

    def score(self, cands: Sequence[Candidate]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in cands]
        uni = [i for i, c in enumerate(cands) if c.plan is None]
        if uni:
            table = LayoutTable.from_layouts([cands[i].layout for i in uni])
            res = evaluate(self.job, table, calibration=self.cal)
            for j, i in enumerate(uni):
                out[i] = self._record(
                    {
                        "step_time_s": float(res["step_time_s"][j]),
                        "memory_gib_per_device": float(res["memory_bytes"][j]) / GIB,
                        "memory_capacity_gib": float(res["memory_capacity_bytes"][j]) / GIB,
                        "memory_limit_gib": float(res["memory_limit_bytes"][j]) / GIB,
                        "fits": bool(res["fits"][j]),
                        "energy_j_per_step": float(res["energy_j_per_step"][j]),
                    }
                )
        for i, c in enumerate(cands):
            if c.plan is not None:
                if self._uneven is None:
                    self._uneven = UnevenScorer(self.job, self.cal)
                r = self._uneven.score(c.layout, c.plan)
                r["energy_j_per_step"] = None  # not modeled for uneven splits
                out[i] = self._record(r)
        return out

    def _record(self, r: dict[str, Any]) -> dict[str, Any]:
        job, ob = self.job, self.objectives
        tokens = job.tokens_per_step
        energy = r["energy_j_per_step"]  # None for uneven splits (not modeled)
        r["tokens_per_s_per_device"] = tokens / (r["step_time_s"] * job.num_devices)
        r["energy_j_per_token"] = None if energy is None else energy / tokens
        r["cost_usd_per_million_tokens"] = float(
            cost_per_mtok(
                r["tokens_per_s_per_device"],
                ob.price_per_device_hour,
                joules_per_token=r["energy_j_per_token"] or 0.0,
                price_per_kwh=ob.price_per_kwh,
            )
        )
        r["values"] = [r[TRAINING[n].metric] for n in ob.names]
        # Over the limit (capacity less the job's memory headroom) is infeasible, as in predict.
        r["constraint"] = r["memory_gib_per_device"] - r["memory_limit_gib"]
        return r


# -------------------------------------------------------------------------------------- study
@dataclass
class StudyConfig:
    """One study. ``job`` is a :class:`~autopar.job.Job` (resolved here) or an already resolved
    :class:`TrainingJob`; ``calibration`` defaults to the job's."""

    name: str
    job: TrainingJob
    space: SearchSpace
    objectives: Objectives
    sampler: str | None = None
    seed: int | None = None
    storage: Any = None
    calibration: str | None = None
    seed_top_k: int = 10
    batch: int = 8
    structured_seeds: bool = True
    # a database server's heartbeats (default Heartbeat(): 10 s, grace 20 s); ignored for local files
    heartbeat: Heartbeat | None = None
    # score each batch's new proposals as Ray tasks: "local" (embedded) or a cluster address
    ray: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.job, Job):
            self.job = self.job.resolve()
        if self.calibration is None:
            self.calibration = self.job.job.calibration


@dataclass
class StudyReport:
    name: str
    sampler: str
    seed: int
    objectives: tuple[str, ...]
    n_complete: int
    n_failed: int
    n_running: int
    n_cached: int
    n_repaired: int
    new_trials: int
    resumed: bool
    best: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)
    # every complete trial in order (trial, fits, tokens/s/device, memory GiB): the report's history plot
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "job": self.attrs.get("job")}
        out.update((k, getattr(self, k)) for k in self.__dataclass_fields__ if k != "history")
        return out


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_stale_trials(study: Any, *, untagged_after_s: float = 30.0) -> int:
    """Mark RUNNING trials of dead workers FAIL (a killed run leaves its in-flight trials RUNNING);
    how many this call failed.

    On a storage with heartbeats (a database server, :class:`Heartbeat`) a trial is dead when its
    last heartbeat is older than the grace period (Optuna's ``fail_stale_trials``), whichever
    machine ran it; each is retried (Optuna's ``RetryFailedTrialCallback``: a waiting copy with the
    same parameters, which the next ask takes). Without heartbeats (a local journal or SQLite file)
    a trial is tagged with its worker (host:pid) right after it is created, and a tagged trial of a
    dead local process is failed at once (not retried: its study's total counts it).

    Either way, a process killed between creating a trial and tagging it (or recording its first
    heartbeat) leaves an untagged one: that is failed (and, with heartbeats, retried) once it is
    older than ``untagged_after_s`` (trials live for milliseconds; with heartbeats, the grace period
    if shorter).
    """
    import datetime as dt

    import optuna
    from optuna.trial import TrialState

    storage = study._storage
    beats = _heartbeat_interval(storage) is not None
    n = 0
    if beats:
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # marked experimental since Optuna 2.9
            optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        n += len(before - after)
    if beats:  # an untagged trial has no heartbeat either: it is stale after the grace period
        grace = getattr(storage, "grace_period", None) or 2 * (_heartbeat_interval(storage) or 0)
        untagged_after_s = min(untagged_after_s, float(grace))
    host = socket.gethostname()
    now = dt.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker", "")
        h, _, pid = w.rpartition(":")
        dead = not beats and h == host and pid.isdigit() and not _pid_alive(int(pid))
        stale = (
            not w
            and t.datetime_start is not None
            and (now - t.datetime_start).total_seconds() > untagged_after_s
        )
        if not (dead or stale):
            continue
        try:
            changed = storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another process failed it first
            continue
        if not changed:
            continue
        n += 1
        retry = storage.get_heartbeat_stale_trial_callback() if beats else None
        if retry is not None:
            retry(study, storage.get_trial(t._trial_id))
    return n


def _heartbeat_interval(storage: Any) -> int | None:
    """The storage's heartbeat interval in seconds, or None where it has none."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


def counted_trials(study: Any) -> int:
    """The trials that count toward ``--n-trials``: complete, pruned, running, and failed ones that
    were not retried (a dead worker's trial retried by :func:`fail_stale_trials` counts once, as its
    retry)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    live = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(t.state in live or (t.state == TrialState.FAIL and t.number not in retried) for t in trials)


class _Beats:
    """Record a heartbeat for each in-flight trial every ``interval`` seconds, from a thread that
    runs while the session does (the first beat of a trial is recorded when it is created; the
    thread covers it from then until it is told, including while this process waits for the lock
    to ask the rest of its batch). A beat that cannot be written is skipped: the trial then goes
    stale and is retried by another worker, and this one's tell is refused."""

    def __init__(self, storage: Any, interval: int | None) -> None:
        import threading

        self.storage, self.interval = storage, interval
        self.ids: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="autopar-heartbeat", daemon=True)

    def __enter__(self) -> _Beats:
        if self.interval:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.interval:
            self.stop.set()
            self.thread.join()

    def add(self, trial_id: int) -> None:
        with self.lock:
            self.ids.add(trial_id)

    def done(self, trial_id: int) -> None:
        with self.lock:
            self.ids.discard(trial_id)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            with self.lock:
                ids = sorted(self.ids)
            for i in ids:
                with contextlib.suppress(Exception):
                    self.storage.record_heartbeat(i)


def _job_attrs(cfg: StudyConfig) -> dict[str, Any]:
    return {
        "job": cfg.job.info(),
        "space": cfg.space.name,
        "space_fingerprint": cfg.space.fingerprint(),
        "objectives": list(cfg.objectives.names),
        "price_per_device_hour": cfg.objectives.price_per_device_hour,
        "calibration": cfg.calibration or "default",
    }


def open_study(cfg: StudyConfig) -> tuple[Any, bool, str, int]:
    """Create or load the named study; returns (study, resumed, sampler name, base seed)."""
    import optuna
    from optuna.exceptions import DuplicatedStudyError

    from autopar.files import check_study_name

    check_study_name(cfg.name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = (
        resolve_storage(cfg.storage, heartbeat=cfg.heartbeat)
        if not _is_storage_obj(cfg.storage)
        else cfg.storage
    )
    directions: list[Any] = [TRAINING[n].direction for n in cfg.objectives.names]
    attrs = _job_attrs(cfg)
    try:
        existing = optuna.load_study(
            study_name=cfg.name, storage=storage, sampler=optuna.samplers.RandomSampler(0)
        )
    except KeyError:
        existing = None
    if existing is not None:
        ua = _wait_until_ready(existing, cfg.name)
        for k, v in attrs.items():
            if ua.get(k) != json.loads(json.dumps(v)):
                raise AutoparError(
                    f"study {cfg.name!r} was created with {k}={ua.get(k)!r}, not {v!r}",
                    "resume it with the same job, space and objectives, or pick another --name",
                )
        if cfg.sampler is not None and cfg.sampler != ua.get("sampler"):
            raise AutoparError(
                f"study {cfg.name!r} uses sampler {ua.get('sampler')!r}, not {cfg.sampler!r}",
                "omit --sampler to resume with the recorded one",
            )
        if cfg.seed is not None and cfg.seed != ua.get("seed"):
            raise AutoparError(
                f"study {cfg.name!r} uses seed {ua.get('seed')!r}, not {cfg.seed!r}",
                "omit --seed to resume with the recorded one",
            )
        sampler_name, seed = ua["sampler"], int(ua["seed"])
        return existing, True, sampler_name, seed
    sampler_name = cfg.sampler or "tpe"
    seed = 0 if cfg.seed is None else int(cfg.seed)
    if sampler_name not in SAMPLERS:
        raise AutoparError(f"unknown sampler {sampler_name!r}", f"use one of: {', '.join(SAMPLERS)}")
    try:
        study = optuna.create_study(
            study_name=cfg.name,
            storage=storage,
            directions=directions,
            sampler=make_sampler(sampler_name, seed, multi=len(directions) > 1),
        )
    except DuplicatedStudyError:  # created concurrently by another process: join it
        return open_study(cfg)
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    study.set_user_attr("sampler", sampler_name)
    study.set_user_attr("seed", seed)
    study.set_user_attr("optuna_version", optuna.__version__)
    study.set_user_attr("autopar_version", __version__)
    study.set_user_attr("space_def", cfg.space.to_dict())
    names = [TRAINING[n].metric for n in cfg.objectives.names]
    study.set_user_attr("objective_names", names)
    study.set_user_attr("constraint", f"{CONSTRAINT} <= 0")
    # Optuna's own metric names: optuna-dashboard and study.trials_dataframe() show them (the API
    # is marked experimental, stable since Optuna 3.2: its warning is not for autopar's users).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.set_metric_names(names)
    study.set_user_attr(READY_ATTR, True)  # last: a process joining the study waits for it
    return study, False, sampler_name, seed


READY_ATTR = "autopar_ready"
READY_WAIT_S = 30.0


def _ready(ua: dict[str, Any]) -> bool:
    # "constraint" was the last attribute set before READY_ATTR existed (older studies lack it).
    return bool(ua.get(READY_ATTR)) or "constraint" in ua


def _wait_until_ready(study: Any, name: str) -> dict[str, Any]:
    """The study's user attributes once its creator has written them all.

    A process that loads a study another process is still creating would otherwise compare its job
    with attributes that are not there yet (and report a false mismatch).
    """
    deadline = time.monotonic() + READY_WAIT_S
    ua = study.user_attrs
    while not _ready(ua):
        if time.monotonic() > deadline:
            raise AutoparError(
                f"study {name!r} exists but its creation never finished (no {READY_ATTR} attribute)",
                "its creator was interrupted: run with another --name, or delete the study",
            )
        time.sleep(0.2)
        ua = study._storage.get_study_user_attrs(study._study_id)
    return ua


def _is_storage_obj(s: Any) -> bool:
    return s is not None and not isinstance(s, str | Path)


def enqueue_seeds(study: Any, tspace: TrialSpace, cfg: StudyConfig, cal: Calibration, n_trials: int) -> int:
    """Enqueue the exhaustive top-k (uniform sub-space, even split) as the first trials.

    At most as many as the study's ``n_trials`` leaves room for, counted under the ask lock with the
    trials already waiting: a process that joined the study meanwhile may have run trials while the
    seeds were being searched, and a seed enqueued past the total would be left waiting forever
    (every ask takes the waiting trials first, so within the total they are all run).
    """
    from optuna.trial import TrialState

    if cfg.seed_top_k <= 0:
        return 0
    uniform = cfg.space.model_copy(update={"uneven_pipeline": None})
    if cfg.space.uneven_pipeline is not None:
        uniform = uniform.model_copy(
            update={
                "axes": uniform.axes.model_copy(
                    update={"pp": uniform.axes.pp.model_copy(update={"min": max(2, uniform.axes.pp.min)})}
                )
            }
        )
    try:
        r = search_layouts(
            cfg.job,
            uniform,
            top=cfg.seed_top_k,
            objectives=cfg.objectives,
            calibration=cal,
            explain_infeasible=False,
        )
    except AutoparError:
        return 0
    layouts = [p.layout for p in (r.pareto if len(cfg.objectives.names) > 1 else r.results)][: cfg.seed_top_k]
    items: list[tuple[dict[str, Any], str]] = [
        (tspace.params_for(lay), "exhaustive top-k") for lay in layouts
    ]
    up = cfg.space.uneven_pipeline
    if up is not None and cfg.structured_seeds:
        # For each seed's base layout, the best split under monotone recompute (uneven.balanced_split).
        scorer = UnevenScorer(cfg.job, cal)
        modes = [RECOMPUTE_CODES.index(m) for m in tspace.stage_recompute] if tspace.stage_recompute else None
        seen: set[str] = set()
        for lay in layouts:
            base_key = json.dumps(
                {k: v for k, v in lay.model_dump().items() if k != "recompute"}, sort_keys=True
            )
            if base_key in seen:
                continue
            seen.add(base_key)
            got = best_monotone_split(
                scorer, lay, modes or [RECOMPUTE_CODES.index(lay.recompute)], up.max_shift
            )
            if got is not None:
                items.append((tspace.params_for(lay, got[1]), "balanced split"))
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
    with _ask_lock(cfg.storage, study):
        room = max(n_trials - len(study.get_trials(deepcopy=False, states=states)), 0)
        kept = items[:room]
        for params, kind in kept:
            study.enqueue_trial(params, user_attrs={"seed_trial": kind}, skip_if_exists=True)
    study.set_user_attr("seeded_top_k", sum(kind == "exhaustive top-k" for _, kind in kept))
    if up is not None and cfg.structured_seeds:
        study.set_user_attr("seeded_balanced_splits", sum(kind == "balanced split" for _, kind in kept))
    return len(kept)


def _score(scorer: TrialScorer, cands: list[Candidate], ray: Any) -> list[dict[str, Any]]:
    """Score the candidates here, or (``ray``) as Ray tasks, one per cluster CPU at most."""
    if ray is None or not cands:
        return scorer.score(cands)
    from autopar.search.ray_backend import cluster_cpus, map_tasks

    n = max(1, min(len(cands), cluster_cpus(ray)))
    size = -(-len(cands) // n)
    parts = [(scorer, cands[i : i + size]) for i in range(0, len(cands), size)]
    return [r for got in map_tasks(_score_part, parts, address=ray) for r in got]


def _score_part(item: tuple[TrialScorer, list[Candidate]]) -> list[dict[str, Any]]:
    scorer, cands = item
    return scorer.score(cands)


def _cache_from_storage(study: Any) -> dict[str, dict[str, Any]]:
    from optuna.trial import TrialState

    cache: dict[str, dict[str, Any]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        r = t.user_attrs.get("result")
        if t.user_attrs.get("key") and r is not None:
            cache[t.user_attrs["key"]] = r
    return cache


def run_study(
    cfg: StudyConfig,
    *,
    n_trials: int,
    timeout: float | None = None,
    on_trial: Callable[[int, Candidate, dict[str, Any], bool], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> StudyReport:
    """Create or resume the study and run it until it has ``n_trials`` trials (or timeout).

    ``n_trials`` is the study's total over every process running it: finished trials (complete,
    pruned, failed) plus those in flight; with a local journal or SQLite file the count and the
    ask are one locked step, so concurrent processes stop at exactly ``n_trials``.

    ``on_trial(number, candidate, result, cached)`` is called after each trial is stored; ``stop()``
    is checked between batches.
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    if timeout is not None and not timeout > 0:
        raise AutoparError(f"timeout {timeout} must be > 0 seconds", "pass --timeout > 0, or omit it")
    t0 = time.perf_counter()
    cal = load_calibration(cfg.calibration)
    tspace = TrialSpace(cfg.job, cfg.space)
    if "energy" in cfg.objectives.names and tspace.uneven is not None:
        raise AutoparError(
            "the energy objective is not modeled for uneven pipeline splits", "use throughput, memory or cost"
        )
    study, resumed, sampler_name, seed = open_study(cfg)
    with _ask_lock(cfg.storage, study):  # a retry it queues is one step with the count, as below
        fail_stale_trials(study)
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    # A resumed session must not replay the first session's random proposals: offset the seed by
    # the trials already in the study (deterministic, and recorded).
    session_seed = seed + len(study.get_trials(deepcopy=False))
    study.sampler = make_sampler(sampler_name, session_seed, multi=len(cfg.objectives.names) > 1)
    with _ask_lock(cfg.storage, study):  # read-modify-write of one attribute shared by every process
        sessions = list(study._storage.get_study_user_attrs(study._study_id).get("sessions", []))
        sessions.append(
            {
                "seed": session_seed,
                "complete_before": done,
                "worker": _worker_id(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
        study.set_user_attr("sessions", sessions)
    if not resumed:
        enqueue_seeds(study, tspace, cfg, cal, n_trials)
    scorer = TrialScorer(cfg.job, cfg.objectives, cal)
    cache = _cache_from_storage(study)
    ckey = constraints_key()
    # --n-trials counts finished trials (complete, pruned, failed) plus those in flight, over every
    # process that runs the study (Optuna's MaxTrialsCallback counts the same way when told these states).
    # --n-trials counts finished trials (complete, pruned, failed and not retried) plus those in
    # flight, over every process that runs the study: counted and asked as one locked step.
    storage = study._storage
    beat = _heartbeat_interval(storage)
    new = 0
    worker = _worker_id()
    with _Beats(storage, beat) as beats:
        while (timeout is None or time.perf_counter() - t0 < timeout) and not (stop and stop()):
            trials = []
            others_running = False
            for i in range(cfg.batch):
                with _ask_lock(cfg.storage, study):  # count and ask as one step across processes
                    if i == 0 and beat is not None:
                        fail_stale_trials(study)
                    if counted_trials(study) >= n_trials:
                        # With heartbeats, a trial another worker is running may yet go stale and be
                        # retried: stay until none is left, so the total ends exact.
                        others_running = beat is not None and bool(
                            study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                        )
                        break
                    t = study.ask()
                    if beat is not None:
                        storage.record_heartbeat(t._trial_id)
                        beats.add(t._trial_id)
                    t.set_user_attr("worker", worker)
                trials.append(t)
            if not trials:
                if others_running:
                    time.sleep(min(1.0, float(beat or 1)))
                    continue
                break
            cands = [tspace.suggest(t) for t in trials]
            todo = [i for i, c in enumerate(cands) if c.key not in cache]
            uniq: dict[str, int] = {}
            for i in todo:
                uniq.setdefault(cands[i].key, i)
            scored = _score(scorer, [cands[i] for i in uniq.values()], cfg.ray)
            for (key, _), r in zip(uniq.items(), scored, strict=True):
                cache[key] = r
            for i, (t, c) in enumerate(zip(trials, cands, strict=True)):
                r = cache[c.key]
                cached = i not in uniq.values()
                try:
                    t.set_user_attr("key", c.key)
                    t.set_user_attr("layout", c.short())
                    t.set_user_attr(
                        "result", {k: v for k, v in r.items() if k != "values"} | {"values": r["values"]}
                    )
                    t.set_user_attr("fits", r["fits"])
                    t.set_user_attr("cached", cached)
                    t.set_user_attr("repaired", c.repaired)
                    # Optuna's constraints system attribute (what a sampler's constraints_func
                    # writes, and what optuna-dashboard reads): one value, feasible when <= 0; its
                    # name is the study's "constraint" attribute.
                    storage.set_trial_system_attr(t._trial_id, ckey, [float(r["constraint"])])
                    study.tell(t, r["values"])
                except UpdateFinishedTrialError:
                    continue  # failed as stale meanwhile (heartbeats not written): retried elsewhere
                finally:
                    beats.done(t._trial_id)
                new += 1
                if on_trial is not None:
                    on_trial(t.number, c, r, cached)
    report = study_report(study, top=5)
    report.new_trials, report.resumed, report.elapsed_s = new, resumed, time.perf_counter() - t0
    return report


def study_report(study: Any, *, top: int = 5) -> StudyReport:
    """Counts and the best feasible trials (top-k, or the Pareto front for several objectives)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    ua = study.user_attrs
    names = tuple(ua.get("objectives", []))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    feas = [t for t in complete if t.user_attrs.get("fits")]
    signs = np.array([-1.0 if TRAINING[n].direction == "maximize" else 1.0 for n in names])
    best: list[Any] = []
    if feas:
        vals = np.array([t.values for t in feas], dtype=float) * signs
        nums = np.array([t.number for t in feas])
        if len(names) > 1:
            keep = pareto_mask(vals, nums)
            idx = np.flatnonzero(keep)
            idx = idx[np.lexsort((nums[idx], *vals[idx].T[::-1]))]
        else:
            idx = np.lexsort((nums, vals[:, 0]))
        seen: set[str] = set()
        for i in idx:
            key = feas[i].user_attrs.get("key", "")
            if key in seen:
                continue
            seen.add(key)
            best.append(feas[i])
            if len(best) >= (top if len(names) == 1 else max(top, 50)):
                break

    def rec(t: Any) -> dict[str, Any]:
        r = t.user_attrs.get("result", {})
        # the layout's fields by name, so that `autopar export --from-json` reads a trial like a
        # recommend record (an uneven split's per-stage layers stay in "stage_layers")
        fields = json.loads(t.user_attrs.get("key") or "{}")
        return {
            **fields,
            "trial": t.number,
            "layout": t.user_attrs.get("layout"),
            "values": dict(zip([TRAINING[n].metric for n in names], t.values, strict=True)),
            "step_time_s": r.get("step_time_s"),
            "memory_gib_per_device": r.get("memory_gib_per_device"),
            "tokens_per_s_per_device": r.get("tokens_per_s_per_device"),
            "params": t.params,
        }

    return StudyReport(
        name=study.study_name,
        sampler=ua.get("sampler", "?"),
        seed=int(ua.get("seed", -1)),
        objectives=names,
        n_complete=len(complete),
        n_failed=sum(t.state == TrialState.FAIL for t in trials),
        n_running=sum(t.state == TrialState.RUNNING for t in trials),
        n_cached=sum(bool(t.user_attrs.get("cached")) for t in complete),
        n_repaired=sum(bool(t.user_attrs.get("repaired")) for t in complete),
        new_trials=0,
        resumed=True,
        best=[rec(t) for t in best],
        attrs={k: v for k, v in ua.items() if k not in ("space_def", "sessions")},
        history=[
            {
                "trial": t.number,
                "fits": bool(t.user_attrs.get("fits")),
                "tokens_per_s_per_device": (t.user_attrs.get("result") or {}).get("tokens_per_s_per_device"),
                "memory_gib_per_device": (t.user_attrs.get("result") or {}).get("memory_gib_per_device"),
            }
            for t in sorted(complete, key=lambda t: t.number)
        ],
    )


def load_report(name: str, storage: Any = None, *, top: int = 5) -> StudyReport:
    import optuna

    from autopar.files import check_study_name

    check_study_name(name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = (
        resolve_storage(storage, must_exist=True, read_only=True) if not _is_storage_obj(storage) else storage
    )
    try:
        study = optuna.load_study(study_name=name, storage=st, sampler=optuna.samplers.RandomSampler(0))
    except KeyError:
        raise AutoparError(
            f"no study named {name!r} in {storage or DEFAULT_STORAGE}", "see `autopar study list`"
        ) from None
    return study_report(study, top=top)


def list_studies(storage: Any = None) -> list[dict[str, Any]]:
    import optuna

    st = (
        resolve_storage(storage, must_exist=True, read_only=True) if not _is_storage_obj(storage) else storage
    )
    out = []
    for s in optuna.get_all_study_summaries(storage=st, include_best_trial=False):
        out.append(
            {
                "name": s.study_name,
                "trials": s.n_trials,
                "objectives": s.user_attrs.get("objectives"),
                "sampler": s.user_attrs.get("sampler"),
                "seed": s.user_attrs.get("seed"),
                "space": s.user_attrs.get("space"),
                "job": s.user_attrs.get("job"),
            }
        )
    return out


__all__ = [
    "run_study",
    "StudyConfig",
    "StudyReport",
    "TrialSpace",
    "TrialScorer",
    "Candidate",
    "make_sampler",
    "resolve_storage",
    "load_report",
    "list_studies",
    "SAMPLERS",
    "DEFAULT_STORAGE",
    "DEFAULT_PRICE_PER_DEVICE_HOUR",
]
