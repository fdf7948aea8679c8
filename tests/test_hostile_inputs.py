"""A corpus of bad and hostile inputs, one per case, run through the CLI in-process.

Every case must end with exit status 2 and exactly one line on stderr (``error: <problem> (<what to
do>)``), printable (a newline or ESC in a name is escaped) and bounded in length, naming the real
cause where the case gives one (``EXPECT``), no traceback, and no file created, replaced, or
touched in the working directory: the directory tree (names, types, sizes, modification times, inodes) is compared before and after, and
it holds a symlink to a directory, a dangling symlink, a FIFO, a character device (where this user
may create one) and a directory, each used as a destination or a source somewhere below. The
limits these cases probe are in :mod:`autopar.limits`. The tests after the corpus run hostile names
that must print as written (exit 0): rich markup, a foreign MPLBACKEND, an ASCII-only terminal.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from test_dit import SD35_MEDIUM

from autopar.cli.main import main
from autopar.limits import MAX_MESSAGE_CHARS

J = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
J += ["--seq-len", "4096", "--global-batch", "64"]
BINARY = bytes(range(256)) * 4
GOOD_LAYOUTS = {
    "job": {"model": "cfg/tiny.json", "device": "cpu.device.yaml", "seq_len": 128, "global_batch": 4},
    "layouts": [{"dp": 4, "zero": 3, "micro_batch": 1, "precision": "fp32"}],
}
TINY = {"name": "tiny", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16}
TINY |= {"ffn_hidden": 128, "vocab": 128}
HF = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}
_DEFAULT_CAL = (
    Path(__file__).resolve().parent.parent / "cost_models" / "calibration" / "default.yaml"
).read_text()
_H100 = (
    Path(__file__).resolve().parent.parent / "cost_models" / "devices" / "h100-sxm-80gb.yaml"
).read_text()
_CPU_DEV = (
    Path(__file__).resolve().parent.parent / "cost_models" / "calibration" / "cpu-gloo-w4.device.yaml"
).read_text()


def _cal(**patch: Any) -> str:
    """The shipped calibration with one dotted key set (value None: removed)."""
    import yaml

    d = yaml.safe_load(_DEFAULT_CAL)
    for key, value in patch.items():
        *path, last = key.split("__")
        node = d
        for p in path:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return yaml.safe_dump(d)


def _dev(**patch: Any) -> str:
    import yaml

    d = yaml.safe_load(_H100)
    d["id"] = "whatif"
    for key, value in patch.items():
        *path, last = key.split("__")
        node = d
        for p in path:
            node = node[p]
        node[last] = value
    return yaml.safe_dump(d)


def _json(obj: Any) -> str:
    return json.dumps(obj)


CASES: list[tuple[str, list[str], dict[str, Any]]] = []
EXPECT: dict[str, str] = {}  # case id -> a phrase its error line must contain (the real cause)


def case(cid: str, argv: list[str], expect: str | None = None, **files: Any) -> None:
    CASES.append((cid, argv, {k.replace("__", "/"): v for k, v in files.items()}))
    if expect is not None:
        EXPECT[cid] = expect


P = ["predict", *J]
# ------------------------------------------------------------------------------ job and layout flags
case("num-devices-0", ["predict", *J[:5], "0", *J[6:]])
case("num-devices-negative", ["predict", *J[:5], "-8", *J[6:]])
case("num-devices-word", ["predict", *J[:5], "eight", *J[6:]])
case("num-devices-1e12", ["predict", *J[:5], "1e12", *J[6:]])
case("num-devices-huge", ["predict", *J[:5], str(2**40), *J[6:]])
case("seq-len-0", ["predict", *J[:7], "0", *J[8:]])
case("seq-len-huge", ["predict", *J[:7], str(10**11), *J[8:]])
case("global-batch-0", ["predict", *J[:9], "0"])
case("global-batch-float", ["predict", *J[:9], "6.5"])
case("headroom-1.5", [*P, "--memory-headroom", "1.5"])
case("headroom-nan", [*P, "--memory-headroom", "nan"])
case("headroom-negative", [*P, "--memory-headroom", "-0.1"])
case("tp-3", [*P, "--tp", "3"])
case("tp-0", [*P, "--tp", "0"])
case("zero-7", [*P, "--zero", "7"])
case("recompute-bogus", [*P, "--recompute", "some"])
case("precision-int3", [*P, "--precision", "int3"])
case("framework-bogus", [*P, "--framework", "jax"])
case("devices-per-node-3", [*P, "--devices-per-node", "3"])
case("dp-mismatch", [*P, "--dp", "3"])
case("micro-batch-indivisible", [*P, "--micro-batch", "3"])
# ------------------------------------------------------------------------------------------ models
case("model-unknown", ["predict", "--model", "nope-7b", *J[2:]])
case("model-empty", ["predict", "--model", "", *J[2:]])
case("model-binary", ["predict", "--model", "m.json", *J[2:]], **{"m.json": BINARY})
case(
    "model-1e12-layers",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": _json(HF | {"num_hidden_layers": 1e12})},
)
case(
    "model-huge-vocab",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": _json(HF | {"vocab_size": 10**13})},
)
case(
    "model-nan",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": _json(HF)[:-1] + ', "rope_theta": NaN}'},
)
case(
    "model-duplicate-key",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": _json(HF)[:-1] + ', "hidden_size": 8}'},
)
case("model-fifo", ["predict", "--model", "fifo", *J[2:]])
case("model-dir-without-config", ["predict", "--model", "adir", *J[2:]])
case(
    "model-latin1",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": '{"name": "caf\xe9"}'.encode("latin-1")},
)
case("model-cmd-binary", ["model", "m.json"], **{"m.json": BINARY})
case("model-cmd-huge", ["model", "m.json"], **{"m.json": _json(HF | {"num_hidden_layers": 10**9})})
# ----------------------------------------------------------------------------------------- devices
case("device-unknown", ["predict", *J[:3], "h999", *J[4:]])
case("device-missing-file", ["predict", *J[:3], "missing.yaml", *J[4:]])
case("device-binary", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": BINARY})
case("device-directory", ["predict", *J[:3], "adir/", *J[4:]])
case("device-fifo", ["predict", *J[:3], "./fifo", *J[4:]])
case("device-empty", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": ""})
case(
    "device-nan-memory",
    ["predict", *J[:3], "d.yaml", *J[4:]],
    **{"d.yaml": _dev(memory_gb=".nan").replace("'.nan'", ".nan")},
)
case(
    "device-inf-memory",
    ["predict", *J[:3], "d.yaml", *J[4:]],
    **{"d.yaml": _dev(memory_gb=".inf").replace("'.inf'", ".inf")},
)
case(
    "device-negative-attention",
    ["predict", *J[:3], "d.yaml", *J[4:]],
    **{"d.yaml": _dev(efficiency__attention=-0.2)},
)
case(
    "device-gemm-5", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": _dev(efficiency__gemm={"bf16": 5.0})}
)
case("device-unknown-key", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": _dev(colour="blue")})
case("device-duplicate-key", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": _dev() + "memory_gb: 1\n"})
case("device-list", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": "- 1\n- 2\n"})
case("device-bad-yaml", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": "id: [x\n"})
# ------------------------------------------------------------------------------------ calibrations
C = [*P, "--calibration", "c.yaml"]
case("cal-missing", [*P, "--calibration", "missing.yaml"])
case("cal-empty-flag", [*P, "--calibration", ""])
case("cal-binary", C, **{"c.yaml": BINARY})
case("cal-empty-file", C, **{"c.yaml": ""})
case("cal-directory", [*P, "--calibration", "adir"])
case("cal-fifo", [*P, "--calibration", "fifo"])
case("cal-list", C, **{"c.yaml": "- 1\n"})
case("cal-bad-yaml", C, **{"c.yaml": "global: {a: 1\n"})
case("cal-gemm-5", C, **{"c.yaml": _cal(**{"devices__h100-sxm-80gb__gemm": {"bf16": 5.0}})})
case("cal-gemm-0", C, **{"c.yaml": _cal(**{"devices__a100-40gb__gemm": {"bf16": 0.0}})})
case(
    "cal-gemm-nan",
    C,
    **{"c.yaml": _cal(**{"devices__a100-40gb__gemm": {"bf16": "NAN"}}).replace("'NAN'", ".nan")},
)
case("cal-gemm-unknown-precision", C, **{"c.yaml": _cal(**{"devices__a100-40gb__gemm": {"int3": 0.5}})})
case("cal-attention-negative", C, **{"c.yaml": _cal(**{"devices__a100-40gb__attention": -0.3})})
case("cal-hbm-2", C, **{"c.yaml": _cal(**{"devices__a100-40gb__hbm": 2.0})})
case("cal-half-dim-0", C, **{"c.yaml": _cal(**{"devices__a100-40gb__gemm_half_dim": 0})})
case("cal-device-unknown-key", C, **{"c.yaml": _cal(**{"devices__a100-40gb__speed": 1})})
case("cal-tp-overlap-1.7", C, **{"c.yaml": _cal(global__tp_overlap=1.7)})
case("cal-contention-negative", C, **{"c.yaml": _cal(global__overlap_contention=-1)})
case("cal-fragmentation-3", C, **{"c.yaml": _cal(global__fragmentation=3)})
case(
    "cal-kernel-overhead-inf",
    C,
    **{"c.yaml": _cal(global__kernel_overhead_us="INF").replace("'INF'", ".inf")},
)
case("cal-global-unknown-key", C, **{"c.yaml": _cal(global__overlap=0.5)})
case("cal-global-missing", C, **{"c.yaml": _cal(**{"global": None})})
case("cal-devices-missing", C, **{"c.yaml": _cal(devices=None)})
case("cal-schema-missing", C, **{"c.yaml": _cal(schema=None)})
case("cal-schema-wrong", C, **{"c.yaml": _cal(schema="autopar.calibration/v9")})
case("cal-top-unknown-key", C, **{"c.yaml": _cal(extra={"a": 1})})
case("cal-transfer-ratio-0", C, **{"c.yaml": _cal(transfer__gemm_ratio=0)})
case("cal-duplicate-key", C, **{"c.yaml": _DEFAULT_CAL + "global: {}\n"})
case("cal-global-string", C, **{"c.yaml": _cal(global__tp_overlap="high")})
# --------------------------------------------------------------------------------------- recommend
R = ["recommend", *J]
case("objective-bogus", [*R, "--objective", "speed"])
case("price-nan", [*R, "--objective", "cost", "--price-per-device-hour", "nan"])
case("price-negative", [*R, "--objective", "cost", "--price-per-device-hour", "-1"])
case("price-inf", [*R, "--price-per-device-hour", "inf"])
case("price-kwh-nan", [*R, "--price-per-kwh", "nan"])
case("export-bogus", [*R, "--export", "bogus"])
case("export-out-directory", [*R, "--export", "megatron", "--out", "adir"])
case("export-out-missing-dir", [*R, "--export", "megatron", "--out", "missing/args.txt"])
case("export-out-fifo", [*R, "--export", "megatron", "--out", "fifo"])
case("export-out-chardev", [*R, "--export", "megatron", "--out", "chardev"])
case("export-out-link-to-dir", [*R, "--export", "megatron", "--out", "link_to_dir"])
case("export-out-dangling-link", [*R, "--export", "megatron", "--out", "dangling"])
case("export-out-proc", [*R, "--export", "megatron", "--out", "/proc/nope/x"])
case("export-out-empty", [*R, "--export", "megatron", "--out", ""])
case("out-without-export", [*R, "--out", "x.txt"])
case("export-json-without-out", [*R, "--export", "megatron", "--json"])
case("space-missing", [*R, "--space", "missing.yaml"])
case("space-empty", [*R, "--space", "s.yaml"], **{"s.yaml": ""})
case("space-only-comment", [*R, "--space", "s.yaml"], **{"s.yaml": "# nothing\n"})
case("space-binary", [*R, "--space", "s.yaml"], **{"s.yaml": BINARY})
case("space-duplicate-key", [*R, "--space", "s.yaml"], **{"s.yaml": "name: a\nname: b\n"})
case("space-unknown-key", [*R, "--space", "s.yaml"], **{"s.yaml": "name: a\naxis: {}\n"})
case("space-directory", [*R, "--space", "adir"])
case("space-fifo", [*R, "--space", "./fifo"])
case("space-bad-toml", [*R, "--space", "s.toml"], **{"s.toml": "name = \n"})
case("space-empty-flag", [*R, "--space", ""])
case("set-unknown-axis", [*R, "--set", "bogus=1"])
case("set-no-equals", [*R, "--set", "tp"])
case("top-0", [*R, "--top", "0"])
case("workers-0", [*R, "--workers", "0"])
# ------------------------------------------------------------------------------------------- study
S = ["study", "run", "--name", "s", *J, "--storage", "s.log"]
case("study-timeout-negative", [*S, "--timeout", "-1"])
case("study-timeout-zero", [*S, "--timeout", "0"])
case("study-timeout-nan", [*S, "--timeout", "nan"])
case("study-name-empty", ["study", "run", "--name", "", *J, "--storage", "s.log"])
case("study-name-newline", ["study", "run", "--name", "a\nb", *J, "--storage", "s.log"])
case("study-name-spaces", ["study", "run", "--name", " a", *J, "--storage", "s.log"])
case("study-n-trials-0", [*S, "--n-trials", "0"])
case("study-batch-0", [*S, "--batch", "0"])
case("study-sampler-bogus", [*S, "--sampler", "cmaes"])
case("study-storage-directory", ["study", "run", "--name", "s", *J, "--storage", "adir"])
case("study-storage-binary", ["study", "run", "--name", "s", *J, "--storage", "b.log"], **{"b.log": BINARY})
case(
    "study-storage-no-driver", ["study", "run", "--name", "s", *J, "--storage", "postgresql://u@localhost/db"]
)
case("study-storage-bad-scheme", ["study", "run", "--name", "s", *J, "--storage", "bogus://x"])
case("study-storage-missing-dir", ["study", "run", "--name", "s", *J, "--storage", "missing/s.log"])
case("study-storage-fifo", ["study", "run", "--name", "s", *J, "--storage", "fifo"])
case(
    "study-storage-corrupt",
    ["study", "run", "--name", "s", *J, "--storage", "c.log"],
    **{"c.log": "{not a journal\n"},
)
case(
    "study-storage-sqlite-text",
    ["study", "run", "--name", "s", *J, "--storage", "t.db"],
    **{"t.db": "hello\n" * 100},
)
case("study-space-empty", [*S, "--space", "s.yaml"], **{"s.yaml": ""})
case("study-show-missing-storage", ["study", "show", "--name", "s", "--storage", "missing.log"])
case("study-show-empty-name", ["study", "show", "--name", "", "--storage", "missing.log"])
case("study-show-binary", ["study", "show", "--name", "s", "--storage", "b.log"], **{"b.log": BINARY})
case("study-list-missing", ["study", "list", "--storage", "missing.log"])
case("study-list-default-missing", ["study", "list"])
case("study-list-directory", ["study", "list", "--storage", "adir"])
case("study-list-binary", ["study", "list", "--storage", "b.log"], **{"b.log": BINARY})
case("study-list-empty-flag", ["study", "list", "--storage", ""])
# ------------------------------------------------------------------------------------------ export
E = ["export", "--from-json", "plan.json"]
case("export-from-json-with-tp", [*E, "--tp", "4"])
case("export-from-json-with-default-zero", [*E, "--zero", "1"])
case("export-from-json-with-model", [*E, "--model", "llama-3.1-70b"])
case("export-from-json-with-calibration", [*E, "--calibration", "x.yaml"])
case("export-from-json-missing", ["export", "--from-json", "missing.json"])
case("export-from-json-binary", ["export", "--from-json", "b.json"], **{"b.json": BINARY})
case("export-from-json-invalid", ["export", "--from-json", "b.json"], **{"b.json": "{oops"})
case("export-from-json-duplicate", ["export", "--from-json", "b.json"], **{"b.json": '{"a": 1, "a": 2}'})
case("export-from-json-nan", ["export", "--from-json", "b.json"], **{"b.json": '{"tp": NaN}'})
case("export-from-json-empty-list", ["export", "--from-json", "b.json"], **{"b.json": "[]"})
case("export-from-json-scalars", ["export", "--from-json", "b.json"], **{"b.json": "[1, 2]"})
case("export-from-json-directory", ["export", "--from-json", "adir"])
case("export-from-json-fifo", ["export", "--from-json", "fifo"])
case("export-record-out-of-range", [*E, "--record", "5"])
case("export-format-bogus", [*E, "--format", "bogus"])
case("export-out-dir", [*E, "--out", "adir"])
case("export-out-missing-parent", [*E, "--out", "missing/x.txt"])
case("export-out-chardev-2", [*E, "--out", "chardev"])
case("export-out-fifo-2", [*E, "--out", "fifo"])
case("export-out-dangling", [*E, "--out", "dangling"])
case("export-no-job", ["export", "--format", "megatron"])
case("export-empty-json-object", ["export", "--from-json", "b.json"], **{"b.json": "{}"})
# ---------------------------------------------------------------------------------------- validate
V = ["validate", "--layouts", "good.json", "--calibration", "cpu.yaml"]
case("validate-layouts-missing", ["validate", "--layouts", "missing.json"])
case("validate-layouts-binary", ["validate", "--layouts", "b.json"], **{"b.json": BINARY})
case("validate-layouts-empty", ["validate", "--layouts", "b.json"], **{"b.json": ""})
case("validate-layouts-null", ["validate", "--layouts", "b.json"], **{"b.json": "null"})
case(
    "validate-layouts-unknown-key",
    ["validate", "--layouts", "b.json"],
    **{"b.json": _json([{"dp": 4, "zeroo": 3}])},
)
case(
    "validate-layouts-unknown-top-key",
    ["validate", "--layouts", "b.json"],
    **{"b.json": _json(GOOD_LAYOUTS | {"jobs": {}})},
)
case("validate-layouts-bad-value", ["validate", "--layouts", "b.json"], **{"b.json": _json([{"dp": -1}])})
case("validate-layouts-entry-not-dict", ["validate", "--layouts", "b.json"], **{"b.json": _json([1])})
case(
    "validate-layouts-job-unknown-key",
    ["validate", "--layouts", "b.json"],
    **{"b.json": _json({**GOOD_LAYOUTS, "job": {"modle": "x"}})},
)
case(
    "validate-layouts-job-bad-seq",
    ["validate", "--layouts", "b.json"],
    **{"b.json": _json({**GOOD_LAYOUTS, "job": {**GOOD_LAYOUTS["job"], "seq_len": "long"}})},
)
case("validate-layouts-no-job", ["validate", "--layouts", "b.json"], **{"b.json": _json([{"dp": 4}])})
case(
    "validate-layouts-duplicate-key",
    ["validate", "--layouts", "b.json"],
    **{"b.json": '[{"dp": 4, "dp": 2}]'},
)
case("validate-layouts-yaml-bad", ["validate", "--layouts", "b.yaml"], **{"b.yaml": "- {dp: 4\n"})
case(
    "validate-grad-accum-indivisible",
    ["validate", "--layouts", "b.json", "--calibration", "cpu.yaml"],
    **{"b.json": _json({**GOOD_LAYOUTS, "layouts": [{"dp": 4, "micro_batch": 3}]})},
)
case("validate-json-directory", [*V, "--json", "adir"])
case("validate-json-missing-dir", [*V, "--json", "missing/out.json"])
case("validate-json-chardev", [*V, "--json", "chardev"])
case("validate-json-fifo", [*V, "--json", "fifo"])
case("validate-json-link-to-dir", [*V, "--json", "link_to_dir"])
case("validate-refit-missing-dir", [*V, "--refit", "missing/new.yaml"])
case("validate-json-equals-refit", [*V, "--json", "o.yaml", "--refit", "o.yaml"])
case(
    "validate-refit-two-worlds",
    ["validate", "--layouts", "b.json", "--calibration", "cpu.yaml", "--refit", "n.yaml"],
    **{"b.json": _json({**GOOD_LAYOUTS, "layouts": [{"dp": 4, "zero": 3}, {"dp": 2, "zero": 3}]})},
)
case("validate-timeout-negative", [*V, "--timeout", "-5"])
case("validate-steps-le-warmup", [*V, "--steps", "2", "--warmup", "2"])
case("validate-warmup-negative", [*V, "--warmup", "-1"])
case("validate-study-empty-name", ["validate", "--study", ""])
case("validate-study-missing-storage", ["validate", "--study", "x", "--storage", "missing.log"])
# --------------------------------------------------------------------------------------- calibrate
case("calibrate-raw-missing", ["calibrate", "--from-raw", "missing.json"])
case("calibrate-raw-binary", ["calibrate", "--from-raw", "r.json"], **{"r.json": BINARY})
case("calibrate-raw-invalid", ["calibrate", "--from-raw", "r.json"], **{"r.json": "{not json"})
case("calibrate-raw-list", ["calibrate", "--from-raw", "r.json"], **{"r.json": "[1]"})
case("calibrate-raw-empty-object", ["calibrate", "--from-raw", "r.json"], **{"r.json": "{}"})
case("calibrate-raw-bad-world", ["calibrate", "--from-raw", "r.json"], **{"r.json": '{"world_size": -1}'})
case(
    "calibrate-raw-not-results",
    ["calibrate", "--from-raw", "r.json"],
    **{"r.json": '{"world_size": 2, "foo": 1}'},
)
case("calibrate-raw-fifo", ["calibrate", "--from-raw", "fifo"])
case("calibrate-out-dir-missing", ["calibrate", "--out-dir", "missing", "--quick"])
case("calibrate-out-dir-file", ["calibrate", "--out-dir", "plan.json", "--quick"])
case("calibrate-save-raw-dir", ["calibrate", "--save-raw", "adir", "--quick"])
case("calibrate-save-raw-chardev", ["calibrate", "--save-raw", "chardev", "--quick"])
case("calibrate-name-slash", ["calibrate", "--name", "a/b", "--quick"])
case("calibrate-name-newline", ["calibrate", "--name", "a\nb", "--quick"])
case("calibrate-world-0", ["calibrate", "--world-size", "0"])
case("calibrate-timeout-negative", ["calibrate", "--timeout", "-1"])
# ------------------------------------------------------------------------------------------- sweep
SW = "models: [llama-3.1-8b]\ndevices: [h100-sxm-80gb]\nnum_devices: [8]\nseq_len: [4096]\nglobal_batch: [64]\n"
case("sweep-missing", ["sweep", "missing.yaml"])
case("sweep-binary", ["sweep", "w.yaml"], **{"w.yaml": BINARY})
case("sweep-empty", ["sweep", "w.yaml"], **{"w.yaml": ""})
case("sweep-unknown-key", ["sweep", "w.yaml"], **{"w.yaml": SW + "device: [x]\n"})
case("sweep-duplicate-key", ["sweep", "w.yaml"], **{"w.yaml": SW + "seq_len: [8]\n"})
case("sweep-out-directory", ["sweep", "w.yaml", "--out", "adir"], **{"w.yaml": SW})
case("sweep-out-missing-dir", ["sweep", "w.yaml", "--out", "missing/t.csv"], **{"w.yaml": SW})
case("sweep-out-chardev", ["sweep", "w.yaml", "--out", "chardev"], **{"w.yaml": SW})
case("sweep-name-traversal", ["sweep", "w.yaml"], **{"w.yaml": "name: ../evil\n" + SW})
case("sweep-num-devices-0", ["sweep", "w.yaml"], **{"w.yaml": SW.replace("[8]", "[0]")})
case("sweep-price-nan", ["sweep", "w.yaml"], **{"w.yaml": SW + "price_per_device_hour: .nan\n"})
case(
    "sweep-grid-too-large",
    ["sweep", "w.yaml"],
    **{"w.yaml": SW.replace("[8]", "[" + ", ".join(["8"] * 20001) + "]")},
)
case("sweep-directory", ["sweep", "adir"])
# ----------------------------------------------------------------------------- compare and serve
CMP = ["compare", "--model", "llama-3.1-8b", "--devices", "h100-sxm-80gb", "--num-devices", "8"]
CMP += ["--workload", "training", "--seq-len", "4096", "--global-batch", "64"]
case("compare-out-missing-dir", [*CMP, "--out", "missing/cmp"])
case("compare-out-csv-is-dir", [*CMP, "--out", "cmp"], **{"cmp.csv__keep": ""})
case("compare-device-unknown", [*CMP[:3], "--devices", "h999", *CMP[5:]])
case(
    "serve-isl-0",
    [
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "8",
        "--isl",
        "0",
        "--osl",
        "128",
    ],
)
case(
    "serve-ttft-nan",
    [
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "8",
        "--isl",
        "128",
        "--osl",
        "128",
        "--ttft-ms",
        "nan",
    ],
)

# ----------------------------------------------------------------------- caps, bombs and huge numbers
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
case("cal-alias-bomb", C, **{"c.yaml": BOMB})
case("cal-recursive-alias", C, **{"c.yaml": "a: &a [*a]\n"})
case("space-alias-bomb", [*R, "--space", "s.yaml"], **{"s.yaml": BOMB})
case("sweep-alias-bomb", ["sweep", "w.yaml"], **{"w.yaml": BOMB})
case("device-alias-bomb", ["predict", *J[:3], "d.yaml", *J[4:]], **{"d.yaml": BOMB})
case("validate-layouts-alias-bomb", ["validate", "--layouts", "b.yaml"], **{"b.yaml": BOMB})
case("layout-first-stage-huge", [*P, "--pp", "2", "--first-stage-layers", str(10**26)])
case("layout-shard-group-huge", [*P, "--shard-group", str(10**26)])
case("recommend-top-huge", [*R, "--top", str(10**9)])
case("recommend-workers-huge", [*R, "--workers", str(10**6)])
case("study-seed-negative", [*S, "--seed", "-1"])
case("study-seed-huge", [*S, "--seed", str(2**40)])
case("study-seed-top-k-huge", [*S, "--seed-top-k", str(10**8)])
case("calibrate-world-huge", ["calibrate", "--world-size", str(10**6)])
case(
    "validate-world-huge",
    ["validate", "--layouts", "b.json"],
    **{"b.json": _json({**GOOD_LAYOUTS, "layouts": [{"dp": 100000, "zero": 3}]})},
)
case("validate-layouts-inf", ["validate", "--layouts", "b.json"], **{"b.json": '[{"dp": 1e999}]'})
case(
    "model-layers-inf",
    ["predict", "--model", "m.json", *J[2:]],
    **{"m.json": _json(HF)[:-1] + ', "num_hidden_layers": 1e999}'.replace('"num_hidden_layers": 32, ', "")},
)
case(
    "serve-isl-huge",
    [
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "8",
        "--isl",
        str(10**23),
        "--osl",
        "12",
    ],
)

# ------------------------------------------------------- limits (autopar.limits): one place for every bound
BIG = "9" * 5000  # past Python's 4,300-digit int() guard: a traceback before the limits module
LONG = "1" * 31  # one digit over limits.MAX_INT_DIGITS
case(
    "int-5000-digits-model-config",
    ["predict", "--model", "m.json", *J[2:]],
    "digits",
    **{"m.json": _json(HF)[:-1] + f', "rope_theta": {BIG}}}'},
)
case(
    "int-31-digits-model-config",
    ["predict", "--model", "m.json", *J[2:]],
    "digits",
    **{"m.json": _json(HF)[:-1] + f', "rope_theta": {LONG}}}'},
)
case(
    "int-5000-digits-model-cmd",
    ["model", "m.json"],
    "digits",
    **{"m.json": _json(HF)[:-1] + f', "x": {BIG}}}'},
)
case(
    "int-5000-digits-dit-config",
    ["dit", "model", "t.json"],
    "digits",
    **{"t.json": '{"_class_name": "SD3Transformer2DModel", "num_layers": ' + BIG + "}"},
)
case(
    "int-5000-digits-device",
    ["predict", *J[:3], "d.yaml", *J[4:]],
    "digits",
    **{"d.yaml": _dev() + f"tdp_extra: {BIG}\n"},
)
case("int-5000-digits-calibration", C, "digits", **{"c.yaml": _DEFAULT_CAL + f"extra: {BIG}\n"})
case(
    "int-5000-digits-space-yaml", [*R, "--space", "s.yaml"], "digits", **{"s.yaml": f"name: a\ntp: [{BIG}]\n"}
)
case(
    "int-5000-digits-space-toml",
    [*R, "--space", "s.toml"],
    "digits",
    **{"s.toml": f'name = "a"\nx = {BIG}\n'},
)
case(
    "int-31-digits-space-toml", [*R, "--space", "s.toml"], "digits", **{"s.toml": f'name = "a"\nx = {LONG}\n'}
)
case("int-5000-digits-sweep", ["sweep", "w.yaml"], "digits", **{"w.yaml": SW.replace("[8]", f"[{BIG}]")})
case(
    "int-5000-digits-layouts",
    ["validate", "--layouts", "b.json"],
    "digits",
    **{"b.json": '[{"dp": ' + BIG + "}]"},
)
case(
    "int-5000-digits-from-json",
    ["export", "--from-json", "b.json"],
    "digits",
    **{"b.json": '{"tp": ' + BIG + "}"},
)
case(
    "int-5000-digits-from-raw",
    ["calibrate", "--from-raw", "r.json"],
    "digits",
    **{"r.json": '{"world_size": ' + BIG + "}"},
)
case("int-5000-digits-flag", [*P, "--tp", BIG], "digits")
case("int-5000-digits-set", [*R, "--set", f"tp={BIG}"], "...")
case(
    "int-5000-digits-buckets",
    [
        "dit",
        "train",
        "--model",
        "wan2.1-t2v-1.3b",
        *J[2:6],
        "--buckets",
        f"{BIG}x832x81",
        "--global-batch",
        "8",
    ],
)
case("int-5000-digits-whatif-n", ["whatif", *J, "--vary", f"memory_gb=10:100:{BIG}"])
case(
    "model-zero-heads",
    ["predict", "--model", "m.json", *J[2:]],
    "num_attention_heads is 0",
    **{"m.json": _json(HF | {"num_attention_heads": 0})},
)
case(
    "model-cmd-zero-heads",
    ["model", "m.json"],
    "must be positive",
    **{"m.json": _json(HF | {"num_attention_heads": 0})},
)
case(
    "model-raw-zero-heads",
    ["model", "t.json"],
    "heads must be positive",
    **{"t.json": _json(TINY | {"heads": 0})},
)
case(
    "model-zero-layers",
    ["model", "m.json"],
    "num_hidden_layers is 0",
    **{"m.json": _json(HF | {"num_hidden_layers": 0})},
)
# ------------------------------------------------- names and paths reach the terminal escaped, on one line
case("path-newline", [*P, "--calibration", "a\nb.yaml"], "a\\nb.yaml")
case("path-escape", [*P, "--calibration", "\x1b[31mred.yaml"], "\\x1b[31mred.yaml")
case("path-newline-model", ["predict", "--model", "x\ny.json", *J[2:]], "\\n")
case("path-markup", [*P, "--calibration", "[bold]x[/].yaml"], "[bold]x[/].yaml")
case("flag-escape", [*P, "--tp", "\x1b]0;title\x07"], "\\x1b]0;title\\x07")
case("html-not-utf8", [*R, "--html", "\udcff.html"], "not a UTF-8 file name")
case("model-path-escape", ["predict", "--model", "\x1b[2J.json", *J[2:]], "\\x1b[2J")
# ------------------------------------------------------------------------------- serving and what-if
SV = ["serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
SV += ["--isl", "128", "--osl", "128"]
case("serve-html-not-utf8", [*SV, "--html", "\udcffx.html"], "not a UTF-8 file name")
case("serve-num-devices-2^20", [*SV[:5], "--num-devices", str(2**20), *SV[7:]], "16,384")
case("serve-tp-3-dense", [*SV, "--tp", "3"], "must divide the attention heads")
case("serve-ep-4-dense", [*SV, "--ep", "4"], "dense model")
case("serve-adp-2-dense", [*SV, "--adp", "2"], "dense model")
case(
    "whatif-grid-10^6",
    ["whatif", *J, "--vary", "memory_bw_gbps=2000:8000:1000", "--vary", "peak_tflops.bf16=500:2000:1000"],
    "10,000",
)
case("whatif-axis-n-huge", ["whatif", *J, "--vary", "memory_bw_gbps=2000:8000:1000000"], "10,000")
case(
    "compare-cells-over-limit",
    [*CMP[:7], "--workload", "training", "--seq-len", ",".join(str(64 * i) for i in range(1, 41))]
    + ["--global-batch", ",".join(str(i) for i in range(1, 41))],
    "1,000",
)
case("recommend-ray-unreachable", [*R, "--ray", "127.0.0.1:1"], "cannot reach Ray")
case("recommend-ray-port-out-of-range", [*R, "--ray", "127.0.0.1:70000"], "out of range")
# ----------------------------------------------------------------------------------------------- DiT
SD35M = SD35_MEDIUM  # stabilityai/stable-diffusion-3.5-medium transformer config (test_dit)
G = ["dit", "generate", "--model", "wan2.1-t2v-1.3b", "--device", "h100-sxm-80gb", "--num-devices", "64"]
G += ["--height", "480", "--width", "832"]
case(
    "dit-head-dim-fraction",
    ["dit", "model", "t.json"],
    "whole number",
    **{"t.json": _json(SD35M | {"attention_head_dim": 127.5})},
)
case(
    "dit-layers-1e12",
    ["dit", "model", "t.json"],
    "1,024",
    **{"t.json": _json(SD35M | {"num_layers": 10**12})},
)
case(
    "dit-width-huge",
    ["dit", "model", "t.json"],
    "over the limit",
    **{"t.json": _json(SD35M | {"num_attention_heads": 60000})},
)
case(
    "dit-dual-layers-out-of-range",
    ["dit", "model", "t.json"],
    "distinct blocks",
    **{"t.json": _json(SD35M | {"dual_attention_layers": [0, 24]})},
)
case("dit-frames-vae-cannot-take", [*G, "--frames", "82"], "81 or 85")
case("dit-pipefusion-above-blocks", [*G, "--frames", "81", "--pipefusion", "64"], "30 transformer blocks")
case(
    "dit-warmup-above-steps", [*G, "--frames", "81", "--steps", "10", "--warmup-steps", "20"], "exceeds steps"
)


def _tree(root: Path) -> dict[str, tuple[int, int, int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from autopar.prediction import predict

    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "tiny.json").write_text(json.dumps(TINY))
    (tmp_path / "existing.txt").write_text("old\n")
    (tmp_path / "link_to_dir").symlink_to("adir")
    (tmp_path / "dangling").symlink_to("missing/target.txt")
    os.mkfifo(tmp_path / "fifo")
    try:
        os.mknod(tmp_path / "chardev", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    except (PermissionError, OSError):
        (tmp_path / "chardev").symlink_to("/dev/null")  # not root: a link to a character device
    rec = predict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=64)
    (tmp_path / "plan.json").write_text(json.dumps(rec.to_dict(), default=float))
    (tmp_path / "good.json").write_text(json.dumps(GOOD_LAYOUTS))
    (tmp_path / "cpu.device.yaml").write_text(_CPU_DEV)
    cal = (
        Path(__file__).resolve().parent.parent / "cost_models" / "calibration" / "cpu-gloo-w4.yaml"
    ).read_text()
    (tmp_path / "cpu.yaml").write_text(cal)
    return tmp_path


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.mark.parametrize(("cid", "argv", "files"), CASES, ids=[c for c, _, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_no_file(
    workdir: Path,
    cid: str,
    argv: list[str],
    files: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch,
) -> None:
    from autopar.runner import launch

    def no_runs(*a: Any, **k: Any) -> Any:  # a bad input must be refused before anything runs
        raise AssertionError("a run was launched")

    monkeypatch.setattr(launch, "run_layouts", no_runs)
    monkeypatch.setattr(launch, "run_layout", no_runs)
    for name, content in files.items():
        if name.endswith("/keep"):  # a directory where a file is expected
            (workdir / name[: -len("/keep")]).mkdir()
            continue
        p = workdir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _tree(workdir)
    capsys.readouterr()
    rc = _run(argv)
    err = capsys.readouterr().err
    assert rc == 2, f"exit {rc}: {err}"
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in err
    assert line.isprintable(), f"a control character reaches the terminal: {line!r}"
    assert len(line) <= 2 * MAX_MESSAGE_CHARS + 100, f"a {len(line):,}-character line"
    assert line.rstrip().endswith(")") and " (" in line, f"no hint (what to do) in: {line}"
    assert _tree(workdir) == before, "a file was created, replaced or touched"
    if cid in EXPECT:  # the line names the real cause
        assert EXPECT[cid] in line, line


def test_corpus_is_large_and_varied() -> None:
    assert len(CASES) >= 120
    assert len({c for c, _, _ in CASES}) == len(CASES)
    commands = {a[0] for _, a, _ in CASES}
    assert commands >= {
        "predict",
        "recommend",
        "study",
        "export",
        "validate",
        "calibrate",
        "sweep",
        "compare",
        "serve",
        "model",
        "dit",
        "whatif",
    }


# ------------------------------------------------------ hostile names that must print as written (exit 0)
def test_markup_in_study_and_model_names_prints_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study named ``[/]`` crashed rich after its trials ran; ``[bold]`` in a name was swallowed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "[bold]m.json").write_text(json.dumps(HF))
    argv = ["study", "run", "--name", "[/]", "--model", "[bold]m.json", *J[2:], "--storage", "s.log"]
    assert _run([*argv, "--n-trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "study [/]: [bold]m.json on 8 x h100-sxm-80gb" in out
    (tmp_path / "space.yaml").write_text('name: "[red]x[/]"\n')
    assert _run(["recommend", "--model", "[bold]m.json", *J[2:], "--space", "space.yaml", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "search space [red]x[/]" in out and "[bold]m.json on 8 x h100-sxm-80gb" in out


def test_a_non_utf8_html_name_is_refused_before_the_search(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import autopar.search.recommend as rec

    def no_search(*a: Any, **k: Any) -> Any:
        raise AssertionError("the search ran before the --html name was checked")

    monkeypatch.setattr(rec, "recommend", no_search)
    assert _run([*R, "--html", "r\udcff.html"]) == 2
    assert "r\\udcff.html is not a UTF-8 file name" in capsys.readouterr().err


def _cli(args: list[str], cwd: Path, **env: str) -> Any:
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "PYTHONIOENCODING")} | env
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], cwd=cwd, env=e, capture_output=True, timeout=300
    )


@pytest.mark.parametrize("backend", ["module://matplotlib_inline_absent.backend_inline", "bogus"])
def test_a_foreign_mplbackend_does_not_break_the_report(tmp_path: Path, backend: str) -> None:
    """Jupyter exports MPLBACKEND=module://matplotlib_inline.backend_inline; where that module is
    absent (or the value is mistyped) the import of matplotlib used to raise after the search."""
    r = _cli([*R, "--top", "1", "--html", "r.html"], tmp_path, MPLBACKEND=backend)
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert (tmp_path / "r.html").read_text().count("<svg") >= 1


def test_an_ascii_terminal_gets_escapes_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(HF | {"_name_or_path": "caf\u00e9-\u6a21\u578b"}))
    r = _cli(["model", "m.json"], tmp_path, PYTHONIOENCODING="ascii")
    assert r.returncode == 0, r.stderr.decode()
    assert b"caf\\xe9-\\u6a21\\u578b" in r.stdout
    r = _cli(["predict", "--model", "caf\u00e9.json", *J[2:]], tmp_path, PYTHONIOENCODING="ascii")
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and b"caf\\xe9.json" in r.stderr


def test_serving_exports_name_a_loadable_checkpoint(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vllm serve llama-3.1-8b`` named a preset id, which vLLM cannot load."""
    from autopar.export import parse
    from autopar.serving.search import serve

    kw = dict(device="h100-sxm-80gb", num_devices=8, isl=128, osl=128, top=1)
    (workdir / "s.json").write_text(json.dumps(serve(model="llama-3.1-8b", **kw).to_dict(), default=float))
    assert _run(["export", "--from-json", "s.json", "--format", "vllm"]) == 0
    text = capsys.readouterr().out
    assert "vllm serve meta-llama/Llama-3.1-8B" in text
    assert parse(text, "vllm")[1].model == "llama-3.1-8b"  # the checkpoint maps back to the job's model
    assert _run(["export", "--from-json", "s.json", "--format", "sglang"]) == 0
    assert "--model-path meta-llama/Llama-3.1-8B" in capsys.readouterr().out
    # a config.json: its folder is the checkpoint
    assert _run(["serve", "--model", "cfg/tiny.json", *["--device", "h100-sxm-80gb", "--num-devices", "1"],
                 "--isl", "16", "--osl", "16", "--top", "1", "--json"]) == 0  # fmt: skip
    (workdir / "t.json").write_text(capsys.readouterr().out)
    assert _run(["export", "--from-json", "t.json", "--format", "vllm"]) == 0
    assert "vllm serve cfg \\" in capsys.readouterr().out
    # a preset without a checkpoint (a NeMo recipe's dimensions) is refused, saying what to pass
    (workdir / "g.json").write_text(json.dumps(serve(model="gpt3-20b", **kw).to_dict(), default=float))
    assert _run(["export", "--from-json", "g.json", "--format", "vllm"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "records no loadable checkpoint" in err and "config.json" in err
