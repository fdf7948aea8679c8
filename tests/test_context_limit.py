"""A sequence beyond the model's position limit is refused unless long-context work is declared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.errors import ModelConfigError
from autopar.job import Job
from autopar.model import load_model

TRAIN = ["--device", "h100-sxm-80gb", "--num-devices", "8", "--global-batch", "8"]


def test_limits_read_from_the_config():
    assert load_model("llama-3.1-8b").max_position == 131072
    assert load_model("llama-2-7b").max_position == 4096
    assert load_model("gpt-oss-120b").max_position == 131072  # YaRN 32 x 4096, also the stated maximum
    raw = load_model("qwen2.5-7b").to_dict()  # raw dimensions keep the limit they are given
    assert load_model(raw).max_position == load_model("qwen2.5-7b").max_position


def test_rope_scaled_limit_where_the_config_says_so():
    q = json.loads((Path(__file__).parents[1] / "autopar/presets/qwen3-8b.json").read_text())[
        "hf"
    ]  # 40960 without scaling; Qwen3's card: YaRN factor 4 over 32768 gives 131072
    assert load_model(q).max_position == 40960
    q["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert load_model(q).max_position == 131072


def test_training_seq_len_past_the_limit_is_refused(capsys):
    assert main(["predict", "--model", "llama-3.1-8b", *TRAIN, "--seq-len", "262144"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "131,072" in err[0] and "--allow-long-context" in err[0]
    assert main(["predict", "--model", "llama-3.1-8b", *TRAIN, "--seq-len", "131072", "--cp", "8"]) == 0
    capsys.readouterr()
    assert (
        main(
            ["predict", "--model", "llama-3.1-8b", *TRAIN, "--seq-len", "262144", "--cp", "8"]
            + ["--allow-long-context"]
        )
        == 0
    )


def test_api_and_job_declaration():
    job = Job.from_flat(
        model="llama-2-7b", device="h100-sxm-80gb", num_devices=8, seq_len=8192, global_batch=8
    )
    assert job.allow_long_context is False and job.flat()["allow_long_context"] is False
    with pytest.raises(ModelConfigError, match="4,096"):
        job.resolve()
    ok = job.model_copy(update={"allow_long_context": True})
    assert ok.resolve().seq_len == 8192
    assert Job.from_flat(**ok.flat()).allow_long_context is True


def test_serving_prompt_past_the_limit_is_refused(capsys):
    args = ["serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
    assert main([*args, "--isl", "1000000", "--osl", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "isl + osl" in err[0] and "131,072" in err[0]
