"""docs/adaspec.md from the eval-draft JSON files that benchmarks/adaspec/adaspec_table.sh writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foretell.train.adaspec.evaluate import format_table

SETS = {
    "gsm8k": "GSM8K (train: GSM8K train; alpha: GSM8K test; decoded: 12 GSM8K test prompts)",
    "sharegpt": "General (train: ShareGPT; alpha: ShareGPT test; decoded: 12 Spec-Bench prompts, 2 per category)",
}


def main(run_dir: str) -> None:
    print("# AdaSPEC on SmolLM2-135M-Instruct\n")
    print("Produced by `bash benchmarks/adaspec/adaspec_table.sh`. Draft: 2 decoder layers taken from the target "
          "(embedding, first layers, final norm, output layer), 120 steps of 16 x 256 tokens per stage, bf16 "
          "autocast. alpha = mean over held-out assistant tokens of sum_v min(p, q) at temperature 1; "
          "acceptance, tau and speedup come from real speculative decoding (gamma 4, temperature 1, bf16) "
          "against plain decoding of the same prompts in the same run.\n")
    for name, title in SETS.items():
        path = Path(run_dir) / f"{name}.json"
        if path.is_file():
            rows = json.loads(path.read_text())
            print(f"## {title}\n\n{format_table(rows)}\n\n{ordering(rows)}\n")
            plots = [f"![{stage} loss](adaspec-{name}-{stage}-loss.png)" for stage in ("reference", "draft")
                     if (Path("docs") / f"adaspec-{name}-{stage}-loss.png").is_file()]
            if plots:
                print("Loss curves (reference = plain distillation on all tokens; draft = AdaSPEC, its loss on the "
                      "selected tokens):\n\n" + " ".join(plots) + "\n")
    warm = Path(run_dir).parent / "adaspec-warm" / "gsm8k-alpha.json"
    if warm.is_file():
        rows = json.loads(warm.read_text())
        print("## GSM8K from a warm start (`bash benchmarks/adaspec/adaspec_warm.sh`)\n\n"
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
        print("## Trained on the target's own answers (`bash benchmarks/adaspec/adaspec_self.sh`)\n\n"
              "The paper fine-tunes the target on the task first, so the training text is what the target itself "
              "would write. The nearest here: the target's own greedy answers (`foretell self-data`). Drafts "
              "truncated from the target; alpha on held-out target answers (no decoding run). Variants come from "
              "`LAYERS=.. STEPS=.. TAG=.. bash benchmarks/adaspec/adaspec_self.sh`.\n")
        for name, path in found:
            settings = path.with_name(path.stem + ".settings.json")
            shape = json.loads(settings.read_text()) if settings.is_file() else {"layers": 2, "steps": 120}
            rows = json.loads(path.read_text())
            print(f"### {self_sets[name]}: {shape['layers']}-layer draft, {shape['steps']} steps per stage\n\n"
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
    print("## AdaSPEC's select fraction k (`bash benchmarks/adaspec/adaspec_sweep.sh`)\n\n"
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
    print("## The authors' batch protocol (`bash benchmarks/adaspec/adaspec_batch.sh`)\n\n"
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
