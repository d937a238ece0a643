"""docs/adaspec.md: the Qwen pair's section from benchmarks/results/adaspec_qwen (copied from a finished
benchmarks/adaspec/adaspec_qwen.sh run), then the SmolLM2 sections from the eval-draft JSON files that
benchmarks/adaspec/adaspec_table.sh and its siblings write.
    python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foretell.train.adaspec.evaluate import format_table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "adaspec"))
from adaspec_qwen_table import table as qwen_table  # noqa: E402

QWEN_RESULTS = Path(__file__).resolve().parent.parent / "results" / "adaspec_qwen"

QWEN_INTRO = """## The paper's regime: the pretrained Qwen2.5-Coder-0.5B draft for Qwen2.5-Coder-1.5B

AdaSPEC distils a *pretrained* small model of the target's family. Here: the 0.5B (the target's tokenizer) for the
1.5B (its Q4_K_M preset, run in bf16). One command runs every stage, each resuming after an interruption:

```
bash benchmarks/adaspec/adaspec_qwen.sh     # then: python benchmarks/adaspec/adaspec_qwen_table.py runs/adaspec-qwen
```

- Training text: the 1.5B's own greedy answers to 160 GSM8K train prompts (`foretell self-data`) plus 240 ShareGPT
  answers as written: 399 sequences of 256 tokens, 74,172 trained positions.
- Teacher pass once: the 1.5B's top-32 log-probabilities and log-normaliser per position, cached and resumable.
- Drafts from the same 0.5B with the same data, steps (60 of 8 x 256 tokens, about 1.2 epochs), warm-up + cosine
  learning rate from 2e-5 and seed: undistilled (the 0.5B as shipped), distilled on all tokens (forward KL to the
  teacher: the reference), and AdaSPEC (the reference's per-token loss gap, top-k% filter) at k = 0.4 and 0.2.
  Full fine-tuning with bf16 autocast and fp32 master weights, about 50-90 tokens/s on 2 AMX cores, so a stage
  takes about 40 minutes: it fitted the time, so adapters were not needed.
- alpha: sum_v min(p, q) at T=1 over the target's held-out answers (32 GSM8K test prompts; 32 ShareGPT test
  prompts). Decoding: draft-model chains (gamma 4), 6 prompts, 128 tokens, bf16; each pair of drafts decoded beside
  plain decoding in its own run (a speedup is against that run's plain decoding). Acceptance = accepted / proposed
  draft tokens; tau = tokens per target pass.

Measured on a 2-core Xeon (AVX-512 + AMX). The GSM8K decoding ran with the cores to itself; the Spec-Bench runs
ran beside other test work, so their speedups are low by an unknown amount (the plain and speculative passes of a
prompt are interleaved, so the load hits both; acceptance and tau do not depend on it).
"""

QWEN_FINDINGS = """- **The ordering is the reverse of the paper's.** By alpha: undistilled > all-token distillation > AdaSPEC
  (k = 0.4 > k = 0.2), on GSM8K and on the general set alike. In real decoding the four drafts are within noise
  of one another greedily (acceptance 0.78-0.79, tau 4.06-4.11 on GSM8K); at T=1 the draft distilled on all tokens
  edges the undistilled one on GSM8K (0.66 against 0.65) while AdaSPEC falls behind (0.64, 0.60), and on
  Spec-Bench the undistilled draft leads (0.45 against 0.39-0.40).
- **Why, as far as measured:** the pretrained 0.5B already agrees with the 1.5B on 91% of the probability mass of
  its GSM8K answers. In 60 steps (about 1.2 epochs of 399 sequences) the KL to the teacher did not fall on
  sequences the draft had not yet seen: its mean per 10 steps stayed at 0.31-0.35 through the first epoch and
  dropped (0.22) only on the second pass over the same sequences. Distillation at this length fitted the training
  sequences and moved the draft slightly away from the target elsewhere, and AdaSPEC, which trains on a fraction
  of the tokens, moved it more. The paper trains for several epochs on whole task datasets; 2 CPU cores give
  about 40 minutes a stage.
- **Speed:** the 0.5B draft makes the bf16 1.5B only about 1.0-1.1x faster here despite tau ~4, because a 0.5B
  draft step costs about a third of a 1.5B step. No distilled draft beat the undistilled 0.5B in tokens/s, so
  nothing ships and `--draft qwen2.5-coder-0.5b` stays the 0.5B as released. (A distilled draft model can ship:
  `ship_drafter(..., kind="draft-model")` copies it with its tokenizer and checksums, and `--draft NAME` loads it
  checked; a 0.5B in bf16, about 1 GB, is far over the repository's budget.)

Loss curves (all-token distillation; AdaSPEC at k = 0.4, its loss on the selected tokens):

![reference loss](adaspec-qwen-reference-loss.png) ![AdaSPEC k0.4 loss](adaspec-qwen-k0.4-loss.png)
"""


def qwen_section(results: Path = QWEN_RESULTS) -> str:
    return f"{QWEN_INTRO}\n{qwen_table(results)}\n{QWEN_FINDINGS}" if results.is_dir() else ""

SETS = {
    "gsm8k": "GSM8K (train: GSM8K train; alpha: GSM8K test; decoded: 12 GSM8K test prompts)",
    "sharegpt": "General (train: ShareGPT; alpha: ShareGPT test; decoded: 12 Spec-Bench prompts, 2 per category)",
}


def main(run_dir: str) -> None:
    print("# AdaSPEC (selective distillation)\n")
    print(qwen_section())
    print("## A 2-layer draft cut from SmolLM2-135M-Instruct\n")
    print("Produced by `bash benchmarks/adaspec/adaspec_table.sh`. Draft: 2 decoder layers taken from the target "
          "(embedding, first layers, final norm, output layer), 120 steps of 16 x 256 tokens per stage, bf16 "
          "autocast. alpha = mean over held-out assistant tokens of sum_v min(p, q) at temperature 1; "
          "acceptance, tau and speedup come from real speculative decoding (gamma 4, temperature 1, bf16) "
          "against plain decoding of the same prompts in the same run.\n")
    for name, title in SETS.items():
        path = Path(run_dir) / f"{name}.json"
        if path.is_file():
            rows = json.loads(path.read_text())
            print(f"### {title}\n\n{format_table(rows)}\n\n{ordering(rows)}\n")
            plots = [f"![{stage} loss](adaspec-{name}-{stage}-loss.png)" for stage in ("reference", "draft")
                     if (Path("docs") / f"adaspec-{name}-{stage}-loss.png").is_file()]
            if plots:
                print("Loss curves (reference = plain distillation on all tokens; draft = AdaSPEC, its loss on the "
                      "selected tokens):\n\n" + " ".join(plots) + "\n")
    warm = Path(run_dir).parent / "adaspec-warm" / "gsm8k-alpha.json"
    if warm.is_file():
        rows = json.loads(warm.read_text())
        print("### GSM8K from a warm start (`bash benchmarks/adaspec/adaspec_warm.sh`)\n\n"
              "The paper's drafts begin as pretrained language models. Here every draft starts from the general-chat "
              "draft above (the ShareGPT reference), then stays as it is (undistilled), is distilled on all GSM8K "
              "tokens, or is trained by AdaSPEC; same data and steps. alpha on GSM8K test (no decoding run).\n\n"
              f"{format_table(rows)}\n\n{ordering(rows)}\n")
    self_sets = {"gsm8k": "GSM8K (train: the target's answers to 1200 GSM8K train prompts; alpha: its answers to 48 "
                          "GSM8K test prompts)",
                 "sharegpt": "General (train: the target's answers to 800 ShareGPT prompts; alpha: its answers to 24 "
                             "held-out ShareGPT prompts)"}
    self_dir = Path(run_dir).parent / "adaspec-self"
    found = [(name, path) for name in self_sets
             for path in sorted(self_dir.glob(f"{name}*.json"), key=lambda p, n=name: (p.stem != n, p.name))
             if not path.name.endswith(".settings.json")]  # the untagged (first) run before its variants
    if found:
        print("### Trained on the target's own answers (`bash benchmarks/adaspec/adaspec_self.sh`)\n\n"
              "The paper fine-tunes the target on the task first, so the training text is what the target itself "
              "would write. The nearest here: the target's own greedy answers (`foretell self-data`). Drafts "
              "truncated from the target; alpha on held-out target answers (no decoding run). Variants come from "
              "`LAYERS=.. STEPS=.. TAG=.. bash benchmarks/adaspec/adaspec_self.sh`.\n")
        for name, path in found:
            settings = path.with_name(path.stem + ".settings.json")
            shape = json.loads(settings.read_text()) if settings.is_file() else {"layers": 2, "steps": 120}
            rows = json.loads(path.read_text())
            print(f"#### {self_sets[name]}: {shape['layers']}-layer draft, {shape['steps']} steps per stage\n\n"
                  f"{format_table(rows)}\n\n{ordering(rows)}\n")
    sweep(Path(run_dir).parent / "adaspec-sweep")
    batch_protocol(Path(run_dir).parent / "adaspec-batch")


def sweep(folder: Path) -> None:
    path = folder / "gsm8k-1layer-300.json"
    if not path.is_file():
        return
    rows = json.loads(path.read_text())
    base = next(r for r in rows if r["draft"] == "distill-all-tokens")
    best = max((r for r in rows if r["draft"].startswith("adaspec")), key=lambda r: r["alpha"])
    verdict = above_or_below(best["alpha"], base["alpha"])
    print("### AdaSPEC's select fraction k (`bash benchmarks/adaspec/adaspec_sweep.sh`)\n\n"
          "The self-data GSM8K run above (1-layer draft, 300 steps per stage), one more AdaSPEC draft per k, all from "
          "the same reference, data and steps; alpha on the held-out target answers.\n\n"
          f"{format_table(rows)}\n\nBest AdaSPEC: {best['draft']} ({best['alpha']:.4f}), {verdict} distillation on "
          f"all tokens ({base['alpha']:.4f}).\n")
    swept = sorted((float(r["draft"].split("-k")[1]), r["alpha"]) for r in rows if r["draft"].startswith("adaspec-k"))
    rising = all(a < b for (_, a), (_, b) in zip(swept, swept[1:])) and swept[-1][1] < base["alpha"]
    if len(swept) > 1 and rising:
        print("alpha rises with k: the more tokens the filter keeps, the better the draft, and all tokens "
              "(k = 1) is best.\n")
    tokens = folder / "gsm8k-1layer-300-tokens.json"
    if tokens.is_file():
        buckets = json.loads(tokens.read_text())
        print("Per token, by how sure the target is (its top probability; `benchmarks/adaspec/adaspec_tokens.py`, fp32): "
              "alpha = sum_v min(p, q), greedy = the draft's argmax is the target's.\n\n"
              f"{format_table(buckets, list(buckets[0]))}\n")
        if all(b["k0.4 alpha"] < b["all-tokens alpha"] for b in buckets if b["k0.4 alpha"] is not None):
            print("AdaSPEC (k = 0.4) is behind in every bucket, the tokens the target is surest of included (the "
                  "easy tokens the filter means to focus the draft on): at this training length dropping tokens drops signal "
                  "the draft still needed, rather than noise it could not fit.\n")


def batch_protocol(folder: Path) -> None:
    path = folder / "gsm8k-1layer-150.json"
    if not path.is_file():
        return
    rows = json.loads(path.read_text())
    alpha = {r["draft"]: r["alpha"] for r in rows}
    print("### The authors' batch protocol (`bash benchmarks/adaspec/adaspec_batch.sh`)\n\n"
          "The authors' released configs (branches of yuezhouhu/adaspec, e.g. "
          "gsm8k-target-pythia-1.4b-draft-pythia-31m-3epoch) train the AdaSPEC draft with 5 sequences a step and the "
          "reference (distilled on all tokens) with 2, for 7.5 and 3 epochs: the same number of steps, 1/k times the "
          "sequences, so a selective step trains on about as many tokens as a plain one. The same on the self-data "
          "GSM8K run above (1-layer draft, 150 steps a stage): AdaSPEC with 40 = 16 / 0.4 sequences a step "
          "(`--adaspec-batch-size 40`), and plain distillation with 40 sequences a step as the control for the extra "
          "data (`-b40`). alpha on the held-out target answers.\n\n"
          f"{format_table(rows)}\n")
    if "adaspec-b40" not in alpha:
        return
    paper = above_or_below(alpha["adaspec-b40"], alpha["distill-all-tokens"])
    line = (f"AdaSPEC with the authors' batch ({alpha['adaspec-b40']:.4f}) is {paper} plain distillation at the plain "
            f"batch ({alpha['distill-all-tokens']:.4f}), the paper's comparison")
    if "distill-all-tokens-b40" in alpha:
        equal = above_or_below(alpha["adaspec-b40"], alpha["distill-all-tokens-b40"])
        line += (f"; with the same 40 sequences a step, plain distillation reaches {alpha['distill-all-tokens-b40']:.4f}, "
                 f"so AdaSPEC is {equal} it at equal data")
    print(line + ".\n")
    table = folder / "gsm8k-2layer-120.json"
    if table.is_file():
        rows = json.loads(table.read_text())
        alpha = {r["draft"]: r["alpha"] for r in rows}
        verdict = above_or_below(alpha["adaspec-b40"], alpha["distill-all-tokens"])
        print("The same protocol on the main table's GSM8K run (2-layer draft, 120 steps, GSM8K text; alpha on "
              f"GSM8K test):\n\n{format_table(rows)}\n\nAdaSPEC with 40 sequences a step is {verdict} plain "
              "distillation.\n")


def above_or_below(a: float, b: float) -> str:
    return "above" if a > b else "below"


def ordering(rows: list[dict]) -> str:
    """The drafts ranked by alpha, and whether that is the paper's order (AdaSPEC > all tokens > none)."""
    ranked = sorted(rows, key=lambda r: -r["alpha"])
    names = [r["draft"] for r in ranked]
    paper = names[:3] == ["adaspec", "distill-all-tokens", "undistilled"]
    return ("Ranking by alpha: " + " > ".join(f"{r['draft']} ({r['alpha']:.3f})" for r in ranked) + "; "
            + ("the paper's order." if paper else "**not** the paper's order (AdaSPEC > all tokens > undistilled)."))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/adaspec")
