"""Build the corpus of SmolLM2-135M-Instruct's own answers that ships with foretell (src/foretell/shipped/corpora/
smollm2-135m-answers) from the self-data the shipped drafters trained on (benchmarks/data/self_data: its greedy
answers to ShareGPT and GSM8K training prompts), with a manifest: the command, the data, the commit, the table.

    .venv/bin/python benchmarks/ship/ship_corpus.py [--name smollm2-135m-answers] [--min-count 2] [--min-share 0.3]
    .venv/bin/python benchmarks/ship/ship_corpus.py --extra gsm8k --check-only   # held-out figures with more data, no ship

Then `--corpus smollm2-135m-answers` drafts from it (prompt lookup, or a tree drafter's result-cache branch).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = [ROOT / "benchmarks/data/self_data/smollm2-gsm8k.jsonl.gz",
        ROOT / "benchmarks/data/self_data/smollm2-sharegpt.jsonl.gz"]
# the target's answers to held-out prompts (GSM8K test, ShareGPT's held-out split), replayed through prompt lookup
HELDOUT = [ROOT / "benchmarks/data/self_data/smollm2-gsm8k-test.jsonl.gz",
           ROOT / "benchmarks/data/self_data/smollm2-sharegpt-test.jsonl.gz"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="smollm2-135m-answers")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--min-count", type=int, default=2)
    p.add_argument("--min-share", type=float, default=0.3)
    p.add_argument("--extra", default="", help="more comma-separated sources (gsm8k, sharegpt, .jsonl files)")
    p.add_argument("--check-only", action="store_true", help="print the held-out figures; ship nothing")
    args = p.parse_args()

    from foretell.runtime.loading import load_model
    from foretell.models.shipped import ship_corpus
    from foretell.train.corpus import corpus_from_sources, replayed_tau

    target = load_model(args.target, "float32")
    sources = [str(d) for d in DATA] + [s for s in args.extra.split(",") if s]
    corpus, report = corpus_from_sources(target.tokenizer, target.config.vocab_size, sources, args.min_count,
                                         args.min_share)
    report["sources"] = {str(Path(k).relative_to(ROOT)) if k.startswith(str(ROOT)) else k: v
                         for k, v in report["sources"].items()}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    heldout = {str(h.relative_to(ROOT)): {"prompt_lookup_tau": round(replayed_tau(target.tokenizer, str(h), None), 3),
                                          "with_corpus_tau": round(replayed_tau(target.tokenizer, str(h), corpus), 3)}
               for h in HELDOUT}
    print(f"{corpus.keys} contexts; held out, prompt lookup's tokens a pass over the target's recorded answers:",
          heldout)
    if args.check_only:
        return
    made_by = {"command": ("python benchmarks/ship/ship_corpus.py " + " ".join(sys.argv[1:])).strip(), "commit": commit,
               "data": report, "heldout": heldout}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "corpus.npz"
        corpus.save(source)
        out = ship_corpus(source, args.name, args.target, target.model, made_by)
    size = (out / "corpus.npz").stat().st_size
    print(f"shipped {out} ({size / 2**20:.2f} MiB): {corpus.keys} contexts from {report['answer_tokens']} answer "
          f"tokens of {report['sequences']} answers ({report['heldout_dropped']} dropped for sharing text with an "
          "evaluation prompt)")


if __name__ == "__main__":
    main()
