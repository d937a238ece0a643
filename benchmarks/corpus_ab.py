"""Two corpora of the target's answers side by side: each built from its own sources (as `foretell corpus` builds
them, evaluation prompts dropped), then prompt lookup with it replayed over recorded greedy answers (tokens a pass,
gamma 4; train/corpus.replayed_tau), without a corpus as the baseline. Seconds, no model pass.

--heldout replays held-out answers from `foretell self-data`; --bench-run replays the plain rows of a greedy
`foretell bench` run (its prompts re-encoded, its answers as recorded), per category: for a deterministic drafter
that is the tau the bench would measure for it on those prompts, without the timing noise.

    .venv/bin/python benchmarks/corpus_ab.py --a OLD.jsonl,gsm8k-answers.jsonl.gz --b NEW.jsonl,gsm8k-answers.jsonl.gz \
        --heldout runs/self_data/engine/smollm2-sharegpt-test.jsonl,runs/self_data/engine/smollm2-gsm8k-test.jsonl
    .venv/bin/python benchmarks/corpus_ab.py --a ... --b ... --bench-run benchmarks/results/avx2-epyc/corpus/generalisation
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path


def bench_answers(run: Path, tokenizer) -> list[tuple[str, list[int], list[int]]]:
    """(category, prompt ids, answer ids) of every plain row of a greedy bench run."""
    from foretell.bench.datasets import load_prompts
    from foretell.text import encode_prompt

    settings = json.loads((run / "bench.json").read_text())["settings"]
    if settings.get("temperature"):
        raise SystemExit(f"{run} is a sampled run: replay needs the greedy answers")
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["method"] == "plain"]
    names = sorted({r["dataset"] for r in rows})
    per_category = max(Counter((r["dataset"], r["category"]) for r in rows).values())
    prompts = {(p["dataset"], str(p["id"])): p["prompt"] for p in load_prompts(names, per_category)}
    return [(f"{r['dataset']}: {r['category']}", encode_prompt(tokenizer, prompts[(r["dataset"], str(r["id"]))],
                                                               settings.get("chat", True)), r["tokens"]) for r in rows]


def bench_table(answers, corpora: dict) -> None:
    from foretell.drafters.prompt_lookup import PromptLookupDrafter
    from foretell.train.corpus import replayed_passes

    tokens, passes = defaultdict(int), defaultdict(int)
    for category, prompt, answer in answers:
        for name, corpus in corpora.items():
            n = replayed_passes(PromptLookupDrafter(corpus=corpus), prompt + answer, len(prompt))
            for key in ((category, name), ("overall", name)):
                tokens[key], passes[key] = tokens[key] + len(answer), passes[key] + n
    print("| category | " + " | ".join(corpora) + " |\n|---|" + "---:|" * len(corpora))
    for category in dict.fromkeys([a[0] for a in answers] + ["overall"]):
        print(f"| {category} | " + " | ".join(f"{tokens[category, n] / passes[category, n]:.2f}" for n in corpora)
              + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--a", required=True, help="comma-separated sources of corpus A (.jsonl / .jsonl.gz, gsm8k, ...)")
    p.add_argument("--b", required=True, help="the same for corpus B")
    p.add_argument("--heldout", default="", help="comma-separated files of recorded held-out answers")
    p.add_argument("--bench-run", type=Path, help="a greedy `foretell bench` output folder to replay, by category")
    args = p.parse_args()
    if not args.heldout and not args.bench_run:
        p.error("give --heldout, --bench-run or both")

    from foretell.models.loading import load_model
    from foretell.train.corpus import corpus_from_sources, replayed_tau

    target = load_model(args.target, "float32")
    tokenizer, heldout = target.tokenizer, [h for h in args.heldout.split(",") if h]
    corpora = {"no corpus": None}
    for name, sources in (("A", args.a), ("B", args.b)):
        corpora[name], report = corpus_from_sources(tokenizer, target.config.vocab_size, sources.split(","))
        print(f"{name}: {corpora[name].keys} contexts from {report['answer_tokens']} answer tokens", flush=True)
    if heldout:
        print("held out:", ", ".join(Path(h).name for h in heldout))
        for name, corpus in corpora.items():
            print(f"{name}:", [round(replayed_tau(tokenizer, h, corpus), 3) for h in heldout], flush=True)
    if args.bench_run:
        print(f"\ntokens a pass replayed over {args.bench_run}'s plain answers:\n")
        bench_table(bench_answers(args.bench_run, tokenizer), corpora)


if __name__ == "__main__":
    main()
