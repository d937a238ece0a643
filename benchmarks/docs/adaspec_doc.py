"""docs/adaspec.md: the Qwen pair's section from benchmarks/results/adaspec_qwen (copied from a finished
benchmarks/adaspec/adaspec_qwen.sh run), then the SmolLM2 section, one alpha table and one decoding table, from the
eval-draft JSON files that benchmarks/adaspec/adaspec_table.sh and its siblings write. Missing runs are left out.
    python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "adaspec"))
from adaspec_qwen_table import table as qwen_table  # noqa: E402

QWEN_RESULTS = Path(__file__).resolve().parent.parent / "results" / "adaspec_qwen"

INTRO = """# AdaSPEC (selective distillation)

AdaSPEC distils a draft model on the tokens it can learn: a reference draft is first distilled on all tokens (forward
KL to the target), then the AdaSPEC draft trains only on the top k of tokens by KL(p||q_draft) - KL(p||q_ref) (the
paper's k, `--select-fraction`, 0.4 unless stated). Training: [training.md](training.md#adaspec-draft-models).
alpha is the mean over held-out tokens of sum_v min(p, q) at T=1. The runs' records:
[results.md](results.md#adaspec-selective-distillation), [results.md](results.md#adaspec-on-the-qwen-pair).
"""

QWEN_INTRO = """## The paper's regime: the pretrained Qwen2.5-Coder-0.5B draft for Qwen2.5-Coder-1.5B

`bash benchmarks/adaspec/adaspec_qwen.sh` (every stage resumable), then
`python benchmarks/adaspec/adaspec_qwen_table.py runs/adaspec-qwen`. The 1.5B is its Q4_K_M preset run in bf16.

- Training text: the 1.5B's own greedy answers to 160 GSM8K train prompts plus 240 ShareGPT answers as written: 399
  sequences of 256 tokens, 74,172 trained positions; the teacher's top-32 log-probabilities cached once.
- Drafts from the same 0.5B, data, seed and steps (60 of 8 x 256 tokens, about 1.2 epochs; learning rate 2e-5,
  warm-up + cosine; full fine-tuning, bf16 autocast, fp32 master weights, about 40 minutes a stage on 2 AMX cores):
  undistilled, distilled on all tokens, AdaSPEC at k = 0.4 and 0.2.
- alpha on the 1.5B's answers to 32 GSM8K test and 32 ShareGPT test prompts. Decoding: draft-model chains (gamma 4),
  6 prompts, 128 tokens, bf16, each pair of drafts beside plain decoding in its own run; acceptance = accepted /
  proposed draft tokens, tau = tokens per target pass.

Measured on a 2-core Xeon (AVX-512 + AMX). The GSM8K decoding ran with the cores to itself; the Spec-Bench runs shared
them with other work, so their speedups are low by an unknown amount (acceptance and tau do not depend on it).
"""

QWEN_FINDINGS = """- **The ordering is the reverse of the paper's.** By alpha: undistilled > all-token distillation > AdaSPEC
  (k = 0.4 > k = 0.2), on GSM8K and on the general set alike. Greedy, the four drafts decode within noise of one
  another (acceptance 0.78-0.79, tau 4.06-4.11 on GSM8K); at T=1 on Spec-Bench the undistilled draft leads (0.45
  against 0.39-0.40).
- **Why, as far as measured:** the pretrained 0.5B already agrees with the 1.5B on 91% of the probability mass of its
  GSM8K answers, and in 60 steps the KL to the teacher did not fall on sequences the draft had not yet seen (its mean
  per 10 steps stayed at 0.31-0.35 through the first epoch, 0.22 only on the second pass). Distillation at this length
  fits the training sequences and moves the draft slightly away from the target elsewhere; AdaSPEC, training on a
  fraction of the tokens, moves it more.
- **Speed:** the 0.5B draft makes the bf16 1.5B only about 1.0-1.1x faster despite tau ~4, because a 0.5B draft step
  costs about a third of a 1.5B step. No distilled draft beat the undistilled one, so `--draft qwen2.5-coder-0.5b`
  stays the 0.5B as released.

Loss curves (all-token distillation; AdaSPEC at k = 0.4, its loss on the selected tokens):

![reference loss](adaspec-qwen-reference-loss.png) ![AdaSPEC k0.4 loss](adaspec-qwen-k0.4-loss.png)
"""


def qwen_section(results: Path = QWEN_RESULTS) -> str:
    return f"{QWEN_INTRO}\n{qwen_table(results)}\n{QWEN_FINDINGS}" if results.is_dir() else ""


SMOL_INTRO = """## A draft cut from SmolLM2-135M-Instruct

`bash benchmarks/adaspec/adaspec_table.sh` and its siblings in benchmarks/adaspec/. The draft is the target's embedding,
first decoder layers (2 unless stated), final norm and output layer; 16 x 256 tokens a step, the same steps for every
stage, bf16 autocast. alpha on held-out text of the training set's kind (the target's answers where it trained on
them).
"""


def alpha(path: Path) -> dict[str, float]:
    return {r["draft"]: r["alpha"] for r in json.loads(path.read_text())} if path.is_file() else {}


def alpha_rows(run_dir: Path) -> list[tuple[str, str, str, str, bool]]:
    """(setting, undistilled, all tokens, AdaSPEC, whether AdaSPEC beat all tokens) for every run found."""
    runs = run_dir.parent
    rows = []

    def add(label: str, a: dict[str, float], adaspec: str = "adaspec") -> None:
        if a and adaspec in a:
            rows.append((label, str(a.get("undistilled", "")), str(a.get("distill-all-tokens", "")), str(a[adaspec]),
                         a[adaspec] > a.get("distill-all-tokens", float("inf"))))

    add("GSM8K text, 120 steps", alpha(run_dir / "gsm8k.json"))
    add("ShareGPT text, 120 steps", alpha(run_dir / "sharegpt.json"))
    add("GSM8K text from the ShareGPT draft (warm start, `adaspec_warm.sh`)",
        alpha(runs / "adaspec-warm" / "gsm8k-alpha.json"))
    self_dir = runs / "adaspec-self"
    for path in sorted(self_dir.glob("*.json"), key=lambda p: (p.stem.split("-")[0], p.stem.count("-"), p.name)):
        if path.name.endswith(".settings.json"):
            continue
        settings = path.with_name(path.stem + ".settings.json")
        shape = json.loads(settings.read_text()) if settings.is_file() else {"layers": 2, "steps": 120}
        text = "GSM8K" if path.stem.startswith("gsm8k") else "ShareGPT"
        add(f"the target's {text} answers, {shape['layers']} layer{'s' * (shape['layers'] > 1)}, {shape['steps']} steps"
            + (" (`adaspec_self.sh`)" if not rows or "answers" not in rows[-1][0] else ""), alpha(path))
    sweep = alpha(runs / "adaspec-sweep" / "gsm8k-1layer-300.json")
    ks = sorted(d for d in sweep if d.startswith("adaspec-k") and d != "adaspec-k0.4")
    if ks:
        rows.append((f"the same, k = {' / '.join(k.split('-k')[1] for k in ks)} (`adaspec_sweep.sh`)", "", "",
                     " / ".join(str(sweep[k]) for k in ks), any(sweep[k] > sweep["distill-all-tokens"] for k in ks)))
    batch = alpha(runs / "adaspec-batch" / "gsm8k-1layer-150.json")
    if "adaspec-b40" in batch:
        plain = batch.get("distill-all-tokens-b40", batch["distill-all-tokens"])
        rows.append(("the target's GSM8K answers, 1 layer, 150 steps, 40 sequences a step (the authors' protocol, "
                     "`adaspec_batch.sh`)", "", f"{plain} ({batch['distill-all-tokens']} at 16)",
                     str(batch["adaspec-b40"]), batch["adaspec-b40"] > plain))
    batch2 = alpha(runs / "adaspec-batch" / "gsm8k-2layer-120.json")
    if "adaspec-b40" in batch2:
        rows.append(("GSM8K text, 120 steps, AdaSPEC at 40 sequences a step", "", str(batch2["distill-all-tokens"]),
                     str(batch2["adaspec-b40"]), batch2["adaspec-b40"] > batch2["distill-all-tokens"]))
    return rows


DECODED = {"gsm8k": "12 GSM8K test prompts", "sharegpt": "12 Spec-Bench prompts (ShareGPT-trained drafts)"}


def main(run_dir: str) -> None:
    print(INTRO)
    print(qwen_section())
    rows = alpha_rows(Path(run_dir))
    if not rows:
        return
    print(SMOL_INTRO)
    print("| setting | undistilled | all tokens | AdaSPEC |\n|---|---:|---:|---:|")
    print("\n".join(f"| {label} | {u} | {a} | {d} |" for label, u, a, d, _ in rows) + "\n")
    decoded = [(title, json.loads(p.read_text())) for name, title in DECODED.items()
               if (p := Path(run_dir) / f"{name}.json").is_file()]
    if decoded:
        print("Real speculative decoding with the 120-step drafts (gamma 4, T=1, bf16), acceptance rate / tau / "
              "speedup against plain decoding in the same run:\n")
        print("| decoded | undistilled | all tokens | AdaSPEC |\n|---|---:|---:|---:|")
        for title, drafts in decoded:
            by = {r["draft"]: r for r in drafts}
            cells = [f"{by[d]['acceptance_rate']} / {by[d]['tau']} / {by[d]['speedup']}" if d in by else "–"
                     for d in ("undistilled", "distill-all-tokens", "adaspec")]
            print(f"| {title} | " + " | ".join(cells) + " |")
        print()
    plots = sorted(p.name for p in Path("docs").glob("adaspec-*-loss.png") if not p.name.startswith("adaspec-qwen"))
    if plots:
        print("Loss curves (reference: distillation on all tokens; draft: AdaSPEC, its loss on the selected "
              "tokens):\n\n" + " ".join(f"![{p[:-4]}]({p})" for p in plots) + "\n")
    wins = [label for label, *_, won in rows if won]
    line = [f"AdaSPEC beat distillation on all tokens only in: {'; '.join(wins)}." if wins else
            "AdaSPEC's filter beats distillation on all tokens in none of these settings, unlike the paper."]
    swept = sorted((float(d.split("-k")[1]), a) for d, a in alpha(
        Path(run_dir).parent / "adaspec-sweep" / "gsm8k-1layer-300.json").items() if d.startswith("adaspec-k"))
    if len(swept) > 1 and all(a < b for (_, a), (_, b) in zip(swept, swept[1:])):
        line.append("alpha rises with k, towards distillation on all tokens (k = 1).")
    tokens = Path(run_dir).parent / "adaspec-sweep" / "gsm8k-1layer-300-tokens.json"
    if tokens.is_file():
        buckets = json.loads(tokens.read_text())
        if all(b["k0.4 alpha"] < b["all-tokens alpha"] for b in buckets if b["k0.4 alpha"] is not None):
            line.append("Per token (`benchmarks/adaspec/adaspec_tokens.py`), AdaSPEC at k = 0.4 is behind in every "
                        "bucket of the target's confidence, the easy tokens it means to focus on included: at this "
                        "training length dropping tokens drops signal the draft still needed.")
    if decoded and all(r["speedup"] < 1 for _, drafts in decoded for r in drafts):
        line.append("At T=1 these weak drafts decode slower than plain decoding.")
    print("**Conclusion.** " + " ".join(line))

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/adaspec")
