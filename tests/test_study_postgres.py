"""Studies on a real PostgreSQL server, run by several worker processes that share only its URL.

A session fixture starts a throwaway cluster (``initdb`` into a temporary directory, listening on
127.0.0.1 only at a free port, its unix socket in that directory) and stops it afterwards; each test
gets a database of its own. The tests skip, and say why, only where no PostgreSQL server binaries
can be found (``.ci/run`` installs Debian's ``postgresql`` where they are missing).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'autopar[postgres]'")

pytestmark = pytest.mark.slow

JOB = ["--model", "llama-3.1-8b", "--device", "a100-80gb", "--num-devices", "16", "--seq-len", "4096"]
JOB += ["--global-batch", "64"]


def _pg_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, under Debian's /usr/lib/postgresql/<version>/bin (newest
    first), or where ``pg_config --bindir`` says."""
    cands: list[Path] = []
    if shutil.which("initdb") and shutil.which("pg_ctl"):
        cands.append(Path(shutil.which("initdb") or "").parent)
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True
    )
    cands += [Path(d) for d in versions]
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if out:
            cands.append(Path(out))
    for d in cands:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL cluster for this test session: (port, admin connection string)."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl) on PATH, in /usr/lib/postgresql/*/bin or at "
            "`pg_config --bindir`: apt-get install postgresql (.ci/run does)"
        )
    # PostgreSQL refuses to run as root: as root, the cluster runs as the postgres (or nobody) user.
    kw: dict = {}
    root = os.geteuid() == 0
    if root:
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            user = pwd.getpwnam("nobody")
        kw = {"user": user.pw_uid, "group": user.pw_gid}
    top = Path(tempfile.mkdtemp(prefix="autopar-pg-"))  # not under pytest's root-only tmp directory
    if root:
        os.chown(top, user.pw_uid, user.pw_gid)
    data, sock, log = top / "data", top / "sock", top / "server.log"
    sock.mkdir()
    if root:
        os.chown(sock, user.pw_uid, user.pw_gid)
    port = _free_port()
    try:
        subprocess.run(
            [bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
            **kw,
        )
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c max_connections=100"
        subprocess.run(
            [bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o", opts, "start"],
            check=True,
            capture_output=True,
            timeout=90,
            **kw,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(top, ignore_errors=True)
        raise AssertionError(f"PostgreSQL did not start: {exc.stderr!r} {exc.stdout!r}") from None
    try:
        yield port, f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    finally:
        subprocess.run([bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop"], capture_output=True, **kw)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server, request) -> str:
    """A new, empty database on the session's server; its Optuna URL."""
    port, admin = pg_server
    db = "t_" + request.node.name.lower().replace("[", "_").replace("]", "")[:50]
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{db}"')
        con.execute(f'CREATE DATABASE "{db}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{db}"


def _worker(url: str, name: str, n_trials: int, *extra: str) -> subprocess.Popen:
    """One "host": a separate autopar process that shares nothing with the others but the URL."""
    cmd = [sys.executable, "-m", "autopar.cli", "study", "run", "--name", name, *JOB, "--storage", url]
    cmd += ["--n-trials", str(n_trials), "--sampler", "random", "--seed-top-k", "0", "--json", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(url: str, name: str) -> list:
    import optuna

    from autopar.search.study import resolve_storage

    st = resolve_storage(url, read_only=True)
    try:
        return optuna.load_study(study_name=name, storage=st).get_trials(deepcopy=True)
    finally:
        st.remove_session()
        st.engine.dispose()


def _sql(url: str, query: str, *args) -> list[tuple]:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as con:
        return con.execute(query, args).fetchall()


RUNNING_OF = """
SELECT count(*) FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id
WHERE t.state = 'RUNNING' AND a.key = 'worker' AND a.value_json = %s
"""


def test_workers_on_postgres_stop_at_exactly_n_trials(pg_url: str) -> None:
    """Four processes, one trial per ask (--batch 1, the most contention): the study ends with
    exactly --n-trials complete trials and nothing else (the count and the ask are one step under
    the study's advisory lock)."""
    from optuna.trial import TrialState

    n = 40
    procs = [_worker(pg_url, "exact", n, "--batch", "1", "--seed", "7") for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    trials = _trials(pg_url, "exact")
    assert Counter(t.state for t in trials) == {TrialState.COMPLETE: n}
    assert sorted(t.number for t in trials) == list(range(n))
    workers = Counter(t.user_attrs["worker"] for t in trials)
    assert len(workers) >= 2, workers  # the work was shared, not done by one process
    assert sum(json.loads(out)["new_trials"] for out, _ in outs) == n


def test_a_worker_killed_mid_trial_is_retried_and_the_total_stays_exact(pg_url: str) -> None:
    """Three workers; one is stopped while it holds running trials (checked in the database while it
    is stopped), then SIGKILLed. Its trials stop beating, the others fail them after the grace
    period and run each once more with the same parameters; the study ends with exactly --n-trials
    complete trials, every failed one retried once, nothing running."""
    from optuna.trial import TrialState

    n, name = 80, "killed"
    hb = ["--heartbeat-interval", "1", "--grace-period", "3"]
    victim = _worker(pg_url, name, n, "--batch", "32", *hb)
    others = [_worker(pg_url, name, n, "--batch", "4", *hb) for _ in range(2)]
    tag = json.dumps(f"{socket.gethostname()}:{victim.pid}")
    deadline = time.monotonic() + 240
    killed_with = 0
    while time.monotonic() < deadline and victim.poll() is None:
        time.sleep(0.05)
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            held = _sql(pg_url, RUNNING_OF, tag)[0][0]
        except psycopg.Error:  # the study's tables are not created yet
            held = 0
        if held:
            os.kill(victim.pid, signal.SIGKILL)
            killed_with = held
            break
        os.kill(victim.pid, signal.SIGCONT)
    victim.communicate(timeout=30)  # reaps it and closes its pipes
    assert killed_with > 0, "the victim finished before it was caught holding a running trial"
    assert victim.returncode == -signal.SIGKILL
    outs = [p.communicate(timeout=300) for p in others]
    for p, (_, err) in zip(others, outs, strict=True):
        assert p.returncode == 0, err[-3000:]

    trials = _trials(pg_url, name)
    by_state = Counter(t.state for t in trials)
    story = [
        (t.number, t.state.name, t.user_attrs.get("worker"), t.system_attrs.get("retry_history"), t.params)
        for t in trials
        if t.state != TrialState.COMPLETE or "failed_trial" in t.system_attrs
    ]
    assert by_state[TrialState.COMPLETE] == n, (by_state, story)
    assert by_state[TrialState.RUNNING] == 0 and by_state[TrialState.WAITING] == 0, by_state
    failed = [t for t in trials if t.state == TrialState.FAIL]
    tagged = [t for t in failed if "worker" in t.user_attrs]
    # exactly the trials it held, and at most one it had created but not yet tagged (killed mid-ask)
    assert len(tagged) == killed_with and len(failed) - len(tagged) <= 1, (failed, killed_with)
    assert all(t.user_attrs["worker"] == json.loads(tag) for t in tagged)
    retries = [t for t in trials if "failed_trial" in t.system_attrs]
    assert Counter(t.system_attrs["failed_trial"] for t in retries) == Counter(t.number for t in failed)
    by_number = {t.number: t for t in trials}
    for r in retries:
        assert r.state == TrialState.COMPLETE
        orig = by_number[r.system_attrs["failed_trial"]]
        assert {k: r.params[k] for k in orig.params} == orig.params  # the same proposal, run again
    # what `study show` reports from the same server
    show = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "study", "show", "--name", name, "--storage", pg_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert show.returncode == 0, show.stderr[-2000:]
    rep = json.loads(show.stdout)
    assert (rep["n_complete"], rep["n_failed"], rep["n_running"]) == (n, len(failed), 0)


def test_bad_postgres_url_is_one_line(pg_server) -> None:
    port, _ = pg_server
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/no_such_db"
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "study", "run", "--name", "x", *JOB, "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_db" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_the_claim_lock_holds_workers_in_postgres(pg_url: str) -> None:
    """While this process holds the study's claim lock (an advisory lock in PostgreSQL), a worker on the
    same study creates no trial; once it is released, the worker runs to the total."""
    import optuna

    from autopar.search.study import _ask_lock, _pg_engine, resolve_storage

    first = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "study", "run", "--name", "lk", *JOB, "--storage", pg_url]
        + ["--n-trials", "2", "--sampler", "random", "--seed-top-k", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    st = resolve_storage(pg_url)
    try:
        study = optuna.load_study(study_name="lk", storage=st)
        assert _pg_engine(study._storage) is not None  # the cached wrapper Optuna adds is seen through
        with _ask_lock(pg_url, study):
            w = _worker(pg_url, "lk", 6)
            time.sleep(15)  # the worker imports, opens the study and then waits on the lock
            assert w.poll() is None
            assert len(_trials(pg_url, "lk")) == 2  # nothing asked while the lock is held
        out, err = w.communicate(timeout=180)
        assert w.returncode == 0, err[-2000:]
        assert len(_trials(pg_url, "lk")) == 6 and json.loads(out)["new_trials"] == 4
    finally:
        st.remove_session()
        st.engine.dispose()
