"""Tiny random models and tokenizers built on the fly, so tests need no downloaded weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Tiny tensors: one thread avoids OpenMP wake-up costs that dwarf the work (and noisy neighbours).
torch.set_num_threads(1)

SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"
FIXTURE_PROMPTS = Path(__file__).parent / "data" / "spec_bench_sample.jsonl"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def make_tokenizer(vocab_size: int, shift: int = 0):
    """A word-level tokenizer over words w0..wN; shift renames words (a 'different' tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    words = [f"w{i + shift}" for i in range(vocab_size - len(specials))]
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_hf_model(kind: str, vocab_size: int, seed: int, layers: int = 2, hidden: int = 64, init_std: float = 0.3):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=2,
        bos_token_id=1,
        initializer_range=init_std,  # a large std makes distributions peaked, like a trained model
    )
    torch.manual_seed(seed)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False, rope_theta=10000.0)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)).eval()


def save_model_folder(path: Path, hf_model, tokenizer) -> Path:
    hf_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def perturbed_copy(hf_model, noise: float, seed: int):
    """A draft that agrees with the target often but not always."""
    import copy

    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return draft


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Folders of a tiny Llama target and a perturbed-copy draft sharing one tokenizer."""
    root = tmp_path_factory.mktemp("tiny_pair")
    tok = make_tokenizer(48)
    target = make_hf_model("llama", 48, seed=0)
    draft = perturbed_copy(target, noise=0.5, seed=1)
    return save_model_folder(root / "target", target, tok), save_model_folder(root / "draft", draft, tok)


# Prompts and greedy settings for end-to-end tests on the tiny pair (incl. a one-token prompt).
PROMPTS = [[1, 5, 9, 12, 5, 9, 30], [1, 7, 7, 7, 7], [1, 20, 21, 22, 23, 24, 25, 20, 21, 22], [1]]


def greedy_params(max_new_tokens: int = 40):
    from foretell.types import SamplingParams

    return SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(tiny_pair):
    """Plain greedy decoding of the tiny target: the reference every drafter must match."""
    from foretell.api import load

    return load(tiny_pair[0], "none", warm_up=False)


def assert_drafters_reproduce_plain(plain, draft_folder) -> None:
    """Greedy decoding through prompt lookup, a draft model and a draft tree gives `plain`'s own tokens, also past a
    45-token prompt (over the lean step's 32 rows)."""
    from foretell.config import SpeculativeConfig

    long_prompt = [(5 * i + 1) % 48 for i in range(45)]
    prompts = PROMPTS + [long_prompt]
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in prompts]
    for spec in (SpeculativeConfig(gamma=3), SpeculativeConfig(method="draft-model", model=str(draft_folder), gamma=3),
                 SpeculativeConfig(method="draft-tree", model=str(draft_folder))):
        pipe = plain.with_speculative(spec)
        for prompt, want in zip(prompts, expected):
            assert pipe.engine.generate(prompt, greedy_params()).tokens == want, spec.method


def assert_greedy_equals_plain(plain, spec) -> None:
    """Greedy decoding of every prompt through `spec` gives plain decoding's tokens, with drafts verified."""
    params = greedy_params()
    for prompt in PROMPTS:
        result = spec.engine.generate(prompt, params)
        assert result.tokens == plain.engine.generate(prompt, params).tokens
        assert result.stats.draft_tokens_verified > 0


def assert_exact_near_the_token_limit(plain, spec) -> None:
    """Outputs of 1 to 5 tokens equal plain decoding's: a tree's depth shrinks to the tokens left."""
    from foretell.types import SamplingParams

    for limit in (1, 2, 3, 5):
        params = SamplingParams(max_new_tokens=limit, ignore_eos=True)
        for prompt in PROMPTS:
            assert spec.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens


def recorded_proposals(spec, prompt: list[int], params) -> list:
    """The proposals the drafter of `spec` makes while it generates from `prompt`."""
    drafter = spec.engine.drafter
    seen = []
    steps = drafter.propose_steps  # what the engine calls (propose runs it alone)

    def recording(tokens, n):
        proposal = yield from steps(tokens, n)
        seen.append(proposal)
        return proposal

    drafter.propose_steps = recording
    spec.engine.generate(prompt, params)
    return seen


def accepted_drafts(plain, drafter, prompts) -> int:
    """Drafts accepted over `prompts`, checking that every greedy output equals plain decoding."""
    spec, params = plain.with_drafter(drafter), greedy_params()
    total = 0
    for prompt in prompts:
        result = spec.engine.generate(prompt, params)
        assert result.tokens == plain.engine.generate(prompt, params).tokens
        total += sum(result.stats.accepted_per_position)
    return total


def spec_bench_prompts(per_category: int) -> list[str]:
    """Spec-Bench first turns from ../shared when present, else from the sample copied into tests/data."""
    from foretell.bench.datasets import load_spec_bench

    path = SPEC_BENCH if SPEC_BENCH.is_file() else FIXTURE_PROMPTS
    return [row["prompt"] for row in load_spec_bench(per_category, path)]


def make_json_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (every string encodes) trained on small JSON objects, for constrained output."""
    import json
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [json.dumps({"name": "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 6))),
                          "ok": rng.random() < 0.5, "n": rng.randint(0, 999), "color": rng.choice(["red", "green"]),
                          "tags": [rng.choice("xyz") for _ in range(rng.randint(0, 3))]}, separators=(",", ":"))
              for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def json_pair(tmp_path_factory):
    """A tiny target and a perturbed-copy draft over make_json_tokenizer's byte-level vocabulary."""
    root = tmp_path_factory.mktemp("json_pair")
    tok = make_json_tokenizer()
    target = make_hf_model("llama", len(tok), seed=5)
    draft = perturbed_copy(target, noise=0.3, seed=6)
    return save_model_folder(root / "target", target, tok), save_model_folder(root / "draft", draft, tok)


MICRO_VOCAB = 8  # the statistical tests' micro model: every prefix can be enumerated


@pytest.fixture(scope="session")
def micro(tmp_path_factory):
    root = tmp_path_factory.mktemp("micro")
    target = make_hf_model("llama", MICRO_VOCAB, seed=11, init_std=0.5)
    draft = perturbed_copy(target, noise=0.6, seed=12)
    tok = make_tokenizer(MICRO_VOCAB)
    save_model_folder(root / "t", target, tok)
    save_model_folder(root / "d", draft, tok)
    return target, root
