"""Bad config.json files: `autopar model PATH` exits 2 with one stderr line naming the file and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.cli.main import main

PRESETS = Path(__file__).parents[1] / "autopar" / "presets"
BASE = json.loads((PRESETS / "llama-3.1-8b.json").read_text())["hf"]


def _text(cfg: dict) -> str:
    return json.dumps(cfg)


CASES = {
    # name: (file content, words the one line must hold)
    "nan_unused_field": (
        _text(BASE).replace('"rope_theta": 500000.0', '"rope_theta": NaN'),
        ["rope_theta", "NaN"],
    ),
    "nan_width": (_text(BASE).replace('"hidden_size": 4096', '"hidden_size": NaN'), ["hidden_size", "NaN"]),
    "infinity": (
        _text(BASE).replace('"num_hidden_layers": 32', '"num_hidden_layers": -Infinity'),
        ["num_hidden_layers"],
    ),
    "string_number": (_text(dict(BASE, hidden_size="4096")), ["hidden_size", "string"]),
    "string_word": (_text(dict(BASE, num_attention_heads="thirty-two")), ["num_attention_heads"]),
    "bool_number": (_text(dict(BASE, num_hidden_layers=True)), ["num_hidden_layers", "integer"]),
    "string_bool": (_text(dict(BASE, tie_word_embeddings="yes")), ["tie_word_embeddings", "true or false"]),
    "fractional": (_text(dict(BASE, intermediate_size=14336.5)), ["intermediate_size", "integer"]),
    "negative": (_text(dict(BASE, num_hidden_layers=-3)), ["layers", "positive"]),
    "duplicate_key": (
        '{"model_type": "llama", "hidden_size": 4096, "hidden_size": 8192}',
        ["hidden_size", "twice"],
    ),
    "top_level_list": ("[1, 2, 3]", ["list", "object"]),
    "top_level_string": ('"llama"', ["str", "object"]),
    "malformed": ('{"model_type": "llama",,}', ["malformed JSON", "line 1"]),
    "empty": ("", ["malformed JSON"]),
    "text_config_not_object": (_text(dict(BASE, text_config=[1])), ["text_config", "object"]),
    "model_type_not_string": (_text(dict(BASE, model_type=7)), ["model_type", "string"]),
    "layer_types_wrong_length": (
        _text(dict(BASE, sliding_window=4096, layer_types=["sliding_attention"] * 3)),
        ["layer_types", "32"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_one_line_exit_2(case: str, tmp_path: Path, capsys) -> None:
    text, words = CASES[case]
    p = tmp_path / f"{case}.json"
    p.write_text(text)
    assert main(["model", str(p)]) == 2  # any other exception would surface here as a traceback
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and f"{case}.json" in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_binary_directory_and_large_files(tmp_path: Path, capsys) -> None:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(bytes(range(256)) * 64)
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"model_type": "llam\xe9"}'.encode("latin-1"))
    empty_dir = tmp_path / "no_config_here"
    empty_dir.mkdir()
    big = tmp_path / "tokenizer.json"
    big.write_text('{"model_type": "llama", "vocab": "' + "a" * 5_000_000 + '"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path, words in (
        (binary, ["binary"]),
        (latin, ["UTF-8"]),
        (empty_dir, ["no config.json", "no_config_here"]),
        (big, ["5.0 MB", "too large"]),
        (deep, ["deep.json"]),
    ):
        assert main(["model", str(path)]) == 2, path
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_directory_with_config_loads(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(_text(BASE))
    assert main(["model", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_params"] == 8_030_261_248


def test_binary_file_through_the_real_cli(tmp_path: Path) -> None:
    binary = tmp_path / "pytorch_model.bin"
    binary.write_bytes(b"\x80\x02}q\x00" + bytes(range(256)) * 16)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "model", str(binary)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "pytorch_model.bin" in lines[0] and "binary" in lines[0]
