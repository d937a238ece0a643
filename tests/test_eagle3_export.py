"""Exports: EAGLE-3 heads in the checkpoint layout vLLM and SGLang load (checked against what their loaders
read, docs/eagle3.md cites the source), the round trip back into foretell, checkpoints trained elsewhere,
and a draft model as transformers' assistant_model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import PROMPTS, greedy_params, make_hf_model, make_tokenizer, save_model_folder
from foretell.api import load
from foretell.cli import main
from foretell.config import EagleTreeShape
from foretell.drafters.eagle_tree import Eagle3Drafter
from foretell.errors import ForetellError
from foretell.models.eagle3 import Eagle3Config, new_eagle3_head, save_eagle3_head
from foretell.models.eagle3_format import export_eagle3, load_eagle3_head

VOCAB, LAYERS, H = 48, 4, 64
AUX = (1, 2, 3)  # foretell's hook layers; vLLM ids 1, 2, 3 (inputs of layers 1..3), SGLang ids 0, 1, 2 (outputs of 0..2)
DRAFT_IDS = torch.tensor([0, 2, 3, 5] + list(range(9, 45)))


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A 4-layer tiny target (three aux layers strictly between the embeddings and the final norm) and a head."""
    root = tmp_path_factory.mktemp("eagle3_export")
    folder = save_model_folder(root / "target", make_hf_model("llama", VOCAB, seed=0, layers=LAYERS), make_tokenizer(VOCAB))
    pipe = load(folder, "none", warm_up=False)
    config = Eagle3Config.for_target(pipe.target.model.config, draft_vocab_size=len(DRAFT_IDS), aux_layers=AUX)
    head = new_eagle3_head(pipe.target.model, config, seed=7, draft_vocab=DRAFT_IDS)
    return folder, pipe, head


# --- the format, as the loaders read it -------------------------------------------------------


def test_config_keys_and_layer_ids(deep, tmp_path):
    _, _, head = deep
    raw = json.loads((export_eagle3(head, tmp_path / "x") / "config.json").read_text())
    # vLLM's model registry and SGLang's EntryClass both know this architecture.
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["model_type"] == "llama"
    assert raw["num_hidden_layers"] == 1 and raw["tie_word_embeddings"] is False  # SGLang ties lm_head otherwise
    assert (raw["vocab_size"], raw["draft_vocab_size"], raw["target_hidden_size"]) == (VOCAB, len(DRAFT_IDS), H)
    assert (raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]) == (H, 4, 2, 16)
    # vLLM: top-level ids, id k = the residual stream entering layer k; SGLang: eagle_config ids, id k = output of k.
    assert raw["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert raw["eagle_config"] == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}


def test_foretell_hook_layers_are_the_residual_stream_the_engines_capture(deep):
    """transformers' hidden_states[k] is the input of decoder layer k (what vLLM captures for id k and SGLang for
    id k - 1); foretell's hook layer k must be the same tensor for every k the engines can capture."""
    from transformers import AutoModelForCausalLM

    folder, pipe, _ = deep
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 13, 21, 40, 7]])
    with torch.no_grad():
        theirs = hf(ids, output_hidden_states=True).hidden_states
        ours = pipe.target.model.forward_sequences(ids, hidden_layers=tuple(range(LAYERS))).hidden
    for k in range(LAYERS):
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-4, rtol=1e-4)


def vllm_names(name: str) -> str:
    """The parameter vLLM's Eagle3LlamaForCausalLM.load_weights (llama_eagle3.py) loads a checkpoint name into."""
    if name == "d2t":
        return "draft_id_to_target_id"
    if "lm_head" not in name:
        name = "model." + name
    name = name.replace("midlayer.", "layers.0.")
    for shard, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj"),
                         ("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj")):
        name = name.replace(f".{shard}", f".{fused}")
    return name


def sglang_names(name: str) -> str:
    """The same for SGLang's LlamaForCausalLMEagle3.load_weights (llama_eagle3.py): `model.` prefixed unless a
    top-level parameter; midlayer keeps its name."""
    for shard, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj"),
                         ("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj")):
        name = name.replace(f".{shard}", f".{fused}")
    return name if name == "lm_head.weight" else "model." + name


def test_tensor_names_shapes_and_dtypes(deep, tmp_path):
    _, _, head = deep
    state = load_file(str(export_eagle3(head, tmp_path / "x") / "model.safetensors"))
    I, q, kv = 2 * H, 4 * 16, 2 * 16
    expected = {
        "fc.weight": (H, 3 * H), "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H), "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H), "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.post_attention_layernorm.weight": (H,), "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I), "norm.weight": (H,),
        "lm_head.weight": (len(DRAFT_IDS), H), "d2t": (len(DRAFT_IDS),), "t2d": (VOCAB,),
    }
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert all(v.dtype == torch.bfloat16 for k, v in state.items() if k not in ("d2t", "t2d"))
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    # d2t holds offsets: target id = draft id + d2t[draft id] (vLLM adds arange, SGLang's hot_token_id too).
    assert torch.equal(torch.arange(len(DRAFT_IDS)) + state["d2t"], DRAFT_IDS)
    assert torch.equal(state["t2d"].nonzero().flatten(), DRAFT_IDS)
    # Every tensor lands on a parameter of each engine's model, and the fused ones are complete.
    vllm = {"model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.input_layernorm.weight", "model.layers.0.hidden_norm.weight",
            "model.layers.0.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight",
            "draft_id_to_target_id"}
    assert {vllm_names(k) for k in state if k != "t2d"} == vllm  # vLLM skips t2d
    sglang = {n.replace("layers.0.", "midlayer.") for n in vllm - {"draft_id_to_target_id"}}
    assert {sglang_names(k) for k in state if k not in ("d2t", "t2d")} == sglang  # SGLang reads d2t as hot ids


def test_the_export_refuses_what_the_engines_cannot_load(deep, tmp_path):
    _, pipe, _ = deep
    target = pipe.target.model
    for layers, message in [((1, 2), "exactly 3 target layers"), ((0, 2, 3), "hook layers 1..3"),
                            ((1, 2, 4), "hook layers 1..3")]:
        head = new_eagle3_head(target, Eagle3Config.for_target(target.config, draft_vocab_size=8, aux_layers=layers))
        with pytest.raises(ForetellError, match=message):
            export_eagle3(head, tmp_path / "bad")
        assert not (tmp_path / "bad").exists()


# --- round trip and imports -----------------------------------------------------------------


def proposals(pipe, head, prompts=PROMPTS):
    """Every proposal the drafter makes while generating greedily (tokens and parents), and the outputs."""
    spec = pipe.with_drafter(Eagle3Drafter(head, EagleTreeShape(depth=4, width=3, max_nodes=12)))
    drafter, seen = spec.engine.drafter, []
    steps = drafter.propose_steps  # what the engine calls

    def recording(tokens, n):
        p = yield from steps(tokens, n)
        seen.append((p.tokens.tolist(), None if p.parents is None else p.parents.tolist()))
        return p

    drafter.propose_steps = recording
    outputs = [spec.engine.generate(prompt, greedy_params(24)).tokens for prompt in prompts]
    assert any(tokens for tokens, _ in seen), "the drafter proposed nothing"
    return seen, outputs


def test_export_import_round_trip_gives_identical_proposals(deep, tmp_path):
    _, pipe, head = deep
    target = pipe.target.model
    for dtype in (torch.float32, torch.bfloat16):
        back = load_eagle3_head(export_eagle3(head, tmp_path / str(dtype), dtype), target)
        assert back.config == head.config
        if dtype == torch.bfloat16:  # the reference is the head at the precision it was written in
            reference = new_eagle3_head(target, head.config, draft_vocab=DRAFT_IDS)
            reference.load_state_dict({k: v.to(dtype).to(v.dtype) for k, v in head.state_dict().items()})
        else:
            reference = head
        assert all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), back.state_dict().values()))
        assert proposals(pipe, back) == proposals(pipe, reference)
        again = load_file(str(export_eagle3(back, tmp_path / "again", dtype) / "model.safetensors"))
        first = load_file(str(tmp_path / str(dtype) / "model.safetensors"))
        assert all(torch.equal(first[k], again[k]) for k in first)  # export -> import -> export is byte-stable


def test_a_head_trained_elsewhere_imports(deep, tmp_path):
    """A SpecForge-style checkpoint: SGLang's eagle_config ids only, the target's embedding saved along, no
    target_hidden_size; foretell reads the layers as SGLang does (+ 1)."""
    _, pipe, head = deep
    folder = export_eagle3(head, tmp_path / "x", torch.float32)
    raw = json.loads((folder / "config.json").read_text())
    for key in ("eagle_aux_hidden_state_layer_ids", "target_hidden_size", "foretell", "head_dim"):
        raw.pop(key)
    raw["architectures"] = ["LlamaForCausalLMEagle3"]
    (folder / "config.json").write_text(json.dumps(raw))
    state = load_file(str(folder / "model.safetensors"))
    state["embed_tokens.weight"] = pipe.target.model.embed_tokens.weight.detach().to(torch.bfloat16)
    save_file(state, str(folder / "model.safetensors"))
    back = load_eagle3_head(folder, pipe.target.model)
    assert back.config.aux_layers == AUX
    assert proposals(pipe, back, PROMPTS[:2]) == proposals(pipe, head, PROMPTS[:2])


@pytest.mark.parametrize("change, message", [
    ({"tie_word_embeddings": True}, "tie_word_embeddings true"),
    ({"num_hidden_layers": 2}, "2 draft layers"),
    ({"norm_before_residual": True}, "norm_before_residual true"),
    ({"architectures": ["LlamaForCausalLM"]}, "architectures"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
     "name different target layers"),
])
def test_unsupported_checkpoints_are_refused(deep, tmp_path, change, message):
    _, pipe, head = deep
    folder = export_eagle3(head, tmp_path / "x")
    raw = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ForetellError, match=message):
        load_eagle3_head(folder, pipe.target.model)


@pytest.mark.parametrize("damage, message", [
    (lambda s: s["d2t"].fill_(VOCAB), "its d2t maps draft columns outside the target vocabulary"),  # ids past the end
    (lambda s: s["d2t"].zero_(), "its t2d does not mark exactly the tokens d2t maps to"),  # d2t no longer t2d's ids
    (lambda s: s["fc.weight"].__setitem__((0, 0), float("nan")), "holds NaN or infinite values \\(in fc.weight\\)"),
])
def test_damaged_weights_are_refused_naming_the_file(deep, tmp_path, damage, message):
    _, pipe, head = deep
    folder = export_eagle3(head, tmp_path / "x", torch.float32)
    state = load_file(str(folder / "model.safetensors"))
    damage(state)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ForetellError, match=f"{folder / 'model.safetensors'}.*{message}"):
        load_eagle3_head(folder, pipe.target.model)


def test_a_foreign_embedding_is_refused(deep, tmp_path):
    _, pipe, head = deep
    folder = export_eagle3(head, tmp_path / "x")
    state = load_file(str(folder / "model.safetensors"))
    state["embed_tokens.weight"] = torch.zeros(VOCAB, H, dtype=torch.bfloat16)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ForetellError, match="its own token embedding"):
        load_eagle3_head(folder, pipe.target.model)


def test_cli_exports_and_generate_imports(deep, tmp_path, capsys):
    folder, pipe, head = deep
    save_eagle3_head(head, tmp_path / "head")
    assert main(["export", "eagle3", "--head", str(tmp_path / "head"), "--target", str(folder),
                 "--out", str(tmp_path / "engine")]) == 0
    assert "SGLang ids [0, 1, 2]" in capsys.readouterr().out
    assert main(["generate", "w5 w9", "--model", str(folder), "--dtype", "float32", "--eagle", str(tmp_path / "engine"),
                 "--max-new-tokens", "8", "--no-chat", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drafter"] == "eagle3" and len(out["tokens"]) == 8
    assert main(["export", "dflash"]) == 2
    assert "does not map onto DFlash" in capsys.readouterr().err


# --- a draft model for transformers' assisted generation ------------------------------------


def test_exported_draft_works_as_transformers_assistant_model(tiny_pair, tmp_path):
    from transformers import AutoModelForCausalLM

    from foretell.models.derive import save_model_folder as save_native, truncated_copy
    from foretell.runtime.loading import load_model

    target_dir, _ = tiny_pair
    loaded = load_model(target_dir)
    distilled = save_native(truncated_copy(loaded.model, 1), loaded.tokenizer, tmp_path / "distilled")
    assert main(["export", "draft-model", "--draft", str(distilled), "--out", str(tmp_path / "hf")]) == 0
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    calls = []
    assistant.register_forward_hook(lambda *_: calls.append(1))
    for prompt in PROMPTS[:3]:
        ids = torch.tensor([prompt])
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False, pad_token_id=2,
                      eos_token_id=None)
        plain = target.generate(ids, **kwargs)
        assisted = target.generate(ids, assistant_model=assistant, **kwargs)
        assert torch.equal(plain, assisted)
    assert calls, "transformers drafted with the exported model"
    assert assistant.config.num_hidden_layers == 1
