"""`foretell corpus`: a corpus of the target's own answers as a continuation table (corpus.py) for prompt lookup
and the tree drafters' result-cache branch (`--corpus FILE`).

The answers are best the target's own (`foretell self-data` writes them); any conversations work. As for every
drafter's training data, a conversation sharing text with an evaluation prompt is dropped (heldout.py), so the
bench never drafts from an answer to one of its own prompts.
"""

from __future__ import annotations

from pathlib import Path
import json

from tqdm import tqdm

from foretell.conversations import conversations
from foretell.corpus import Corpus, build_corpus
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.errors import ForetellError
from foretell.runtime.loading import load_model
from foretell.train.common.data import tokenize_conversation
from foretell.train.common.heldout import FilterReport, HeldOut, evaluation_prompts, without_heldout


def corpus_from_sources(tokenizer, vocab_size: int, sources: list[str], min_count: int = 2,
                        min_share: float = 0.3) -> tuple[Corpus, dict]:
    """The corpus of every conversation in `sources` (gsm8k | sharegpt | .jsonl / .jsonl.gz files; train split)
    that shares no text with an evaluation prompt, and a report of what went in."""
    if min_count < 1 or not 0.0 < min_share <= 1.0:
        raise ForetellError(f"--min-count must be >= 1 and --min-share in (0, 1], got {min_count}, {min_share}")
    prompts, unchecked = evaluation_prompts()
    index, filtered = HeldOut.of(prompts), FilterReport()
    sequences, rows = [], {}
    for source in sources:
        before = len(sequences)
        convs = without_heldout(conversations(source, "train"), index, filtered)
        for messages in tqdm(convs, desc=f"corpus: {Path(source).name}", unit=" conversations", mininterval=2):
            sequences.append(tokenize_conversation(tokenizer, messages))
        rows[source] = len(sequences) - before
    corpus = build_corpus(sequences, vocab_size, min_count, min_share)
    report = {"sources": rows, "heldout_dropped": filtered.dropped, "heldout_kept": filtered.kept,
              "unchecked": unchecked, "keys": {n: len(t) for n, t in corpus.tables.items()}, **corpus.settings}
    return corpus, report


def replayed_tau(tokenizer, source: str, corpus: Corpus | None, gamma: int = 4) -> float:
    """Tokens a pass of prompt lookup (gamma drafts, greedy) would yield over the recorded answers in `source`
    (the target's own, e.g. to held-out prompts), with the corpus or without: each pass drafts from the context so
    far and keeps the drafts equal to the answer's next tokens, plus the target's own token."""
    drafter, tokens, passes = PromptLookupDrafter(corpus=corpus), 0, 0
    for messages in conversations(source, "test"):
        ids, flags = tokenize_conversation(tokenizer, messages)
        at = flags.index(True) if True in flags else len(ids)
        tokens += len(ids) - at
        passes += replayed_passes(drafter, ids, at, gamma)
    if not passes:
        raise ForetellError(f"{source} holds no answer to replay")
    return tokens / passes


def replayed_passes(drafter, ids: list[int], at: int, gamma: int = 4) -> int:
    """Target passes a deterministic drafter needs for the recorded tokens ids[at:] (greedy): each pass drafts
    `gamma` tokens from the context so far and keeps those equal to the record, plus the target's own token."""
    passes = 0
    while at < len(ids):
        draft = drafter.propose(ids[:at], gamma).tokens.tolist()
        at += next((i for i, t in enumerate(draft) if at + i >= len(ids) or ids[at + i] != t), len(draft)) + 1
        passes += 1
    return passes


def add_corpus_parser(sub) -> None:
    p = sub.add_parser(
        "corpus", help="build a corpus of the target's own answers for --corpus (lossless drafting, no training)",
        description="Reads conversations (best the target's own answers: `foretell self-data`), drops any that "
        "shares text with an evaluation prompt, and writes the table of each 2-, 3- and 4-token context's most "
        "frequent continuation in the answers. `--corpus FILE` then drafts from it where the prompt and output "
        "offer no match (prompt lookup, and the tree drafters' result-cache branch).")
    p.add_argument("--target", default="smollm2-135m",
                   help="target model whose tokenizer is used (default: %(default)s)")
    p.add_argument("--data", required=True,
                   help="comma-separated sources: gsm8k | sharegpt | .jsonl / .jsonl.gz files of conversations")
    p.add_argument("--min-count", type=int, default=2, help="keep a continuation seen at least this often (default: 2)")
    p.add_argument("--min-share", type=float, default=0.3,
                   help="... and at least this share of its context's continuations (default: 0.3)")
    p.add_argument("--out", required=True, help="the corpus file to write (.npz)")
    p.set_defaults(run=cmd_corpus)


def cmd_corpus(args) -> None:
    target = load_model(args.target, "float32")
    sources = [s.strip() for s in args.data.split(",") if s.strip()]
    corpus, report = corpus_from_sources(target.tokenizer, target.config.vocab_size, sources, args.min_count,
                                         args.min_share)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(out.name + ".partial")
    corpus.save(staging)
    staging.replace(out)
    print(json.dumps(report))
    print(f"wrote {out}: {corpus.keys} contexts from {report['answer_tokens']} answer tokens; "
          f"use it with --corpus {out}")
