"""Human-readable tables (rich) for predictions, models and search results."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.limits import markup_safe as ms

# Output that goes to a pipe or a log gets a fixed width that fits a ranked layout table; a
# terminal uses its own width.
PIPE_WIDTH = 150


def console() -> Console:
    """The console every command prints its tables with."""
    import sys

    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


_console = console()


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def print_model(spec) -> None:
    t = Table(title=ms(spec.name), show_header=False)
    t.add_column("field")
    t.add_column("value", justify="right")
    t.add_row("total parameters", f"{spec.total_params / 1e9:.2f} B")
    t.add_row("active parameters", f"{spec.active_params / 1e9:.2f} B")
    for k, v in spec.to_dict().items():
        if k in ("total_params", "active_params", "warnings") or v in (0, "", None, False, []):
            continue
        if k.startswith("mamba_") and not spec.mamba_layers:
            continue
        t.add_row(k, ms(v))
    _console.print(t)


def print_meta(name: str, meta, how: str, spec) -> None:
    """Which reader read the model, and the transformers count by module kind beside autopar's."""
    if meta is None:
        _console.print(f"read by: autopar's field reader (autopar/model.py); transformers count: {how}")
        return
    own = spec is not None and "read by its own code" in spec.source  # autopar.own_code.OWN_CODE
    _console.print(
        f"read by: {how}"
        + (
            " (module shapes; the field reader refused it)"
            if own
            else " and autopar's field reader"
            if spec
            else ""
        )
    )
    t = Table(title=f"{name}: parameters by module ({meta.library} {meta.model_class})", show_header=False)
    t.add_column("kind")
    t.add_column("parameters", justify="right")
    for k, v in meta.by_kind.items():
        t.add_row(k, f"{v / 1e9:.4f} B")
    t.add_row("total", f"{meta.total / 1e9:.4f} B")
    t.add_row("language model (no towers, no MTP)", f"{meta.text_total / 1e9:.4f} B")
    if meta.text_active is not None:
        t.add_row("language model active", f"{meta.text_active / 1e9:.4f} B")
    if spec is not None:
        dev = (spec.total_params - meta.text_total) / meta.text_total
        label = "autopar total (read from module shapes)" if own else "autopar field reader total"
        t.add_row(label, f"{spec.total_params / 1e9:.4f} B ({dev:+.2%})")
    _console.print(t)
    for n in meta.notes:
        _console.print(f"[yellow]note:[/] {n}")


def print_assumptions(assumptions) -> None:
    for a in assumptions:
        _console.print(f"[yellow]assumption:[/] {ms(a)}")


def print_prediction(pred) -> None:
    d = pred.to_dict()
    job, c, w = pred.job, pred.job["cluster"], pred.job["workload"]
    _console.print(
        f"[bold]{ms(job['model'])}[/] on {c['num_devices']} x {ms(c['device'])} "
        f"({c['devices_per_node']} per node), seq {w['seq_len']}, global batch {w['global_batch']} "
        f"= {w['seq_len'] * w['global_batch']:,} tokens/step"
        + (", LoRA (base weights frozen)" if w.get("lora") else "")
        + f", framework {job['framework']}"
    )
    print_assumptions(pred.assumptions)
    _console.print(f"layout: [bold]{pred.layout.short()}[/]")
    summary = Table(show_header=False)
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("step time", _fmt_s(pred.step_time_s))
    summary.add_row("tokens/s per device", f"{pred.tokens_per_s_per_device:,.0f}")
    summary.add_row("MFU", pred.mfu_text())
    summary.add_row(
        "memory per device",
        f"{pred.memory_gib_per_device:.1f} / {pred.memory_capacity_gib:.1f} GiB "
        f"(limit {pred.memory_limit_gib:.1f} GiB with headroom)",
    )
    summary.add_row(
        "allocated / reserved", f"{pred.memory_allocated_gib:.1f} / {pred.memory_reserved_gib:.1f} GiB"
    )
    summary.add_row("fits", "yes" if pred.fits else "[red]no[/]")
    summary.add_row("exposed communication", f"{pred.exposed_comm_fraction:.1%} of step")
    if pred.coefficients:
        summary.add_row("coefficients", ms(pred.coefficients))
    if pred.expected_error is not None:
        summary.add_row("expected error", pred.expected_error.describe())
    summary.add_row(
        "energy per step", f"{pred.energy_j_per_step / 1e3:,.1f} kJ (avg {pred.avg_power_w:.0f} W/device)"
    )
    _console.print(summary)
    _console.print(breakdown_table("time per step", pred.time_breakdown, pred.step_time_s, _fmt_s))
    _console.print(
        breakdown_table(
            "memory per device (GiB)", pred.memory_breakdown, pred.memory_gib_per_device, lambda x: f"{x:.2f}"
        )
    )
    for r in d["reasons"]:
        _console.print(f"[red]{r['code']}[/]: {ms(r['message'])}")


def breakdown_table(title: str, parts: dict[str, float], total: float, fmt) -> Table:
    t = Table(title=title)
    t.add_column("component")
    t.add_column("value", justify="right")
    t.add_column("share", justify="right")
    for k, v in parts.items():
        if v <= 0:
            continue
        t.add_row(ms(k), fmt(v), f"{v / total:.1%}" if total else "-")
    t.add_row("[bold]total[/]", fmt(total), "100%")
    return t


def add_legend(table: Table, names: list[str]) -> None:
    """The table's caption explains every abbreviation its layout names use."""
    from autopar.report import legend

    text = legend(names)
    if text:
        table.caption, table.caption_justify = ms(text), "left"
