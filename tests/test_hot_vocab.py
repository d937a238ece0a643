"""Hot-token vocabulary: selection, expansion, coverage, and exactness when drafting with it."""

from collections import Counter

import torch

from foretell.api import load
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.draft_tree import DraftTreeDrafter
from foretell.config import TreeShape
from foretell.hot_vocab import count_tokens, default_hot_vocab, hot_vocab_from_counts
from foretell.types import SamplingParams
from conftest import make_tokenizer


def test_most_frequent_tokens_then_low_ids():
    hot = hot_vocab_from_counts(Counter({7: 5, 3: 9, 12: 1, 40: 2}), size=6, full_size=20)
    assert hot.ids.tolist() == [0, 1, 2, 3, 7, 12]  # 4 counted tokens, then the lowest free ids
    assert hot.size == 6  # 40 is outside the vocabulary and is skipped


def test_expand_puts_minus_infinity_outside_the_hot_set():
    hot = hot_vocab_from_counts(Counter({1: 3, 4: 2}), size=2, full_size=6)
    full = hot.expand(torch.tensor([[0.5, 2.0]]))
    assert full.shape == (1, 6)
    assert full[0, 1] == 0.5 and full[0, 4] == 2.0
    assert torch.isinf(full[0, [0, 2, 3, 5]]).all()
    assert hot.coverage([1, 4, 4, 5]) == 0.75


def test_default_hot_vocab_is_counted_once_and_cached(tmp_path):
    tok = make_tokenizer(40)
    first = default_hot_vocab(tok, 10, 40, tmp_path)
    assert first.size == 10 and set(tok.all_special_ids) <= set(first.ids.tolist())
    assert list((tmp_path / "hot_vocab").glob("*.json"))
    assert torch.equal(default_hot_vocab(tok, 10, 40, tmp_path).ids, first.ids)
    assert count_tokens(tok, ["w1 w1 w2"])[tok.convert_tokens_to_ids("w1")] == 2


def test_drafting_with_a_hot_vocabulary_stays_exact(tiny_pair):
    target, draft = tiny_pair
    plain = load(target, "none")
    draft_model = load(draft, "none").target.model
    hot = hot_vocab_from_counts(Counter(range(3, 30)), size=30, full_size=48)
    prompt = [1, 5, 9, 12, 5, 9, 30]
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    expected = plain.engine.generate(prompt, params).tokens
    for drafter in (DraftModelDrafter(draft_model, 48, hot), DraftTreeDrafter(draft_model, 48, TreeShape(), hot=hot)):
        result = plain.with_drafter(drafter, gamma=4).engine.generate(prompt, params)
        assert result.tokens == expected
        assert sum(result.stats.accepted_per_position) > 0
    # drafts never leave the hot set
    chain = DraftModelDrafter(draft_model, 48, hot)
    chain.start(prompt, 64, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    proposal = chain.propose(prompt, 6)
    assert set(proposal.tokens.tolist()) <= set(hot.ids.tolist())
    assert proposal.q[:, [t for t in range(48) if t not in set(hot.ids.tolist())]].sum() == 0
