"""Command line: foretell generate | bench | cost | models, serve (serve/cli.py), the training commands
(train/cli.py) and export (export.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
import time

import torch

from foretell.api import load
from foretell.bench.datasets import DATASETS, load_prompts
from foretell.bench.lossy_table import write_lossy_table
from foretell.bench.methods import (
    METHODS, PEERS, VARIANTS_HELP, MethodOptions, Models, build_methods, default_methods, has_llama_peer, sampling,
)
from foretell.bench.report import write_report
from foretell.bench.runner import RunConfig, run_bench
from foretell.config import QUANT_MODES as DRAFT_QUANT_MODES, SpeculativeConfig
from foretell.errors import ForetellError
from foretell.export import add_export_parser
from foretell.models.presets import PRESETS, preset_available
from foretell.models.shipped import shipped_manifests
from foretell.runtime.config import KV_DTYPES
from foretell.runtime.quant import TARGET_QUANT_CHOICES, describe_target
from foretell.runtime.wide_linear import bf16_rows_of, kernel_rows_of, wide_rows_of
from foretell.serve.cli import add_serve_parser
from foretell.sizing.cost import cost_curve, plot_cost_curve
from foretell.spec_args import add_model_args, add_speculative_args, speculative_from_args
from foretell.text import encode_prompt
from foretell.train.cli import add_training_parsers
from foretell.types import ResponseFormat, SamplingParams


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, help="sampling seed: the same seed and prompt give the same text, whatever the "
                   "drafter (with the coupled rule)")
    add_sampling_rule_arg(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g = p.add_argument_group("logits processing", "applied to the target's logits at every position, drafts' "
                             "included, so speculation gives plain decoding's output with them")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="[-2, 2]: subtracted once from each generated token")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="[-2, 2]: subtracted per occurrence in the generated tokens")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0: a prompt's or generated token's logit divided (if > 0) or multiplied by it (1 = off)")
    g.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN=BIAS",
                   help="add BIAS in [-100, 100] to token id TOKEN's logit (repeatable)")
    g.add_argument("--logprobs", type=int, metavar="N",
                   help="with --json: each token's log-probability and the N (0-20) most likely tokens at its position")
    fmt = g.add_mutually_exclusive_group()
    fmt.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    fmt.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid under the schema in FILE")


def add_sampling_rule_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampling", choices=("coupled", "rejection"),
                   help="how sampled tokens are chosen: coupled (Gumbel-max on noise keyed by the seed and the position; "
                   "output independent of drafts, batch and timing) or rejection (speculative sampling's accept / "
                   "resample test); default: coupled with --seed, else rejection")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foretell", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text, streamed, with decoding statistics")
    gen.add_argument("prompt", help="the prompt (use - to read standard input)")
    gen.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, statistics) instead")
    add_model_args(gen)
    add_speculative_args(gen)
    add_sampling_args(gen)
    sub.add_parser("models", help="list the model presets and whether their packages are installed")
    cost = sub.add_parser("cost", help="measure (or read the cached) forward cost curve of models and plot it")
    cost.add_argument("models", nargs="+", help="presets, .gguf files or HF folders")
    cost.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                      help="(default: float32 with a -q8 --quant, else bfloat16)")
    cost.add_argument("--device", default="cpu")
    cost.add_argument("--quant", default="none", choices=TARGET_QUANT_CHOICES,
                      help="the target's weights as `generate --quant` runs them: int8 / int4 / gguf (the file's "
                           "blocks), -q8 adding 8-bit activations (float32) (default: %(default)s)")
    cost.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    cost.add_argument("--plot", default="cost_curve.png", help="PNG to write (default: %(default)s)")
    add_bench_parser(sub)

    add_serve_parser(sub)  # sets its own `run`, like the training commands

    add_training_parsers(sub)  # each sets its own `run` (args -> None)

    add_export_parser(sub)  # the same
    return parser


def add_bench_parser(sub) -> None:
    methods = "; ".join(f"{name}: {spec.help}" for name, spec in {**METHODS, **PEERS}.items()) + "; " + VARIANTS_HELP
    b = sub.add_parser(
        "bench", help="Spec-Bench style benchmark: methods x prompts, interleaved, resumable; report + plots",
        description="Run every method on every prompt (interleaved), append one JSONL row per (prompt, method) "
        "to OUT/results.jsonl, then write OUT/report.md, OUT/speedup.png and OUT/acceptance.png. "
        "Prompts go through the model's chat template when it has one.",
    )
    b.add_argument("--model", default="smollm2-135m", help="target: preset name, .gguf file or HF folder (default: %(default)s)")
    b.add_argument("--draft", help="draft model (preset, .gguf or HF folder) for draft-chain, draft-tree*, hf-assisted")
    b.add_argument("--head", help="a saved parallel draft head folder, for the parallel-head* methods")
    b.add_argument("--hidden-draft", help="a saved hidden-state draft folder, for the hidden-state* methods")
    b.add_argument("--eagle", help="an EAGLE-3 head (foretell's folder or a vLLM / SGLang checkpoint), for the eagle3* methods")
    b.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"),
                   help="weights dtype, every method (default: %(default)s)")
    b.add_argument("--quant", default="none", choices=TARGET_QUANT_CHOICES,
                   help="foretell's target weights as int8 / int4 (weight-only) or gguf (the file's own blocks: Q4_0..Q8_0, Q4_K, Q5_K, Q6_K), "
                   "every foretell method, -q8 adding 8-bit activations (float32); the transformers peers stay at --dtype "
                   "(default: %(default)s)")
    b.add_argument("--kv-dtype", choices=KV_DTYPES[1:],
                   help="foretell's target KV cache, every foretell method (default: the model's dtype)")
    b.add_argument("--datasets", default="spec-bench", help=f"comma list of {', '.join(DATASETS)} (default: %(default)s)")
    b.add_argument("--per-category", type=int, default=10,
                   help="prompts per category, the first N in file order (default: %(default)s)")
    b.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default: %(default)s)")
    b.add_argument("--methods", help="comma list; default without --draft: plain,prompt-lookup,hf-plain,hf-prompt-lookup; "
                   f"with --draft: plain,prompt-lookup,draft-chain,draft-tree,hf-plain,hf-assisted. Methods: {methods}")
    b.add_argument("--spec-config", action="append", default=[], metavar="NAME=FILE",
                   help="one more foretell method: the speculative configuration in FILE (JSON, as written by "
                   "`foretell generate --save-spec-config`), reported as NAME (repeatable; without --methods, the "
                   "methods are plain and these)")
    b.add_argument("--gamma", type=int, default=4,
                   help="draft tokens per step: draft-chain, prompt-lookup, hf-prompt-lookup (default: %(default)s)")
    b.add_argument("--tree-depth", type=int, default=5, help="draft-tree: tree depth (default: %(default)s)")
    b.add_argument("--tree-topk", type=int, default=4,
                   help="draft-tree: nodes expanded per depth and children each (default: %(default)s)")
    b.add_argument("--tree-budget", type=int, default=24, help="draft-tree: tokens verified per pass (default: %(default)s)")
    b.add_argument("--hot-vocab", type=int, default=0,
                   help="draft-* and parallel-head* methods: draft among this many frequent tokens (lossless; 0 = all, the default)")
    b.add_argument("--draft-quant", default="auto", choices=DRAFT_QUANT_MODES,
                   help="foretell draft-* methods: draft weights as int8 or int4 (lossless); auto = int8 on CPU, bf16 kept where foretell's bf16 kernel runs; "
                        "gguf / gguf-q8: the draft model's GGUF blocks (draft-chain, draft-tree) (default: %(default)s)")
    b.add_argument("--branching", default="3,2,2,1,1",
                   help="draft-tree-static: children per node at each depth (default: %(default)s)")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); greedy_equal_to_plain is filled only when greedy")
    b.add_argument("--seed", type=int, help="sampling seed (used when --temperature > 0)")
    add_sampling_rule_arg(b)
    b.add_argument("--out", help="output folder (default: runs/bench/<timestamp>); the same folder again resumes")
    b.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip (prompt, method) pairs already in OUT/results.jsonl (default: on); --no-resume starts over")
    b.add_argument("--threads", type=int, help="torch CPU threads, also llama.cpp's (default: torch's choice)")
    b.add_argument("--runs", type=int,
                   help="interleaved passes over every (prompt, method); the report takes each method's median over "
                   "them and, with a llama-cpp* method, each side's best (default: 3 with a llama-cpp* method, else 1)")
    b.add_argument("--caches", action=argparse.BooleanOptionalAction,
                   help="keep caches that carry answers across requests: foretell's result cache keeps earlier "
                   "requests' outputs (the M-cache / M-lookup variants, drafters configured with one), llama-server "
                   "keeps its prompt cache. --no-caches resets every method before each request (default: off with a "
                   "llama-cpp* method, so neither side is helped by earlier answers; else on)")


def cmd_generate(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = dict(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, sampling=args.sampling, stop=tuple(args.stop),
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
        logit_bias=logit_bias(args.logit_bias), logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0,
        response_format=response_format(args.json_object, args.json_schema),
    )
    SamplingParams(**sampling)  # validate before spending time loading models
    spec, why = speculative_from_args(args, args.model)
    if args.save_spec_config:
        print(f"[speculative config written to {spec.save(args.save_spec_config)}]", file=sys.stderr)
    pipe = load(args.model, spec, dtype=args.dtype, device=args.device, quant=args.quant, compile=args.compile,
                kv_dtype=args.kv_dtype)
    spec = pipe.speculative  # with the weights it resolved to (a head method alone: the shipped head)
    if why:
        print(f"[drafter: {spec.describe()}: {why}; --drafter picks another]", file=sys.stderr)
    result = None
    for chunk in pipe.stream(prompt, chat=not args.no_chat, **sampling):
        if not args.json:
            print(chunk.text, end="", flush=True)
        result = chunk.result or result
    if args.json:
        out = {"model": args.model, "quant": args.quant, "drafter": spec.method, "speculative": spec.to_dict(),
               "lossy": spec.lossy, "text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
        if result.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                               for lp in result.logprobs]
        print(json.dumps(out))
    else:
        print()
        weights = describe_target(args.quant, args.dtype, pipe.target.model)
        print(f"[{args.model}, drafter {spec.method}, {weights}] {result.stats.summary()}", file=sys.stderr)
        note = path_note(args.model, args.quant, args.device)
        if note:
            print(f"[{note}]", file=sys.stderr)


# What each way of running a GGUF model changes; gguf-q8 decoded fastest on every CPU class foretell measured
# (benchmarks/bench/decode_paths.py; docs/speed.md#decoding-paths).
PATH_NOTES = {
    "none": "exact: the model's weights, float32 (or bf16) arithmetic. Faster here: --quant gguf-q8 --dtype float32 "
            "(the file's own blocks, 8-bit activations as llama.cpp computes: a slightly different model)",
    "gguf": "the file's own blocks with float32 activations: its exact weights. Faster here: --quant gguf-q8 "
            "(8-bit activations as llama.cpp computes: a slightly different model)",
    "gguf-q8": "the fastest path: the file's own blocks with 8-bit activations, as llama.cpp computes (a slightly "
               "different model than --quant none's exact weights; speculation reproduces it exactly)",
}


def path_note(model: str, quant: str, device: str) -> str | None:
    """generate's last line for a model that ships as a GGUF file, run on CPU: what its path changes, and the faster
    one where there is one (docs/speed.md#decoding-paths)."""
    ships_gguf = str(model) in PRESETS or str(model).endswith(".gguf")  # every preset is a GGUF file
    if device != "cpu" or quant not in PATH_NOTES or not ships_gguf:
        return None
    return f"path: {PATH_NOTES[quant]}"


def response_format(json_object: bool, schema_file: str | None):
    """--json-object / --json-schema FILE -> a ResponseFormat (None: free text)."""
    if json_object:
        return ResponseFormat("json_object")
    if schema_file is None:
        return None
    try:
        schema = json.loads(Path(schema_file).read_text())
    except (OSError, ValueError) as e:
        raise ForetellError(f"--json-schema: cannot read a JSON schema from {schema_file}: {e}") from None
    return ResponseFormat("json_schema", json.dumps(schema))


def logit_bias(entries: list[str]) -> dict[int, float]:
    """--logit-bias TOKEN=BIAS entries -> {token id: bias}."""
    bias = {}
    for entry in entries:
        token, sep, value = entry.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise ForetellError(f"--logit-bias takes TOKEN=BIAS (a token id and a number), got {entry!r}") from None
        if not sep:
            raise ForetellError(f"--logit-bias takes TOKEN=BIAS, got {entry!r}")
    return bias


def cmd_models(args) -> None:
    for p in PRESETS.values():
        state = "installed" if preset_available(p.name) else f"not installed: {p.install_command}"
        print(f"{p.name:22s} {p.description} [{state}]")
    for m in shipped_manifests():
        default = ", the default drafter" if m.default else ""
        if m.kind == "corpus":
            print(f"{m.name:22s} shipped corpus of {m.target.name}'s answers{default} (--corpus {m.name})")
            continue
        flag = {"parallel-head": "--head", "hidden-state": "--hidden-draft", "eagle3": "--eagle"}.get(m.kind, "--head")
        print(f"{m.name:22s} shipped {m.kind} drafter for {m.target.name}{default} (--drafter {m.kind} {flag} {m.name})")


def cmd_cost(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    args.dtype = args.dtype or ("float32" if args.quant.endswith("-q8") else "bfloat16")
    if args.quant.endswith("-q8") and args.dtype != "float32":
        raise ForetellError(f"--quant {args.quant} (8-bit activations) runs float32 targets: add --dtype float32")
    curves = {}
    for name in args.models:
        # the target made ready as `load` (and so generate, bench, serve) runs it, without a drafter
        pipe = load(name, "none", dtype=args.dtype, device=args.device, quant=args.quant, warm_up=False)
        model = pipe.target.model
        paths = ""
        wide, kernel, bf16_rows = wide_rows_of(model), kernel_rows_of(model), bf16_rows_of(model)
        if wide:  # bf16 emulated: which products the wide passes use (runtime/wide_linear.py)
            paths += f" ({f'bf16 kernel for 2..{kernel} rows, ' if kernel else ''}fp32 from {wide} rows)"
        if model.lean is not None:
            lean = model.lean
            paths += (" (lean step, 8-bit activations)" if lean.act_q8 else
                      " (lean step, bf16 weights, bf16 products on AMX)" if lean.amx else
                      " (lean step, bf16 weights, float32 activations)" if lean.streams_bf16 else " (lean step)")
        if bf16_rows:
            paths += f" (bf16 products from {bf16_rows} rows)"
        label = f"{name} ({args.dtype}{'' if args.quant == 'none' else ', ' + args.quant})"
        curves[label] = curve = cost_curve(model, name)
        del pipe, model
        cells = " ".join(f"{n}:{s * 1000:.1f}" for n, s in zip(curve.sizes, curve.seconds))
        print(f"{label}{paths}, ms per forward by tokens (context {curve.context}): {cells}")
        print("  against one token: " + " ".join(f"{n}:{curve(n) / curve(1):.2f}x" for n in curve.sizes))
    plot_cost_curve(curves, args.plot)
    print(f"plot: {args.plot}")


def spec_config_files(entries: list[str]) -> dict:
    """--spec-config NAME=FILE entries -> {NAME: SpeculativeConfig}, each file read and checked."""
    configs = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise ForetellError(f"--spec-config takes NAME=FILE, got {entry!r}")
        if name in configs:
            raise ForetellError(f"--spec-config name {name!r} given twice")
        configs[name] = SpeculativeConfig.from_file(path)
    return configs


def cmd_bench(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    names = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    prompts = load_prompts(names(args.datasets), args.per_category)  # fail fast, before loading models
    if args.max_new_tokens < 1:
        raise ForetellError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    try:
        branching = tuple(int(b) for b in args.branching.split(","))
    except ValueError:
        raise ForetellError(f"--branching takes comma-separated integers, got {args.branching!r}") from None
    configs = spec_config_files(args.spec_config)
    chosen = names(args.methods) if args.methods else ["plain"] if configs else default_methods(bool(args.draft))
    peer = has_llama_peer(chosen)  # against llama.cpp: each side's best from a median of runs, no caches by default
    runs = args.runs if args.runs is not None else 3 if peer else 1
    caches = args.caches if args.caches is not None else not peer
    if runs < 1:
        raise ForetellError(f"--runs must be >= 1, got {runs}")
    opts = MethodOptions(gamma=args.gamma, tree_depth=args.tree_depth, tree_topk=args.tree_topk,
                         tree_budget=args.tree_budget, tree_branching=branching,
                         temperature=args.temperature, seed=args.seed, sampling=args.sampling, threads=args.threads,
                         hot_vocab=args.hot_vocab, caches=caches)
    models = Models(args.model, args.draft, args.dtype, draft_quant=args.draft_quant, head=args.head,
                    hidden_draft=args.hidden_draft, eagle=args.eagle, quant=args.quant, kv_dtype=args.kv_dtype)
    methods = build_methods(chosen, models, opts, warn=lambda msg: print(msg, file=sys.stderr), configs=configs)
    tokenizer = models.pipeline().tokenizer
    chat = bool(getattr(tokenizer, "chat_template", None))
    out = Path(args.out or Path("runs") / "bench" / time.strftime("%Y%m%d-%H%M%S"))
    settings = {k: getattr(args, k) for k in ("model", "draft", "head", "dtype", "max_new_tokens", "temperature", "seed",
                                                "gamma", "tree_depth", "tree_topk", "tree_budget", "branching", "hot_vocab",
                                                "draft_quant")}
    if args.quant != "none":  # only when set, so runs made before the option still resume
        settings["quant"] = args.quant
    if args.eagle:  # the same
        settings["eagle"] = args.eagle
    if args.temperature > 0:  # foretell's rule for sampled tokens: rows made under another rule are not resumed
        settings["sampling"] = "coupled" if sampling(opts, 1).coupled else "rejection"
    if runs > 1:  # the same: only when not the old behaviour
        settings["runs"] = runs
    if not caches:
        settings["caches"] = False
    cfg = RunConfig(out, args.max_new_tokens, greedy=args.temperature == 0, resume=args.resume, runs=runs, caches=caches,
                    settings={**settings, "chat": chat, **({"spec_configs": {n: c.to_dict() for n, c in configs.items()}}
                                                           if configs else {})})
    run_bench(prompts, methods, lambda text: encode_prompt(tokenizer, text, chat), cfg)
    report = write_report(out)
    print(report.read_text())
    if any("-lossy-" in m.name for m in methods):
        print(write_lossy_table(out, tokenizer).read_text())
    print(f"foretell bench: rows in {out / 'results.jsonl'}, report in {report}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"generate": cmd_generate, "models": cmd_models, "cost": cmd_cost, "bench": cmd_bench}
    try:
        (commands.get(args.command) or args.run)(args)  # training commands carry their own `run`
    except ForetellError as e:
        print(f"foretell: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nforetell: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
