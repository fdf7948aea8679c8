"""``autopar compare``: best layout, tokens/s, tokens/J and $/token per device (see autopar.whatif.compare)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autopar.cli.args import add_field_args, positive_int
from autopar.cli.serve import positive_float
from autopar.errors import AutoparError
from autopar.job import Job, ServingWorkload
from autopar.limits import markup_safe as ms
from autopar.limits import terminal_safe


def _int_list(text: str) -> list[int]:
    from autopar.cli.args import positive_int

    out = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _batch_list(text: str) -> list[int | None]:
    """Comma-separated batch sizes; ``max`` means as many as memory allows (serving offline)."""
    out: list[int | None] = []
    for x in text.split(","):
        x = x.strip().lower()
        if x == "max":
            out.append(None)
        elif x:
            out.extend(_int_list(x))
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _names(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _prices(text: str) -> dict[str, float]:
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"{item!r} is not DEVICE=USD")
        k, v = item.split("=", 1)
        out[k.strip().lower()] = positive_float(v)
    return out


def register(sub) -> dict:
    p = sub.add_parser(
        "compare",
        help="compare devices: best layout, tokens/s, tokens/J, $/token",
        description="Run the serving search or the training search (recommend) on each device and "
        "show where the winner changes across batch size, sequence length and "
        "model size; --out writes PREFIX.csv and PREFIX.svg.",
    )
    p.add_argument(
        "--model",
        type=_names,
        required=True,
        dest="models",
        help="model preset(s), comma-separated (more than one compares model sizes)",
    )
    p.add_argument("--devices", type=_names, required=True, help="device ids, comma-separated")
    p.add_argument("--num-devices", type=positive_int, required=True, help="devices of each type")
    p.add_argument(
        "--workload",
        choices=["serving", "training"],
        default=None,
        help="what the devices are compared on: training (--seq-len, --global-batch) or serving "
        "(--isl, --osl, --concurrency) (default: none, it must be named)",
    )
    p.add_argument(
        "--seq-len",
        "--isl",
        type=_int_list,
        dest="seq_lens",
        required=True,
        help="prompt length (serving) or training sequence length; comma-separated to sweep",
    )
    p.add_argument(
        "--batch",
        "--global-batch",
        "--concurrency",
        type=_batch_list,
        dest="batches",
        default=None,
        help="concurrency (serving; 'max' = offline) or global batch (training); comma-separated",
    )
    p.add_argument("--osl", type=positive_int, default=256, help="serving output tokens per request")
    add_field_args(p, ServingWorkload, ("weight_precision", "kv_precision", "ttft_ms", "tpot_ms"))
    p.add_argument("--precision", choices=["bf16", "fp8"], default="bf16", help="training GEMM precision")
    p.add_argument(
        "--metric",
        choices=["tokens_per_s_per_device", "tokens_per_joule", "cost_per_mtok"],
        default="tokens_per_s_per_device",
        help="what decides the winner",
    )
    p.add_argument("--prices", type=_prices, default=None, help="USD per device-hour: DEVICE=PRICE,...")
    p.add_argument(
        "--price-per-device-hour", type=positive_float, default=None, help="same price for every device"
    )
    add_field_args(p, Job, ("memory_headroom", "calibration"))
    p.add_argument(
        "--utilization",
        type=positive_float,
        default=1.0,
        help="with --per: share of wall time the devices serve; the rest they idle (default: 1.0)",
    )
    p.add_argument(
        "--per",
        type=_names,
        default=None,
        help="accelerator landscape (serving): the winner per chip, system, watt and/or dollar "
        "(comma-separated), each device over every TP x PP shape of at most --num-devices chips "
        "(default: off: the best-layout search per device)",
    )
    p.add_argument("--out", default=None, help="write PREFIX.csv and PREFIX.svg")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    from autopar.cli.recommend import add_html_arg

    add_html_arg(p)
    return {"compare": cmd_compare}


def cmd_compare(a: argparse.Namespace) -> int:
    from autopar.report import check_html_path
    from autopar.whatif.compare import compare, output_paths, write_outputs

    if a.per is not None:  # the accelerator landscape (autopar.whatif.landscape)
        from autopar.cli.whatif import cmd_landscape

        return cmd_landscape(a)

    if a.out:
        output_paths(a.out)  # a bad destination is refused before the comparison runs
    check_html_path(a.html)

    prices: dict[str, Any] = {}
    if a.price_per_device_hour is not None:
        prices = {d.lower(): a.price_per_device_hour for d in a.devices}
    prices.update(a.prices or {})
    batches = a.batches if a.batches is not None else [None]
    if a.workload is None:  # (--per, which compares serving only, returned above)
        # never guessed: a --global-batch read as a serving concurrency gave a silently wrong answer
        raise AutoparError("compare needs --workload training or --workload serving", "name the workload")
    if a.workload == "training" and a.batches is None:
        raise AutoparError("training comparison needs --global-batch", "e.g. --global-batch 256,1024")
    from autopar.progress import Bar

    bar = Bar(len(a.models) * len(a.seq_lens) * len(batches) * len(a.devices), "compare cells")
    try:
        res = _compare(a, compare, batches, prices, bar)
    finally:
        bar.close()
    written = write_outputs(res, a.out) if a.out else []
    if a.html:
        from autopar.cli.report import compare_report

        compare_report(res).write(a.html)
        written.append(Path(a.html))
    if a.json:
        d = res.to_dict()
        d["files"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(d, indent=2, default=float) + "\n")
        return 0
    _print(res)
    for p in written:
        print(f"wrote {terminal_safe(p)}")
    return 0


def _compare(
    a: argparse.Namespace, compare: Any, batches: list[Any], prices: dict[str, Any], bar: Any
) -> Any:
    return compare(  # the API's keywords are these flags' names
        on_cell=lambda what: bar.advance(1, what),
        model=a.models,
        devices=a.devices,
        num_devices=a.num_devices,
        workload=a.workload,
        seq_len=a.seq_lens,
        batch=batches,
        osl=a.osl,
        metric=a.metric,
        prices=prices,
        precision=a.precision,
        calibration=a.calibration,
        memory_headroom=a.memory_headroom,
        weight_precision=a.weight_precision,
        kv_precision=a.kv_precision,
        ttft_ms=a.ttft_ms,
        tpot_ms=a.tpot_ms,
    )


def _print(res) -> None:
    from rich.table import Table

    from autopar.cli.render import console

    con = console()
    unit = "output tok" if res.workload == "serving" else "tok"
    t = Table(title=f"{res.workload}: best layout per device (winner by {res.metric})")
    for c in ("model", "seq", "batch", "device", "layout", f"{unit}/s/device", f"{unit}/J", "$/Mtok", ""):
        t.add_column(c, justify="right" if c not in ("model", "device", "layout") else "left")
    for c in res.cells:
        if not c["feasible"]:
            t.add_row(
                ms(c["model"]),
                str(c["seq_len"]),
                str(c["batch"] or "max"),
                ms(c["device"]),
                "infeasible",
                "-",
                "-",
                "-",
                "",
            )
            continue
        cost = c.get("cost_per_mtok")
        t.add_row(
            ms(c["model"]),
            str(c["seq_len"]),
            str(c["batch"] or "max"),
            ms(c["device"]),
            c["layout"],
            f"{c['tokens_per_s_per_device']:,.0f}",
            f"{c['tokens_per_joule']:.2f}",
            "-" if cost is None else f"{cost:.3f}",
            "winner" if c["winner"] else "",
        )
    from autopar.cli.render import add_legend

    add_legend(t, [str(c["layout"]) for c in res.cells if c["feasible"]])
    con.print(t)
    if res.changes:
        con.print("winner changes:")
        for s in res.changes:
            con.print(f"  {ms(s)}")
    else:
        con.print("the winner is the same in every cell")
