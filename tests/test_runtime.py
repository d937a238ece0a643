"""The native runtime against transformers' reference, and the KV cache's commit rules."""

import pytest
import torch

from conftest import make_hf_model
from foretell.models.config import ModelConfig
from foretell.models.transformer import Transformer


def native_copy(hf_model) -> Transformer:
    cfg = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    model = Transformer(cfg)
    model.load_hf_state_dict(dict(hf_model.state_dict()))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_logits_match_transformers_prefill_and_incremental(kind):
    hf = make_hf_model(kind, vocab_size=96, seed=3)
    model = native_copy(hf)
    ids = torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        cache = model.new_cache(32)
        full = model(ids, torch.arange(20), cache).logits
        assert torch.allclose(full, ref, atol=1e-5), (full - ref).abs().max()
        # 7 tokens, then one at a time, then a block of 4: each must see exactly its prefix.
        cache = model.new_cache(32)
        rows = []
        for lo, hi in [(0, 7)] + [(i, i + 1) for i in range(7, 16)] + [(16, 20)]:
            rows.append(model(ids[lo:hi], torch.arange(lo, hi), cache).logits)
            cache.commit_prefix(hi - lo)
        diff = (torch.cat(rows) - ref).abs().max()
        assert diff < 1e-4, diff


def test_hidden_states_match_transformers():
    hf = make_hf_model("llama", vocab_size=64, seed=4, layers=3)
    model = native_copy(hf)
    ids = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None], output_hidden_states=True).hidden_states
        out = model(ids, torch.arange(9), model.new_cache(16), hidden_layers=(0, 1, 2, 3))
    for layer in range(3):  # transformers' last entry is after the final norm, as is ours
        assert torch.allclose(out.hidden[layer], ref[layer][0], atol=1e-4)  # values reach ~70
    assert torch.allclose(out.hidden[3], ref[3][0], atol=1e-5)


def test_chain_rollback_overwrites_rejected_slots():
    hf = make_hf_model("llama", vocab_size=64, seed=5)
    model = native_copy(hf)
    ids = torch.tensor([5, 9, 11, 20, 33, 40])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        cache = model.new_cache(16)
        model(ids[:3], torch.arange(3), cache)
        cache.commit_prefix(3)
        model(torch.tensor([60, 61, 62]), torch.arange(3, 6), cache)  # a rejected draft
        out = model(ids[3:], torch.arange(3, 6), cache).logits
    assert torch.allclose(out, ref[3:], atol=1e-5)


def test_tree_commit_keeps_only_the_accepted_path():
    """Verify a 2-branch tree, keep one branch: the cache must equal a plain prefill of that path."""
    hf = make_hf_model("qwen2", vocab_size=64, seed=6)
    model = native_copy(hf)
    prefix = torch.tensor([3, 4, 5])
    # Tree after the prefix: node0=10 (root), node1=11 (child of 0), node2=12 (child of 0), node3=13 (child of 2)
    tokens = torch.tensor([10, 11, 12, 13])
    parents = [-1, 0, 0, 2]
    depth = torch.tensor([0, 1, 1, 2])
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents[j]
    with torch.no_grad():
        cache = model.new_cache(16)
        model(prefix, torch.arange(3), cache)
        cache.commit_prefix(3)
        tree_logits = model(tokens, 3 + depth, cache, tree_mask=mask).logits
        path = [10, 12, 13]
        ref = hf(torch.tensor([[3, 4, 5, *path]])).logits[0, 3:]
        assert torch.allclose(tree_logits[[0, 2, 3]], ref, atol=1e-5)
        cache.commit_slots(torch.tensor([0, 2, 3]))
        nxt = model(torch.tensor([7]), torch.tensor([6]), cache).logits
        ref_next = hf(torch.tensor([[3, 4, 5, *path, 7]])).logits[0, -1]
    assert cache.length == 6
    assert torch.allclose(nxt[0], ref_next, atol=1e-5)


def test_cache_overflow_is_reported():
    hf = make_hf_model("llama", vocab_size=32, seed=7)
    model = native_copy(hf)
    cache = model.new_cache(4)
    with pytest.raises(ValueError, match="overflow"):
        model(torch.arange(5), torch.arange(5), cache)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_batched_sequence_forward_matches_transformers_and_trains(kind):
    hf = make_hf_model(kind, vocab_size=64, seed=8)
    model = native_copy(hf)
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
    out = model.forward_sequences(ids, hidden_layers=(1,))
    assert (out.logits - ref).abs().max() < 1e-4
    assert out.hidden[1].shape == (3, 11, 64)
    out.logits.logsumexp(-1).mean().backward()  # gradients flow through every layer
    assert model.layers[0].qkv_proj.weight.grad is not None
