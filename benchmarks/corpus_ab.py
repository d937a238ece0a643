"""Two corpora of the target's answers side by side: each built from its own sources (as `foretell corpus` builds
them, evaluation prompts dropped), then prompt lookup with it replayed over held-out recorded answers (tokens a
pass, greedy, gamma 4; train/corpus.replayed_tau), without a corpus as the baseline. Seconds, no model pass.

    .venv/bin/python benchmarks/corpus_ab.py --a OLD.jsonl,gsm8k-answers.jsonl.gz --b NEW.jsonl,gsm8k-answers.jsonl.gz \
        --heldout runs/self_data/engine/smollm2-sharegpt-test.jsonl,runs/self_data/engine/smollm2-gsm8k-test.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--a", required=True, help="comma-separated sources of corpus A (.jsonl / .jsonl.gz, gsm8k, ...)")
    p.add_argument("--b", required=True, help="the same for corpus B")
    p.add_argument("--heldout", required=True, help="comma-separated files of recorded held-out answers")
    args = p.parse_args()

    from foretell.models.loading import load_model
    from foretell.train.corpus import corpus_from_sources, replayed_tau

    target = load_model(args.target, "float32")
    tokenizer, heldout = target.tokenizer, args.heldout.split(",")
    print("held out:", ", ".join(Path(h).name for h in heldout))
    print("no corpus:", [round(replayed_tau(tokenizer, h, None), 3) for h in heldout])
    for name, sources in (("A", args.a), ("B", args.b)):
        corpus, report = corpus_from_sources(tokenizer, target.config.vocab_size, sources.split(","))
        taus = [round(replayed_tau(tokenizer, h, corpus), 3) for h in heldout]
        print(f"{name}: {corpus.keys} contexts from {report['answer_tokens']} answer tokens: {taus}", flush=True)


if __name__ == "__main__":
    main()
