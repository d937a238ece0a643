#!/usr/bin/env bash
# docs/hidden-state.md from the hidden-state draft's runs: the trained draft's held-out evaluation
# (benchmarks/train/train_hidden_state.sh: per-depth acceptance, hidden MSE, hot-vocabulary coverage) and a
# GSM8K bench against plain decoding. Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/hidden_state/smollm2-self-long2}
BENCH=${BENCH:-runs/hidden-growth-gsm8k}
METHODS=${METHODS:-plain,prompt-lookup,hidden-state,hidden-state-auto,hidden-state-lookup,hidden-state-auto-lookup}
CHECK=${CHECK:-runs/hidden_checklist_self_long2.md}
RECIPE=${RECIPE:-"\`bash benchmarks/train/train_hidden_state.sh\`: 400 steps on the target's own answers to 1200 GSM8K + 800 ShareGPT prompts, then 800 more from that draft at full depth (lr 6e-4), then 400 more (lr 4e-4) (\`OUT=runs/hidden_state/smollm2-self-long2 INIT_DRAFT=runs/hidden_state/smollm2-self-long/draft STEPS=400 LR=4e-4 bash benchmarks/train/train_hidden_state.sh\`)"}
FIRST=runs/hidden_state/smollm2  # the first, short recipe on data-set text (STEPS=120)
COMPARE=${COMPARE:-runs/seed-hidden-growth}
COMPARE_METHODS=plain,prompt-lookup,draft-chain,draft-tree,hidden-state,hidden-state-auto,hidden-state-auto-gate,hidden-state-auto-lookup,hidden-state-auto-lookup-gate,parallel-head-auto-lookup,parallel-head-auto-lookup-gate,hidden-state-no-info,hidden-state-no-resample,hidden-state-no-fusion,hidden-state-full-vocab
BEFORE=runs/seed-hidden-long2  # the same comparison before the scheduler's growth limits (every scheduled step grew 64 nodes and 5 levels)
KL=runs/hidden_state/smollm2-self-kl  # the same recipe with the loss weights MSE 0.1 / KL 0.9
SHORT=runs/hidden_state/smollm2-self  # the 400-step draft (first stage)
SHORT_COMPARE=runs/seed-hidden  # the comparison run with it
MID=runs/hidden_state/smollm2-self-long  # the 1200-step draft (second stage) the third stage continues from
MID_COMPARE=runs/seed-hidden-long  # the comparison run with it
CEILING=${CEILING:-runs/hidden-ceiling}  # benchmarks/bench/hidden_state_ceiling.sh's budget sweep
INT8=${INT8:-runs/hidden-int8-long2}  # the hidden-state methods with the int8 draft (int8 is the default)
INT8_EARLIER=runs/hidden-int8  # the same run with the 1200-step draft
INT8_AB=${INT8_AB:-runs/hidden-int8-ab}  # with the 1200-step draft unquantized (M-fp) beside the int8 one
CEILING_DRAFT=${CEILING_DRAFT:-$RUN/draft}
{
  echo "# Hidden-state speculative decoding (Make Every Draft Count) on SmolLM2-135M-Instruct"
  echo
  if [ -f "$RUN/eval.md" ]; then
    echo "## The trained draft ($RECIPE; settings in $RUN/train), held-out data"
    echo; sed 1d "$RUN/eval.md"; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## GSM8K, bf16, greedy (\`DATASETS=gsm8k ONLY=$METHODS PER=10 HIDDEN=$RUN/draft OUT=$BENCH bash benchmarks/bench/seed_drafters_bench.sh\`)"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$BENCH/report.md" | sed '1d;$d'; echo
  fi
  if [ -f "$COMPARE/report.md" ]; then
    echo "## Against standard and tree speculative decoding, with ablations, one interleaved run (GSM8K test + Spec-Bench, 4 prompts a category)"
    echo
    echo "\`ONLY=$COMPARE_METHODS HIDDEN=$RUN/draft OUT=$COMPARE bash benchmarks/bench/seed_drafters_bench.sh\`; standard (draft-chain)"
    echo "and tree (draft-tree) speculative decoding use the AdaSPEC-distilled 2-layer draft. The -gate methods add"
    echo "the opt-in draft gate (src/foretell/draft_gate.py: before each pass, whether drafting pays at all, from"
    echo "tokens per second measured with and without the drafter, per length of prompt lookup's n-gram match);"
    echo "parallel-head-auto-lookup is the JetSpec parallel head (docs/jetspec.md), here for the gate's effect on a second drafter."
    echo; sed '1,2d' "$COMPARE/report.md" | sed 's/^## /### /' | grep -v '^!\[' ; echo
  fi
  for other in "$MID:the 1200-step draft before the last 400 steps (second stage)" \
               "$SHORT:the 400-step draft (first stage)" \
               "$FIRST:the first, short recipe (\`STEPS=120\`) on data-set text, not the target's answers" \
               "$KL:loss weights MSE 0.1 / KL 0.9 instead of the paper's 0.7 / 0.3 (\`OUT=$KL MSE_WEIGHT=0.1 KL_WEIGHT=0.9 bash benchmarks/train/train_hidden_state.sh\`)"; do
    dir=${other%%:*}
    if [ "$dir" != "$RUN" ] && [ -f "$dir/eval.md" ]; then
      echo "## For comparison: ${other#*:}"
      echo; sed 1d "$dir/eval.md" | awk '/^Hot vocabulary/{exit} {print}'
    fi
  done
  if [ "$COMPARE" != "$BEFORE" ] && [ -f "$BEFORE/report.md" ]; then
    echo "## For comparison: the same draft without the scheduler's growth limits (every scheduled step grew 64 nodes and 5 levels; \`OUT=$BEFORE\`), overall"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$BEFORE/report.md" | sed '1d;$d'; echo
  fi
  for other in "$MID_COMPARE:$MID:the 1200-step" "$SHORT_COMPARE:$SHORT:the 400-step"; do
    report=${other%%:*}; rest=${other#*:}; draft=${rest%%:*}
    if [ "$COMPARE" != "$report" ] && [ -f "$report/report.md" ]; then
      echo "## For comparison: the same run with ${rest#*:} draft (\`HIDDEN=$draft/draft OUT=$report\`; without hidden-state-auto-lookup), overall"
      echo; sed -n '/^## overall/,/^Pass rate/p' "$report/report.md" | sed '1d;$d'; echo
    fi
  done
  BENCH_ARGS="--model smollm2-135m --dtype bfloat16 --datasets gsm8k,spec-bench --max-new-tokens 128 --threads 2 --hot-vocab 8192"
  INT8_METHODS=plain,prompt-lookup,hidden-state,hidden-state-auto,hidden-state-auto-lookup,hidden-state-lookup@8,hidden-state@4
  MID_ARGS="--hidden-draft $MID/draft $BENCH_ARGS"
  if [ -f "$INT8/report.md" ]; then
    echo "## Int8 draft, and the drafter foretell generate installs (\`foretell bench --hidden-draft $RUN/draft $BENCH_ARGS --per-category 4 --methods $INT8_METHODS --out $INT8\`)"
    echo
    echo "The hidden-state draft's decoder-layer projections are int8 on CPU (\`--draft-quant auto\`, the default, as for"
    echo "draft models; lossless). These runs had the draft's hot output rows in int8 too; those are now left in bf16, which"
    echo "was faster (\`.venv/bin/python benchmarks/bench/hidden_draft_step.py --hidden-draft DIR\`). hidden-state-auto-lookup is what"
    echo "\`foretell generate\` uses once a draft is installed (\`--install\`, the last stage of train_hidden_state.sh)."
    echo; sed '1,2d' "$INT8/report.md" | sed 's/^## /### /' | grep -v '^!\[' ; echo
  fi
  if [ "$INT8_EARLIER" != "$INT8" ] && [ -f "$INT8_EARLIER/report.md" ]; then
    echo "### The same run with the 1200-step draft (\`foretell bench $MID_ARGS --per-category 4 --methods $INT8_METHODS --out $INT8_EARLIER\`), overall"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$INT8_EARLIER/report.md" | sed '1d;$d'; echo
  fi
  if [ -f "$INT8_AB/report.md" ]; then
    echo "### Int8 against the unquantized draft, one run (\`foretell bench $MID_ARGS --per-category 2 --methods plain,prompt-lookup,hidden-state-auto,hidden-state-auto-fp,hidden-state-auto-lookup,hidden-state-auto-lookup-fp --out $INT8_AB\`), overall"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$INT8_AB/report.md" | sed '1d;$d'; echo
  fi
  if [ -f "$CEILING/ceiling.md" ]; then
    echo "## Speed ceilings by tree budget"; echo; echo "\`HIDDEN=$CEILING_DRAFT OUT=$CEILING bash benchmarks/bench/hidden_state_ceiling.sh\`"
    echo
    echo "One interleaved run on the seed comparison's prompts (GSM8K test + Spec-Bench, 4 a category, bf16, greedy) with"
    echo "fixed tree budgets (the paper's depth 5 and branching 3; -lookup adds prompt lookup's match as one more branch)."
    echo "Per budget: the measured speedup; the speedup if drafting and the engine cost nothing on this CPU"
    echo "(tau * c(1) / c(1 + drafts verified), c from the cost curve); and on any hardware (tau: a pass never costs less"
    echo "than one plain decoding step). src/foretell/bench/ceiling.py."
    echo; sed 's/^### /#### /' "$CEILING/ceiling.md" | sed 's/(ceiling.png)/(hidden-state-ceiling.png)/'; echo
    cp "$CEILING/ceiling.png" docs/hidden-state-ceiling.png
  fi
  if [ -f "$CHECK" ]; then
    echo "## The paper's checklist: token-info build and resampling share (\`.venv/bin/python benchmarks/bench/hidden_state_checklist.py --hidden-draft $RUN/draft --prompts 4 > $CHECK\`)"
    echo; echo "The held-out hidden MSE is in the first table above."; echo
    sed 's/^## /### /' "$CHECK"; echo
  fi
  echo "Every drafter side by side, this draft included: docs/seed-drafters.md (\`bash benchmarks/bench/seed_drafters_bench.sh\`)."
} > docs/hidden-state.md
echo "wrote docs/hidden-state.md" >&2
