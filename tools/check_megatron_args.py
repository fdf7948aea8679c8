"""Check a `autopar export --format megatron` file with Megatron-LM's own argument parser.

Megatron-LM's ``megatron/training/arguments.py`` (``parse_args`` + ``validate_args``) is not on the
package index, so this script takes a Megatron-LM checkout. On Python 3.11 use the core_v0.16.x
tag (later releases need Python 3.12)::

    git clone --branch core_v0.16.1 --depth 1 https://github.com/NVIDIA/Megatron-LM
    python tools/check_megatron_args.py --megatron-lm Megatron-LM megatron_args.txt

The exported flags are parsed as ``pretrain_gpt.py`` would parse them, with the model's depth from
the export's autopar header and placeholder width/heads (the parallel checks do not depend on them),
under ``WORLD_SIZE`` = the job's device count and the ``CUDA_DEVICE_MAX_CONNECTIONS`` the export's
environment line names. The checks that ask the GPU its compute capability are answered with the
job's device (10 for Blackwell, :data:`autopar.export.megatron.BLACKWELL_DEVICES`, else 9: Hopper),
since the checking machine need not have one. Exit status 0 prints the parallel sizes Megatron-LM derived; a refusal by
``validate_args`` exits 1 with its message; bad input exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", required=True, type=Path, help="a Megatron-LM checkout (core_v0.16.x)")
    p.add_argument("export", type=Path, help="a file written by `autopar export --format megatron`")
    a = p.parse_args(argv)
    if not (a.megatron_lm / "megatron" / "training" / "arguments.py").is_file():
        print(f"error: {a.megatron_lm} is not a Megatron-LM checkout (no megatron/training/arguments.py)")
        return 2
    try:
        text = a.export.read_text(encoding="utf-8")
    except OSError as e:
        print(f"error: cannot read {a.export}: {e.strerror}")
        return 2
    m = re.search(r"^# autopar-export: (\{.*\})$", text, re.MULTILINE)
    if not m:
        print(f"error: {a.export} has no autopar-export header; pass a file autopar export wrote")
        return 2
    job = json.loads(m.group(1))["job"]
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
    flags = shlex.split(body)
    model = [
        "--num-layers", str(job.get("num_layers") or 32),
        "--hidden-size", "1024",
        "--num-attention-heads", "16",
        "--max-position-embeddings", str(job["seq_len"]),
        "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "32000",
    ]  # fmt: skip
    os.environ.update(WORLD_SIZE=str(job["num_devices"]), RANK="0", LOCAL_RANK="0")
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    from autopar.export.megatron import BLACKWELL_DEVICES

    major = 10 if str(job.get("device") or "").lower() in BLACKWELL_DEVICES else 9
    sys.path.insert(0, str(a.megatron_lm.resolve()))
    import megatron.training.arguments as margs
    import torch

    margs.get_device_arch_version = lambda: major  # the job's GPU, not this machine's
    torch.cuda.get_device_capability = lambda *_, **__: (major, 0)
    parse_args, validate_args = margs.parse_args, margs.validate_args

    sys.argv = ["pretrain_gpt.py", *model, *flags]
    args = parse_args()
    try:
        validate_args(args)
    except (AssertionError, ValueError, RuntimeError) as e:
        print(f"Megatron-LM refused the export: {e}")
        return 1
    print(
        f"Megatron-LM accepted: tp={args.tensor_model_parallel_size} pp={args.pipeline_model_parallel_size} "
        f"cp={args.context_parallel_size} ep={args.expert_model_parallel_size} dp={args.data_parallel_size} "
        f"micro_batch={args.micro_batch_size} global_batch={args.global_batch_size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
