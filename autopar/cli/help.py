"""Plain-text ``--help``: the top-level description, and an "examples:" epilog for every command."""

from __future__ import annotations

import argparse
import textwrap

from autopar.cli.args import DefaultsFormatter

DESCRIPTION = """\
Find, predict, validate and export parallel layouts for training and serving large transformers.

Exit codes: 0 success; 2 bad input, an illegal layout or nothing feasible (one line on stderr
naming the problem and what to do; no file written); 1 an internal error (a bug).
Run `autopar COMMAND --help` for a command's options and examples."""

TOP_EXAMPLES = """\
  autopar recommend --model llama-3.1-70b --device h100-sxm-80gb --num-devices 64 --seq-len 8192 --global-batch 128 --html report.html
  autopar predict --model llama-3.1-8b --device h100-sxm-80gb --num-devices 8 --seq-len 4096 --global-batch 64 --tp 2
  autopar completion bash > ~/.local/share/bash-completion/completions/autopar"""

M = "--model llama-3.1-70b --device h100-sxm-80gb --num-devices 64 --seq-len 8192 --global-batch 128"
EXAMPLES: dict[str, list[str]] = {
    "predict": [
        f"autopar predict {M} --tp 4 --pp 4 --vpp 4 --cp 4 --micro-batch 2",
        f"autopar predict {M} --tp 8 --json",
    ],
    "model": [
        "autopar model llama-3.1-70b",
        "autopar model path/to/config.json --json",
        "autopar model --config path/to/config.json --reader transformers",
        "autopar model --list",
    ],
    "export": [
        "autopar export --format megatron --from-json plan.json --out megatron_args.txt",
        "autopar export --format env --from-json study.json --record 2",
    ],
    "recommend": [
        f"autopar recommend {M}",
        f"autopar recommend {M} --objective throughput,memory --html report.html",
        f"autopar recommend {M} --set tp=4,8 --export megatron --out args.txt",
    ],
    "study run": [f"autopar study run --name llama70b {M} --space uneven_pipeline --n-trials 500"],
    "study show": ["autopar study show --name llama70b --top 10 --html study.html"],
    "study list": ["autopar study list"],
    "sweep": ["autopar sweep studies/sweeps/example.yaml --html sweep.html"],
    "serve": [
        "autopar serve --model llama-3.1-70b --device h100-sxm-80gb --num-devices 8 --isl 2048 --osl 256 "
        "--ttft-ms 500 --tpot-ms 50 --html serve.html"
    ],
    "compare": [
        "autopar compare --model llama-3.1-70b --devices h100-sxm-80gb,a100-80gb --num-devices 64 "
        "--workload training --seq-len 8192 --global-batch 128 --html compare.html",
        "autopar compare --model llama-3.1-8b --devices h100-sxm-80gb,a100-80gb --num-devices 8 "
        "--workload serving --isl 1024 --osl 256",
    ],
    "calibrate": ["autopar calibrate --world-size 4", "autopar calibrate --out-dir ./cal"],
    "validate": [
        "autopar recommend ... --json > plan.json && autopar validate --layouts plan.json --html validate.html"
    ],
    "completion": [
        "autopar completion bash > ~/.local/share/bash-completion/completions/autopar",
        "autopar completion zsh > ~/.zfunc/_autopar",
    ],
}


class HelpFormatter(DefaultsFormatter):
    """Wraps each paragraph of a description on its own; lines indented by two spaces (examples)
    are kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith("  ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(
                    textwrap.fill(" ".join(lines), width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(out)


def epilog(name: str) -> str | None:
    ex = EXAMPLES.get(name)
    return "examples:\n" + "\n".join(f"  {e}" for e in ex) if ex else None


def decorate(parser: argparse.ArgumentParser) -> None:
    """Plain-text formatting, the examples epilog and ``--quiet`` on every (sub-)command parser."""
    parser.formatter_class = HelpFormatter
    parser.description = DESCRIPTION
    parser.epilog = "examples:\n" + TOP_EXAMPLES

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if name:
            p.formatter_class = HelpFormatter
            p.epilog = epilog(name)
            if not subs and "--quiet" not in p._option_string_actions:
                p.add_argument(
                    "--quiet",
                    action="store_true",
                    help="no progress bars on stderr (default: shown when stderr is a terminal)",
                )
        for s in subs:
            for cmd, sp in s.choices.items():
                walk(sp, f"{name} {cmd}".strip())

    walk(parser, "")
