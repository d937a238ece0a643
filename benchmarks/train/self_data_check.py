"""Answer the first prompts of a self-data file again with `foretell self-data`'s engine (continuous batching, each
request drafted losslessly) and compare: how many answers are identical, where the others first differ, and the
answers a second for each drafter, side by side in one run.

    .venv/bin/python benchmarks/train/self_data_check.py benchmarks/data/self_data/smollm2-sharegpt-test.jsonl.gz \
        --num 24 --max-new-tokens 192 --drafters default,none

The self-data files shipped in benchmarks/data/self_data were written before the engine did this (a padded batch
decoded in PyTorch, bf16 products on few-row passes), so an answer may differ from the engine's from the token where
the two computations' rounding first picks another argmax.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a self-data file (.jsonl or .jsonl.gz) of {messages: [user, assistant]} rows")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--num", type=int, default=24, help="first rows to answer again (default: 24)")
    p.add_argument("--max-new-tokens", type=int, default=192, help="as the file was made with (default: 192)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--drafters", default="default,none",
                   help="comma-separated: default (the target's default drafter), none, or a shipped drafter name")
    args = p.parse_args()

    from foretell.api import load
    from foretell.config import SpeculativeConfig
    from foretell.build import default_speculative
    from foretell.models.shipped import SHIPPED_DIR, Manifest
    from foretell.conversations import read_jsonl_rows
    from foretell.train.common.self_data import SelfDataConfig, make_self_data

    rows = list(read_jsonl_rows(Path(args.file)))[: args.num]
    recorded = [r["messages"][1]["content"] for r in rows]
    tokenizer = load(args.target, "none", warm_up=False).tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"messages": r["messages"][:1]}) + "\n" for r in rows))
        results = {}
        for name in args.drafters.split(","):
            if name == "default":
                spec = default_speculative(args.target)[0]
            elif name == "none":
                spec = SpeculativeConfig(method="none")
            else:
                spec = Manifest.read(SHIPPED_DIR / name).speculative_config()
            cfg = SelfDataConfig(args.target, str(prompts), num_prompts=len(rows), max_prompt_tokens=10**6,
                                 max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, speculative=spec)
            out = Path(tmp) / f"{name}.jsonl"
            t0 = time.perf_counter()
            make_self_data(cfg, out)
            seconds = time.perf_counter() - t0  # the model's loading included, as a user's run pays it
            answers = [r["messages"][1]["content"] for r in read_jsonl_rows(out)]
            tokens = sum(len(tokenizer.encode(a, add_special_tokens=False)) for a in answers)
            results[name] = (answers, seconds, tokens)
            print(f"{name} ({spec.describe()}): {len(rows) / seconds:.2f} answers/s, {tokens / seconds:.0f} tokens/s "
                  f"({seconds:.0f} s with loading)", flush=True)
    first = next(iter(results.values()))[0]
    for name, (answers, _, _) in results.items():
        assert answers == first, f"drafter {name} changed an answer: drafting must be lossless"
    same = sum(a == b for a, b in zip(first, recorded))
    diffs = []
    for a, b in zip(first, recorded):
        ta, tb = tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False)
        if ta != tb:
            diffs.append(next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb))))
    print(f"every drafter wrote the same answers; {same} of {len(rows)} equal the file's"
          + (f"; the others first differ at tokens {sorted(diffs)}" if diffs else ""))


if __name__ == "__main__":
    sys.exit(main())
