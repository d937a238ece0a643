"""The corpus of the target's own answers (corpus.py): its continuation table, where prompt lookup and the result
cache draft from it, lossless decoding with it, and the checks on a corpus file and a shipped corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PROMPTS, greedy_params
from foretell.config import SpeculativeConfig
from foretell.corpus import Corpus, build_corpus
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.errors import ForetellError
from foretell.models.shipped import MANIFEST, resolve_corpus, resolve_drafter_folder, ship_corpus
from foretell.result_cache import ResultCache


def answers(*rows: tuple[list[int], int]) -> list[tuple[list[int], list[bool]]]:
    """(tokens, where the answer starts) -> build_corpus's (tokens, answer flags)."""
    return [(ids, [i >= start for i in range(len(ids))]) for ids, start in rows]


def test_the_table_keeps_each_contexts_most_frequent_confident_continuation():
    corpus = build_corpus(answers(([1, 2, 3, 4], 2), ([1, 2, 3, 4], 2), ([1, 2, 3, 5], 2), ([7, 8, 9], 2)),
                          vocab_size=16, min_count=2, min_share=0.5)
    assert corpus.tables[2][(2, 3)] == 4  # seen twice of three: kept, the most frequent
    assert corpus.tables[2][(1, 2)] == 3  # keys reach into the prompt; the token predicted is answer text
    assert (7, 8) not in corpus.tables[2]  # seen once: below min_count
    assert (9, 1) not in corpus.tables[2]  # no key spans two sequences
    assert corpus.settings["sequences"] == 4 and corpus.settings["answer_tokens"] == 7
    unsure = build_corpus(answers(([1, 2, 3], 2), ([1, 2, 3], 2), ([1, 2, 4], 2), ([1, 2, 4], 2), ([1, 2, 5], 2)),
                          vocab_size=16, min_count=2, min_share=0.5)
    assert (1, 2) not in unsure.tables[2]  # its best continuation has only 2 of 5: not confident
    with pytest.raises(ForetellError, match="no answer tokens"):
        build_corpus(answers(([1, 2, 3], 3)), vocab_size=16)


def test_match_chains_continuations_and_falls_back_to_shorter_keys():
    corpus = Corpus({2: {(5, 6): 7, (6, 7): 8, (7, 8): 9}, 3: {(4, 5, 6): 1}})
    assert corpus.match([4, 5, 6], 5) == ([1], 3)  # the longest key first; (6, 1) is unknown: the chain stops
    assert corpus.match([0, 5, 6], 5) == ([7, 8, 9], 2)
    assert corpus.match([0, 5, 6], 2) == ([7, 8], 2)
    assert corpus.match([3, 3], 4) == ([], 0)


def test_a_corpus_file_round_trips_and_a_damaged_or_foreign_one_is_refused(tmp_path):
    corpus = build_corpus(answers(([1, 2, 3, 4, 5], 1), ([1, 2, 3, 4, 6], 1)), vocab_size=16)
    path = tmp_path / "c.npz"
    corpus.save(path)
    loaded = Corpus.load(path)
    assert loaded.tables == corpus.tables and loaded.settings == corpus.settings
    again = tmp_path / "again.npz"
    loaded.save(again)
    assert again.read_bytes() == path.read_bytes()  # the same table, the same bytes (a checksum that reproduces)
    with pytest.raises(ForetellError, match="vocabulary of 16 tokens, this target has 8"):
        loaded.check_vocab(8, "c.npz")
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ForetellError, match="not a readable corpus"):
        Corpus.load(path)
    with pytest.raises(ForetellError, match="no corpus file"):
        Corpus.load(tmp_path / "missing.npz")


def test_prompt_lookup_drafts_from_the_corpus_where_the_context_has_no_longer_match():
    corpus = Corpus({2: {(8, 9): 3}}, {})
    drafter = PromptLookupDrafter(3, 1, corpus)
    assert drafter.propose([1, 2, 5, 1, 2], 4).tokens.tolist() == [5, 1, 2]  # a 2-gram of the context first
    assert drafter.propose([1, 9, 5, 8, 9], 4).tokens.tolist() == [3]  # the corpus before a 1-gram match (9 -> 5)
    assert drafter.propose([1, 9, 5, 7, 9], 4).tokens.tolist() == [5, 7, 9]  # neither: the 1-gram match
    assert PromptLookupDrafter(3, 2, corpus).propose([1, 9, 5, 7, 9], 4).size == 0  # lookup_min 2: no 1-grams


def test_the_result_cache_offers_the_corpus_when_nothing_stored_matches():
    cache = ResultCache(max_ngram=3, min_ngram=2, max_branch=4, corpus=Corpus({2: {(4, 9): 9, (9, 9): 9}}))
    seq = cache.begin([1, 2])
    cache.extend(seq, [1, 2, 3, 4, 5, 6])
    assert cache.match([0, 3, 4], 10) == ([5, 6], 2)  # stored output first
    assert cache.match([6, 4, 9], 10) == ([9, 9, 9, 9], 2)  # the corpus, capped by max_branch


@pytest.fixture(scope="module")
def own_corpus(plain, tmp_path_factory):
    """A corpus of the tiny target's own greedy answers to PROMPTS."""
    rows = [(p, len(p)) for p in PROMPTS]
    rows = [(p + plain.engine.generate(p, greedy_params()).tokens, start) for p, start in rows]
    path = tmp_path_factory.mktemp("corpus") / "own.npz"
    build_corpus(answers(*rows), plain.target.config.vocab_size, min_count=1, min_share=0.3).save(path)
    return path


@pytest.mark.parametrize("method", ["prompt-lookup", "draft-tree"])
def test_greedy_decoding_with_a_corpus_equals_plain_and_accepts_more(plain, tiny_pair, own_corpus, method):
    model = str(tiny_pair[1]) if method == "draft-tree" else None
    params = greedy_params()
    accepted = {}
    for corpus in (None, str(own_corpus)):
        pipe = plain.with_speculative(SpeculativeConfig(method=method, model=model, corpus=corpus))
        total = 0
        for prompt in PROMPTS:
            result = pipe.engine.generate(prompt, params)
            assert result.tokens == plain.engine.generate(prompt, params).tokens
            total += sum(result.stats.accepted_per_position)
        accepted[corpus] = total
    assert accepted[str(own_corpus)] > accepted[None]  # the target's own answers, drafted back to it


def test_the_corpus_option_applies_to_prompt_lookup_and_tree_drafters_only():
    with pytest.raises(ForetellError, match="--corpus"):
        SpeculativeConfig(method="none", corpus="x.npz")
    with pytest.raises(ForetellError, match="--corpus"):
        SpeculativeConfig(method="draft-model", model="d", corpus="x.npz")


def test_a_shipped_corpus_is_checked_for_damage_and_for_its_target(plain, own_corpus, tmp_path):
    target = plain.target.model
    folder = ship_corpus(own_corpus, "tiny-answers", "tiny", target, {"command": "test"}, root=tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["kind"] == "corpus" and set(manifest["files"]) == {"corpus.npz"}
    assert resolve_corpus("tiny-answers", target, tmp_path).keys > 0
    with pytest.raises(ForetellError, match="no corpus file 'tiny-answers', and no shipped corpus"):
        plain.with_speculative(SpeculativeConfig(corpus="tiny-answers"))  # by name: the package's own root
    with pytest.raises(ForetellError, match="a shipped corpus, not a parallel-head drafter: give it as --corpus"):
        resolve_drafter_folder("tiny-answers", "parallel-head", target, tmp_path)
    with pytest.raises(ForetellError, match="no shipped corpus"):
        resolve_corpus("other", target, tmp_path)
    other = json.loads((folder / MANIFEST).read_text())
    other["target"]["embedding_sha256"] = "0" * 16
    (folder / MANIFEST).write_text(json.dumps(other))
    with pytest.raises(ForetellError, match="trained for tiny; this target differs"):
        resolve_corpus("tiny-answers", target, tmp_path)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    data = (folder / "corpus.npz").read_bytes()
    (folder / "corpus.npz").write_bytes(data[:-8] + np.zeros(8, np.uint8).tobytes())
    with pytest.raises(ForetellError, match="damaged"):
        resolve_corpus("tiny-answers", target, tmp_path)


@pytest.mark.parametrize("params", ["t1.0", "t0.7-top_p0.9"])
def test_sampling_with_a_corpus_follows_the_target(micro, tmp_path, params):
    """Prompt lookup drafting from a corpus of the micro target's own samples: the first tokens of seeded sampled
    runs follow the target's exact distribution (chi-square against enumeration)."""
    from foretell.api import load
    from foretell.types import SamplingParams
    from test_engine_statistical import PARAMS, PROMPT, assert_tree_samples_follow_target

    target, root = micro
    plain = load(root / "t", "none", warm_up=False)
    rows = []
    for seed in range(200):
        sampled = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=8, ignore_eos=True)
        rows.append((PROMPT + plain.engine.generate(PROMPT, sampled).tokens, len(PROMPT)))
    path = tmp_path / "micro.npz"
    corpus = build_corpus(answers(*rows), plain.target.config.vocab_size, min_count=2, min_share=0.2)
    corpus.save(path)
    assert corpus.match(PROMPT, 4)[0], "the corpus should draft from the prompt on"
    spec = plain.with_speculative(SpeculativeConfig(corpus=str(path)))
    assert_tree_samples_follow_target(spec, target, PARAMS[params])
