"""Command line: foretell generate | models."""

from __future__ import annotations

import argparse
import json
import sys

from foretell.errors import ForetellError


def add_model_args(p: argparse.ArgumentParser) -> None:
    from foretell.api import DRAFTERS

    p.add_argument("--model", default="smollm2-135m", help="target: preset name, .gguf file or HF folder (default: %(default)s)")
    p.add_argument("--draft", help="draft model for --drafter draft-model: preset, .gguf file or HF folder")
    p.add_argument("--drafter", choices=DRAFTERS, help="default: draft-model if --draft is given, else prompt-lookup")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step (the base for adaptive policies)")
    p.add_argument(
        "--length-policy", default="fixed", choices=("fixed", "rejection-rate", "additive"),
        help="draft length rule: fixed gamma; seed 001's rejection-rate rule; transformers' +2/-1",
    )
    p.add_argument("--auto-budget", action="store_true",
                   help="pick draft length / tree depth and size from this machine's measured forward cost curve")
    p.add_argument("--tree-kind", default="dynamic", choices=("dynamic", "static"), help="draft-tree: tree shape")
    p.add_argument("--tree-depth", type=int, default=5, help="draft-tree dynamic: depth")
    p.add_argument("--tree-topk", type=int, default=4, help="draft-tree dynamic: nodes expanded per depth and children each")
    p.add_argument("--tree-budget", type=int, default=24, help="draft-tree dynamic: tokens verified per pass")
    p.add_argument("--branching", default="3,2,2,1,1", help="draft-tree static: children per node at each depth")
    p.add_argument("--tree-children", default="topk", choices=("topk", "sampled"), help="draft-tree static: how children are drawn")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foretell", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text, streamed, with decoding statistics")
    gen.add_argument("prompt", help="the prompt (use - to read standard input)")
    gen.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, statistics) instead")
    add_model_args(gen)
    add_sampling_args(gen)
    sub.add_parser("models", help="list the model presets and whether their packages are installed")
    return parser


def tree_shape(args):
    from foretell.drafters.draft_tree import TreeShape

    try:
        branching = tuple(int(b) for b in args.branching.split(","))
    except ValueError:
        raise ForetellError(f"--branching takes comma-separated integers, got {args.branching!r}") from None
    return TreeShape(kind=args.tree_kind, branching=branching, depth=args.tree_depth, top_k=args.tree_topk,
                     total_tokens=args.tree_budget, children=args.tree_children)


def cmd_generate(args) -> None:
    import torch

    from foretell.api import load

    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = dict(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
    )
    from foretell.types import SamplingParams

    SamplingParams(**sampling)  # validate before spending time loading models
    tree_shape(args)
    pipe = load(
        args.model, draft=args.draft, drafter=args.drafter, dtype=args.dtype, device=args.device,
        gamma=args.gamma, length_policy=args.length_policy, tree=tree_shape(args),
        auto_budget=args.auto_budget,
    )
    drafter = pipe.engine.drafter.name if pipe.engine.drafter else "none"
    result = None
    for chunk in pipe.stream(prompt, chat=not args.no_chat, **sampling):
        if not args.json:
            print(chunk.text, end="", flush=True)
        result = chunk.result or result
    if args.json:
        print(json.dumps({"model": args.model, "drafter": drafter, "text": result.text, "tokens": result.tokens,
                          "stats": result.stats.to_dict()}))
    else:
        print()
        print(f"[{args.model}, drafter {drafter}, {args.dtype}] {result.stats.summary()}", file=sys.stderr)


def cmd_models(args) -> None:
    from foretell.models.presets import PRESETS, preset_available

    for p in PRESETS.values():
        state = "installed" if preset_available(p.name) else f"not installed: {p.install_command}"
        print(f"{p.name:22s} {p.description} [{state}]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        {"generate": cmd_generate, "models": cmd_models}[args.command](args)
    except ForetellError as e:
        print(f"foretell: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nforetell: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
