"""The Python API: `load` a target with a speculative configuration, then `generate` or `stream`.

    import foretell
    pipe = foretell.load("smollm2-135m", speculative=foretell.SpeculativeConfig(method="prompt-lookup"))
    print(pipe.generate("Explain KV caches.", max_new_tokens=64).text)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch

from foretell.batching import BatchEngine
from foretell.build import DrafterWeights, build_engine, default_speculative, with_shipped_model
from foretell.config import DEFAULT_PREFILL_CHUNK, SpeculativeConfig, as_speculative
from foretell.drafters.base import Drafter
from foretell.engine import Engine
from foretell.errors import ForetellError
from foretell.paths import default_cache_dir
from foretell.prefix_cache import PrefixCache
from foretell.runtime.config import RuntimeConfig
from foretell.runtime.gguf_quant import check_replaced, replaced_weights
from foretell.runtime.loading import LoadedModel, kept_gguf, load_model, resolve_model_dir
from foretell.runtime.prepare import prepare
from foretell.runtime.quant import TARGET_QUANT_CHOICES, split_target_quant
from foretell.runtime.quant_cache import kept_quant_file, kept_weights, layer_names, load_kept, save_kept
from foretell.sizing.chain import DraftLengthPolicy, FixedLength, make_length_policy
from foretell.text import encode_prompt
from foretell.types import Chunk, GenerationResult, SamplingParams


@dataclass
class Pipeline:
    """A loaded target, its engine and the configuration that built it."""

    target: LoadedModel
    engine: Engine
    speculative: SpeculativeConfig
    weights: DrafterWeights
    prefix_cache: PrefixCache | None = None  # prompts (and answers) kept across calls: with_prefix_cache

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def stream(self, prompt: str | list[dict], chat: bool = True, speculative: bool = True,
               **sampling) -> Iterator[Chunk]:
        """Yield text as it is produced; the last chunk carries the full result and statistics. sampling:
        SamplingParams' fields. speculative=False decodes plainly, one token a target pass, for this call."""
        engine = self.engine if speculative else self.plain_engine()
        return engine.stream(self.encode(prompt, chat), SamplingParams(**sampling), self.prefix_cache)

    def generate(self, prompt: str | list[dict], chat: bool = True, speculative: bool = True,
                 **sampling) -> GenerationResult:
        engine = self.engine if speculative else self.plain_engine()
        return engine.generate(self.encode(prompt, chat), SamplingParams(**sampling), self.prefix_cache)

    def with_prefix_cache(self, megabytes: int = 512) -> Pipeline:
        """The same pipeline keeping up to `megabytes` MiB of prompts and answers (their KV rows) across its calls,
        so a call whose prompt starts with an earlier one's prompt and answer, as a chat's next turn does, reads only
        the rest (prefix_cache.py; the tokens are the same as without). 0: none."""
        return replace(self, prefix_cache=PrefixCache.of_megabytes(megabytes))

    def plain_engine(self) -> Engine:
        """This target without a drafter or the extras that need one: plain decoding."""
        return replace(self.engine, drafter=None, length_policy=FixedLength(), draft_gate=None, result_cache=None,
                       lossy_threshold=None)

    def with_speculative(self, speculative: SpeculativeConfig | dict | str) -> Pipeline:
        """The same target with another configuration; drafter weights already loaded are shared."""
        spec = with_shipped_model(as_speculative(speculative), self.weights)
        return replace(self, engine=build_engine(spec, self.weights), speculative=spec)

    def batch_engine(self, budget=None, max_batch: int = 16, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                     prefix_cache=None):
        """A continuous-batching engine over this target: every request gets this pipeline's configuration (its own
        drafter state, shared weights). budget: a batch_budget policy, or None (each drafter as configured);
        prefill_chunk: prompt tokens a pass; prefix_cache: a prefix_cache.PrefixCache its requests share, or None."""
        return BatchEngine(self.target.model, lambda: build_engine(self.speculative, self.weights), budget, max_batch,
                           prefill_chunk, prefix_cache)

    def with_drafter(self, drafter: Drafter | None, length_policy: str | DraftLengthPolicy = "fixed",
                     gamma: int = 4) -> Pipeline:
        """The same target with a drafter object built by hand (a custom Drafter, or one under test); the
        engine's opt-in extras (result cache, draft gate, lossy mode) are off."""
        if isinstance(length_policy, str):
            length_policy = make_length_policy(length_policy, gamma)
        engine = replace(self.engine, drafter=drafter, length_policy=length_policy, draft_gate=None, result_cache=None,
                         lossy_threshold=None)
        return replace(self, engine=engine)


def load(
    target: str | Path = "smollm2-135m",
    speculative: SpeculativeConfig | dict | str | None = None,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    quant: str = "none",
    compile: bool = False,
    wide_fp32: bool = True,
    bf16_kernel: bool = True,
    lean: bool = True,
    kv_dtype: str | None = None,
    warm_up: bool = True,
    cache_dir: Path | None = None,
) -> Pipeline:
    """Load a target (preset name, .gguf file or HF folder) and the drafter `speculative` describes.

    speculative: a SpeculativeConfig (see config.py for every option), its dict / JSON form, or a bare method
    name ("none", "prompt-lookup", ...). None: the target's installed hidden-state draft if there is one, else its
    shipped default drafter (the fastest on this class of CPU where one was measured), else prompt lookup
    (`default_speculative`). The configuration is checked before any weights load.
    quant: the target's weights as int8 or int4 (weight-only; opt-in), or "gguf": the blocks its GGUF file ships
    with (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; a chunked preset's file is assembled once and kept): a
    different, smaller model than the full-precision one, which
    speculation then reproduces exactly (its cost against bf16: docs/speed.md). "int8-q8", "int4-q8", "gguf-q8":
    those weights with 8-bit activations in the projections, as llama.cpp computes (float32 CPU targets, lean
    step): lossy against float activations, faster, and every pass runs through the lean step so speculation
    still reproduces that model's plain decoding exactly.
    compile: torch.compile the target's per-layer blocks (opt-in; compiled during warm-up; see
    benchmarks/experiments/compile_ab.py for whether it pays on your machine).
    wide_fp32: a bf16 target on CPU runs in float32 activations over its bf16 weights where the lean step suits
    it (with lean; runtime/lean_step.run_bf16_as_float32: steps and verification stream the bf16 weights, prompts
    use an exact fp32 copy, or a bf16 one where bf16 products are native; on a CPU with AMX the lean passes
    multiply in bf16 on its tiles too, lean_step.amx_tiles), else, on a CPU without native bf16
    matmul, its passes of many rows (prompts, draft trees) in fp32 on an exact fp32 copy of its weights where that
    is faster here (runtime/wide_linear.py).
    bf16_kernel: with wide_fp32, passes of a few rows (draft trees) run foretell's bf16 kernel where it is built and
    faster here (kernels/bf16_gemm.cpp); False keeps PyTorch's products (A/B runs).
    lean: passes of up to 32 tokens (plain decoding's steps, verification) run in one native call where the target
    suits it: a float32 CPU target of a family on the fast path (docs/models.md) with dense, int4 or GGUF weights
    (runtime/lean_step.py); False keeps PyTorch's path (A/B runs).
    kv_dtype: the target's KV cache, "float16" (half the bytes a pass reads from it, which dominate a batch of long
    contexts; lossy, as llama.cpp's default f16 cache: docs/speed.md measures it) or "float32"; None: the model's
    dtype. Speculation reproduces plain decoding with the same cache exactly.
    warm_up: a few throw-away forwards so the first generation is not the slow one.
    The target is made ready per a RuntimeConfig of these arguments (runtime/prepare.py says the steps and their
    order); its drafters follow it (build.py).
    """
    if speculative is None:
        spec = default_speculative(target, cache_dir, device=str(device))[0]
    else:
        spec = as_speculative(speculative)
    if quant not in TARGET_QUANT_CHOICES:
        raise ForetellError(f"unknown target quantization {quant!r}; use one of {', '.join(TARGET_QUANT_CHOICES)}")
    quant, act_q8 = split_target_quant(quant)
    runtime = RuntimeConfig(device=device, dtype=dtype, quant=quant, activations="q8" if act_q8 else "float",
                            wide_fp32=wide_fp32, kernel_rows=None if bf16_kernel else 0, lean=lean, compile=compile,
                            kv_dtype=kv_dtype)
    if quant == "gguf":
        gguf = kept_gguf(target, cache_dir)
        if gguf is None:
            raise ForetellError(f"quant='gguf' keeps a GGUF file's own quantization, and {str(target)!r} has no GGUF "
                                "file on disk; use int4 or int8")
        runtime = replace(runtime, gguf_file=gguf)
    # int8 / int4 layers made by an earlier load are read from the cache, not quantized again
    kept_file = kept_quant_file(resolve_model_dir(target, cache_dir), runtime.quant, runtime.dtype,
                                Path(cache_dir or default_cache_dir()))
    kept = layer_names(kept_file)
    # the projections the file's blocks (or the kept layers) replace are not read from the float32 folder at all
    skipped = replaced_weights(runtime.gguf_file) if runtime.gguf_file is not None else kept_weights(kept)
    loaded = load_model(target, dtype, device, cache_dir, skipped)
    if kept:
        load_kept(loaded.model, kept_file, kept)
    prepared = prepare(loaded.model, runtime)  # quantizes what is still float (everything, without a kept file)
    if kept_file is not None and not kept:
        save_kept(loaded.model, kept_file)
    check_replaced(loaded.model, skipped)
    if act_q8 and prepared.lean is not None:
        raise ForetellError(f"quant='{quant}-q8' needs foretell's lean step, and {prepared.lean}; use quant={quant!r}")
    # drafters follow the target's activations: a bf16 target run as float32 activations over its bf16 weights gets
    # float32 drafters of bf16 numbers (a float32 EAGLE-3 head steps in the lean step too)
    as_float32 = prepared.bf16_as_float32
    weights = DrafterWeights(loaded, str(target), "float32" if as_float32 else dtype, device, cache_dir,
                             bf16_numbers=as_float32)
    spec = with_shipped_model(spec, weights)
    engine = build_engine(spec, weights)
    if warm_up:
        engine.warm_up()
    return Pipeline(loaded, engine, spec, weights)
