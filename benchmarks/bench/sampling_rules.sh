#!/usr/bin/env bash
# Seeded sampling: the coupled rule (each position's token = argmax(log p + G), Gumbel noise keyed on the seed and
# the position) against the standard rejection rule, per shipped SmolLM2 drafter, in two bench runs of the same
# prompts: Spec-Bench + GSM8K, PER prompts a category, T=0.7, seed 1, bf16. Each run's report gives every method's
# speedup over plain decoding in that run and its tau. Keep other work off the cores while it runs.
#   bash benchmarks/bench/sampling_rules.sh        (OUT=benchmarks/results/sampling_rules, PER=4, TOKENS=128)
#   SUMMARY_ONLY=1 bash benchmarks/bench/sampling_rules.sh   (the table again from the recorded runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/sampling_rules}
for RULE in coupled rejection; do
  [ -n "${SUMMARY_ONLY:-}" ] && break
  .venv/bin/foretell bench --datasets spec-bench,gsm8k --per-category "${PER:-4}" --max-new-tokens "${TOKENS:-128}" \
    --temperature 0.7 --seed 1 --sampling $RULE --dtype bfloat16 --threads 2 \
    --methods plain,eagle3-auto,parallel-head-auto,hidden-state \
    --eagle smollm2-135m-eagle3 --head smollm2-135m-head --hidden-draft smollm2-135m-hidden --out "$OUT/$RULE"
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for rule in ("coupled", "rejection"):
    for line in (out / rule / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault((r["method"], rule), []).append(r)
def total(rs, key): return sum(r.get(key) or 0 for r in rs)
lines = ["| method | rule | tokens/s | speedup over plain (same rule) | per-prompt median | tau | tokens = plain |",
         "|---|---|---:|---:|---:|---:|---:|"]
for (method, rule), rs in sorted(rows.items()):
    plain = rows[("plain", rule)]
    by_prompt = {(r["dataset"], r["id"]): r for r in plain}
    tps = total(rs, "new_tokens") / total(rs, "seconds")
    base = total(plain, "new_tokens") / total(plain, "seconds")
    ratios = sorted(r["tokens_per_s"] / by_prompt[(r["dataset"], r["id"])]["tokens_per_s"] for r in rs)
    median = (ratios[(len(ratios) - 1) // 2] + ratios[len(ratios) // 2]) / 2
    same = sum(r["tokens"] == by_prompt[(r["dataset"], r["id"])]["tokens"] for r in rs)
    passes = total(rs, "target_passes")
    tau = total(rs, "new_tokens") / passes if passes else float("nan")
    lines.append(f"| {method} | {rule} | {tps:.1f} | {tps / base:.2f} | {median:.2f} | {tau:.2f} | {same} / {len(rs)} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
