"""A target's int8 / int4 layers are kept in the cache after the first load and read back, not made again, by the
next (runtime/quant_cache.py); a damaged file is made again."""

import pytest
import torch

from conftest import PROMPTS, greedy_params


@pytest.fixture
def keep_small(monkeypatch):
    from foretell.runtime import quant_cache

    monkeypatch.setattr(quant_cache, "KEEP_BYTES", 0)  # the tiny test model is kept too


def kept_files(cache):
    return sorted((cache / "quant").glob("*.safetensors"))


def tokens(pipe):
    return [pipe.engine.generate(p, greedy_params(12)).tokens for p in PROMPTS]


@pytest.mark.parametrize("quant", ["int4", "int8", "int4-q8"])
def test_second_load_reads_the_kept_layers(tiny_pair, tmp_path, keep_small, monkeypatch, capsys, quant):
    from foretell.api import load
    from foretell.runtime import quant as q

    first = load(tiny_pair[0], "none", quant=quant, warm_up=False, cache_dir=tmp_path)
    (kept,) = kept_files(tmp_path)
    assert kept.name.startswith(f"target-{quant.removesuffix('-q8')}-float32-")
    want = tokens(first)

    def refuse(*args, **kwargs):
        raise AssertionError("quantized again")

    monkeypatch.setattr(q.Int4Linear, "from_weight", refuse)
    monkeypatch.setattr(q.Int8Linear, "from_weight", refuse)
    capsys.readouterr()
    again = load(tiny_pair[0], "none", quant=quant, warm_up=False, cache_dir=tmp_path)
    assert "quantized layers from" in capsys.readouterr().err
    assert tokens(again) == want
    layers = lambda pipe: {n: type(m) for n, m in pipe.target.model.named_modules()  # noqa: E731
                           if isinstance(m, (q.Int4Linear, q.Int8Linear))}
    assert layers(again) == layers(first) and len(layers(first)) == 2 * 4 + 1  # qkv, o, gate_up, down a layer, head


def test_kept_int4_layer_is_the_same_layer():
    from foretell.runtime.quant import Int4Linear

    torch.manual_seed(0)
    layer = Int4Linear.from_weight(torch.randn(48, 96), torch.randn(48))
    again = Int4Linear.from_blocks(*layer.blocks, layer.bias)
    assert torch.equal(again.packed, layer.packed) and torch.equal(again.scales_offsets, layer.scales_offsets)
    x = torch.randn(3, 96)
    assert torch.equal(again(x), layer(x))
    assert torch.equal(again.pytorch_product(x.bfloat16()), layer.pytorch_product(x.bfloat16()))


def test_damaged_file_is_made_again(tiny_pair, tmp_path, keep_small, capsys):
    from foretell.api import load

    want = tokens(load(tiny_pair[0], "none", quant="int4", warm_up=False, cache_dir=tmp_path))
    (kept,) = kept_files(tmp_path)
    kept.write_bytes(kept.read_bytes()[:100])
    again = load(tiny_pair[0], "none", quant="int4", warm_up=False, cache_dir=tmp_path)
    assert "quantizing again" in capsys.readouterr().err
    assert tokens(again) == want and kept.stat().st_size > 100


def test_small_models_and_other_formats_are_not_kept(tiny_pair, tmp_path):
    from foretell.api import load

    load(tiny_pair[0], "none", quant="int4", warm_up=False, cache_dir=tmp_path)  # under KEEP_BYTES
    assert kept_files(tmp_path) == []


def test_a_file_made_from_other_weights_is_replaced(tiny_pair, tmp_path, keep_small):
    """Weights that changed since (another file of the folder's): a new file is made and the stale one deleted."""
    import os
    import shutil

    from foretell.api import load

    folder = shutil.copytree(tiny_pair[0], tmp_path / "model")
    load(folder, "none", quant="int4", warm_up=False, cache_dir=tmp_path)
    (first,) = kept_files(tmp_path)
    weights = next(folder.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    load(folder, "none", quant="int4", warm_up=False, cache_dir=tmp_path)
    (second,) = kept_files(tmp_path)
    assert second != first
