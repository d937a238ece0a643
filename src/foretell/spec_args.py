"""Command-line flags shared by `generate` and `serve`: the target's (add_model_args) and those that map onto a
SpeculativeConfig."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from foretell.build import default_speculative
from foretell.config import METHODS, QUANT_MODES as DRAFT_QUANT_MODES, SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.parallel_head import read_head_config
from foretell.runtime.config import KV_DTYPES
from foretell.runtime.quant import TARGET_QUANT_CHOICES

# Flag -> config option, for the flags that map one to one (None = not given).
DIRECT = ("gamma", "length_policy", "lookup_max", "lookup_min", "hot_vocab", "draft_quant", "budget",
          "lossy_threshold", "draft_gate", "result_cache",
          "corpus")
# The flag giving the drafter's weights -> the method it picks when --drafter is not given, and those it fits.
WEIGHT_FLAGS = {"draft": ("draft-model", ("draft-model", "draft-tree")), "head": ("parallel-head", ("parallel-head",)),
                "hidden_draft": ("hidden-state", ("hidden-state",)), "eagle": ("eagle3", ("eagle3",))}
TREE_FLAGS = ("tree_kind", "branching", "tree_children", "tree_depth", "tree_width", "tree_budget")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="target: preset name, .gguf file or HF folder (default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--quant", default="none", choices=TARGET_QUANT_CHOICES,
                   help="the target's weights as int8 / int4 (weight-only, opt-in), or gguf: the 4-bit blocks its GGUF "
                   "file ships with (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): a smaller, faster and different model, which speculation reproduces "
                   "exactly; with -q8 (float32 only) also 8-bit activations, as llama.cpp: lossy, faster "
                   "(default: %(default)s)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES[1:],
                   help="the target's KV cache: float16 halves what each pass reads from it (lossy, as llama.cpp's "
                   "default f16 cache; speculation still reproduces plain decoding with it exactly) (default: the "
                   "model's dtype)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the target's per-layer blocks at start (opt-in; benchmarks/experiments/compile_ab.py says "
                   "whether it pays here)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    """Flags that map onto a SpeculativeConfig (config.py): each defaults to None = not given."""
    g = p.add_argument_group(
        "speculation", "A --spec-config FILE (JSON) and/or these flags, which override its options. With none of "
        "them: the target's installed drafter, else prompt lookup. Without --drafter, --draft picks draft-model, "
        "--head parallel-head, --hidden-draft hidden-state, --eagle eagle3, any other flag prompt-lookup.")
    g.add_argument("--spec-config", metavar="FILE", help="a speculative configuration file (JSON)")
    g.add_argument("--save-spec-config", metavar="FILE", help="write the configuration in use to FILE (JSON)")
    g.add_argument("--drafter", choices=METHODS, help="the speculative method")
    g.add_argument("--draft", help="draft model for draft-model / draft-tree: preset, .gguf file or HF folder")
    g.add_argument("--head", help="a saved parallel draft head folder (parallel-head)")
    g.add_argument("--hidden-draft", help="a saved hidden-state draft folder (hidden-state)")
    g.add_argument("--eagle", help="an EAGLE-3 head (eagle3): foretell's folder, or a checkpoint in the layout vLLM and "
                   "SGLang load (config.json + model.safetensors)")
    g.add_argument("--gamma", type=int, help="draft-model, prompt-lookup: draft tokens per step (default 4)")
    g.add_argument("--length-policy", choices=("fixed", "rejection-rate", "additive"),
                   help="draft-model, prompt-lookup: fixed gamma; a recent-rejection-rate rule; transformers' +2/-1")
    g.add_argument("--lookup-max", type=int, help="prompt-lookup: longest n-gram matched (default 3)")
    g.add_argument("--lookup-min", type=int, help="prompt-lookup: shortest n-gram matched (default 1)")
    g.add_argument("--hot-vocab", type=int,
                   help="draft only among this many frequent tokens (a smaller draft output layer; lossless; 0 = all)")
    g.add_argument("--draft-quant", choices=DRAFT_QUANT_MODES,
                   help="draft-model, draft-tree, parallel-head, hidden-state, eagle3: int8 or int4 draft weights (lossless); auto = int8 on CPU, bf16 kept where foretell's bf16 kernel runs (default; a parallel head: int8 on a target with 8-bit activations only); "
                        "draft-model, draft-tree: gguf / gguf-q8 run the draft's GGUF file's own blocks (gguf-q8: 8-bit activations, float32)")
    g.add_argument("--budget", choices=("fixed", "auto"),
                   help="auto: draft length / tree size from this machine's measured forward cost curve")
    g.add_argument("--auto-budget", action="store_const", const="auto", dest="budget", help="the same as --budget auto")
    g.add_argument("--tree-kind", choices=("dynamic", "static"), help="draft-tree: tree shape (default dynamic)")
    g.add_argument("--branching", help="draft-tree static: children per node at each depth, e.g. 3,2,2,1,1")
    g.add_argument("--tree-children", choices=("topk", "sampled"), help="draft-tree static: how children are drawn")
    g.add_argument("--tree-depth", type=int, help="tree drafters: tree depth")
    g.add_argument("--tree-width", "--tree-topk", type=int, dest="tree_width",
                   help="tree drafters: children per node (draft-tree dynamic: also nodes expanded per level)")
    g.add_argument("--tree-budget", type=int, help="tree drafters: tree nodes verified per pass")
    g.add_argument("--lossy-threshold", type=float,
                   help="LOSSY, off by default: accept a draft token without the target's check when its draft path "
                        "probability exceeds this value in (0, 1] (a shortcut; output no longer exact)")
    g.add_argument("--draft-gate", action="store_const", const=True,
                   help="tree drafters: before each pass, decide from measured tokens/s whether drafting pays at all "
                   "(else verify only the --result-cache branch, or nothing). Lossless")
    g.add_argument("--result-cache", nargs="?", const="outputs", choices=("outputs", "prompt"),
                   help="tree drafters: also propose, as one more branch, what followed the context's last n-gram in "
                   "earlier output (this and previous requests); =prompt searches the prompt too. Lossless")
    g.add_argument("--corpus", metavar="NAME_OR_FILE",
                   help="prompt-lookup, tree drafters: where the context offers no n-gram match, propose the most "
                   "frequent continuation in a corpus of the target's own answers (a shipped corpus, e.g. "
                   "smollm2-135m-answers, or a file from `foretell corpus`). Lossless")


def speculative_from_args(args: argparse.Namespace, target: str | Path,
                          cache_dir: Path | None = None) -> tuple[SpeculativeConfig, str]:
    """The configuration the flags describe, and why it was chosen when no flag chose it ("" otherwise).

    Order: --spec-config FILE (else prompt lookup, or the target's default when no flag is given at all),
    then --drafter / --draft / --head / --hidden-draft / --eagle, then every other flag given. Validated as a whole,
    before any model loads; an option that does not apply to the method is an error naming its flag.
    """
    weights = {flag: getattr(args, flag) for flag in WEIGHT_FLAGS if getattr(args, flag) is not None}
    given = {k: getattr(args, k) for k in DIRECT if getattr(args, k) is not None}
    trees = {k: getattr(args, k) for k in TREE_FLAGS if getattr(args, k) is not None}
    if len(weights) > 1:
        raise ForetellError("--draft, --head, --hidden-draft and --eagle each pick a drafter's weights: give one")
    if args.spec_config:
        base = SpeculativeConfig.from_file(args.spec_config)
    elif not (args.drafter or weights or given or trees):
        return default_speculative(target, cache_dir, device=getattr(args, "device", "cpu"))
    else:
        base = SpeculativeConfig()
    changes: dict = dict(given)
    method = args.drafter or base.method
    if weights:
        (flag, path), = weights.items()
        picks, fits = WEIGHT_FLAGS[flag]
        method = args.drafter or (base.method if base.method in fits else picks)
        if method not in fits:
            raise ForetellError(f"--{flag.replace('_', '-')} gives weights for {', '.join(fits)}, not {method}")
        changes["model"] = path
    spec = replace(base, method=method, **changes)
    return _with_tree_flags(spec, trees), ""


def _with_tree_flags(spec: SpeculativeConfig, trees: dict) -> SpeculativeConfig:
    shape_flags = {k: trees[k] for k in ("tree_kind", "branching", "tree_children") if k in trees}
    if shape_flags:
        if spec.method != "draft-tree":
            raise ForetellError(f"--tree-kind / --branching / --tree-children shape a draft-tree, not {spec.method}")
        tree = spec.tree
        if "branching" in shape_flags:
            try:
                branching = tuple(int(b) for b in shape_flags["branching"].split(","))
            except ValueError:
                raise ForetellError(f"--branching takes comma-separated integers, got {shape_flags['branching']!r}") from None
            tree = replace(tree, branching=branching)
        tree = replace(tree, kind=shape_flags.get("tree_kind", tree.kind), children=shape_flags.get("tree_children", tree.children))
        spec = replace(spec, tree=tree)
    if not any(k in trees for k in ("tree_depth", "tree_width", "tree_budget")):
        return spec
    head_depth = None
    if spec.method == "parallel-head" and spec.head_tree is None and spec.model:
        head_depth = read_head_config(Path(spec.model)).depth
    return spec.with_tree(trees.get("tree_depth"), trees.get("tree_width"), trees.get("tree_budget"), head_depth)
