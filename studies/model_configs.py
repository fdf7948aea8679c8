"""How many real, published config.json files autopar reads, checked against the model's own code.

    python studies/model_configs.py [DIR ...] [--json OUT]

Reads every ``config.json`` under tests/configs/real/ (one real, unedited config per architecture;
their sources are in tests/configs/real/SOURCES.yaml) and under each DIR given, with autopar's
reader (``autopar.model.load_model`` for language models, ``autopar.dit.spec.load_dit`` for a
diffusers transformer config), and builds the same config with its own library on the ``meta``
device (``transformers`` / ``diffusers``: :mod:`autopar.hf_meta`) as the truth. Per config it prints
what autopar did with it:

* ``loads``: read, total and active parameters within 3 % of the library's count;
* ``wrong``: read, but a count is more than 3 % off (a wrong number is worse than a refusal);
* ``refused``: autopar refused it by name (the reason is printed);
* ``no truth``: the library has no class for it (or is not installed) and the config's stored
  figure in SOURCES.yaml is used when there is one; otherwise the row is not scored.

The totals line is the issue-22 acceptance figure: the share of scored configs that load within 3 %,
and how many are wrong. Language-model counts are the text model's (vision/audio towers and MTP
modules are reported apart by autopar, as by :class:`autopar.hf_meta.MetaCount.text_total`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from autopar.errors import AutoparError
from autopar.hf_meta import dit_meta_count, meta_count
from autopar.model import read_config_file

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "configs" / "real"
SOURCES = REAL / "SOURCES.yaml"
TOLERANCE = 0.03  # the acceptance bound on total and active parameters


@dataclass
class Row:
    name: str
    kind: str  # "llm" or "dit"
    status: str  # loads / wrong / refused / no truth
    truth_by: str  # the class that built it, "stored figure", or why there is no truth
    total: int | None = None  # autopar's
    active: int | None = None
    true_total: int | None = None
    true_active: int | None = None
    why: str = ""

    @property
    def err_total(self) -> float | None:
        if self.total is None or not self.true_total:
            return None
        return self.total / self.true_total - 1

    @property
    def err_active(self) -> float | None:
        if self.active is None or not self.true_active:
            return None
        return self.active / self.true_active - 1


def sources() -> dict[str, dict[str, Any]]:
    """SOURCES.yaml: per architecture folder, where its config.json was copied from and the stored truth."""
    if not SOURCES.is_file():
        return {}
    doc = yaml.safe_load(SOURCES.read_text(encoding="utf-8")) or {}
    return dict(doc)


def truth(raw: dict) -> tuple[int | None, int | None, str]:
    """(total, active, how) as the model's own library builds ``raw`` on the meta device."""
    if "_class_name" in raw:
        n, how = dit_meta_count(raw)
        return n, n, how
    mc, how = meta_count(raw)
    if mc is None:
        return None, None, how
    return mc.text_total, mc.text_active, how


def autopar_counts(path: Path, raw: dict) -> tuple[int, int]:
    """(total, active) parameters as autopar reads the config file (raises AutoparError when it refuses)."""
    if "_class_name" in raw:
        from autopar.dit.spec import load_dit

        spec = load_dit(path)
        return spec.params, spec.params
    from autopar.model import load_model

    m = load_model(path)
    return m.total_params, m.active_params


def evaluate(path: Path, stored: dict[str, Any] | None = None, *, use_library: bool = True) -> Row:
    """One config against its truth: the library's meta-device count, else the stored figure."""
    name = path.parent.name if path.name == "config.json" else path.stem
    raw = read_config_file(path)
    kind = "dit" if "_class_name" in raw else "llm"
    tt, ta, how = truth(raw) if use_library else (None, None, "library not used")
    if tt is None and stored and stored.get("total"):
        tt, ta, how = int(stored["total"]), int(stored.get("active") or stored["total"]), "stored figure"
    row = Row(name, kind, "no truth", how, true_total=tt, true_active=ta)
    try:
        row.total, row.active = autopar_counts(path, raw)
    except AutoparError as e:  # a refusal is scored only where there is a truth to score it against
        row.status, row.why = ("refused" if tt is not None else "no truth"), e.message
        return row
    if tt is None:
        return row
    errs = [e for e in (row.err_total, row.err_active) if e is not None]
    row.status = "loads" if all(abs(e) <= TOLERANCE for e in errs) else "wrong"
    return row


def config_files(dirs: list[Path]) -> list[Path]:
    """Every config.json under the folders (and the files given), each once."""
    out: dict[Path, None] = {}
    for d in dirs:
        found = (
            [d]
            if d.is_file()
            else sorted(p for p in d.rglob("*.json") if p.name == "config.json" or p.parent == d)
        )
        out.update(dict.fromkeys(p.resolve() for p in found))
    return list(out)


def summary(rows: list[Row]) -> dict[str, Any]:
    scored = [r for r in rows if r.status != "no truth"]
    loads = sum(r.status == "loads" for r in scored)
    return {
        "configs": len(rows),
        "scored": len(scored),
        "loads": loads,
        "refused": sum(r.status == "refused" for r in scored),
        "wrong": sum(r.status == "wrong" for r in scored),
        "no_truth": len(rows) - len(scored),
        "load_share": loads / len(scored) if scored else 0.0,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2%}"


def _b(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e9:.3f}B"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="more folders (or files) of config.json to read")
    ap.add_argument("--json", type=Path, help="write the rows and totals as JSON here")
    a = ap.parse_args(argv)
    for d in a.dirs:
        if not d.exists():
            print(f"error: {d} does not exist; pass folders or files holding config.json", file=sys.stderr)
            return 2
    src = sources()
    rows: list[Row] = []
    for p in config_files([REAL, *a.dirs]):
        stored = src.get(p.parent.name, {}).get("truth") if p.parent.parent == REAL else None
        try:
            r = evaluate(p, stored)
        except AutoparError as e:  # the file itself cannot be read: a refusal of that file
            r = Row(p.parent.name, "?", "refused", "-", why=e.message)
        rows.append(r)
        print(
            f"{r.name:<40} {r.kind:<3} {r.status:<8} total {_b(r.total):>10} vs {_b(r.true_total):>10}"
            f" ({_pct(r.err_total):>7})  active {_b(r.active):>10} vs {_b(r.true_active):>10}"
            f" ({_pct(r.err_active):>7})" + (f"  refused: {r.why}" if r.why else ""),
            flush=True,
        )
    s = summary(rows)
    print(
        f"\n{s['configs']} configs, {s['scored']} with a truth: {s['loads']} load within "
        f"{TOLERANCE:.0%} ({s['load_share']:.1%}), {s['refused']} refused, {s['wrong']} wrong; "
        f"{s['no_truth']} without a truth (not scored)"
    )
    if a.json:
        doc = {"rows": [asdict(r) | {"err_total": r.err_total, "err_active": r.err_active} for r in rows]}
        a.json.write_text(json.dumps(doc | {"summary": s}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
