"""Pure pieces: sampling filters, prompt lookup, draft-length policies, text streaming."""

import pytest
import torch

from conftest import make_tokenizer
from foretell.drafters.prompt_lookup import find_continuation
from foretell.sampling import processed_probs
from foretell.sizing.chain import AdditiveLength, FixedLength, RejectionRateLength
from foretell.text import TextStream
from foretell.types import GenerationStats, Proposal, SamplingParams
from foretell.verify import residual, verify_greedy


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]))
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.2 < 0.8 -> keep 3
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))  # the top token always stays
    assert torch.equal(p, torch.tensor([1.0, 0, 0, 0, 0]))
    cold = processed_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(cold, torch.softmax(logits / 0.5, -1))
    assert torch.equal(processed_probs(logits, SamplingParams()), torch.tensor([1.0, 0, 0, 0, 0]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(stop=("",)), "stop"),
    ],
)
def test_invalid_sampling_parameters_are_named(kwargs, message):
    from foretell.errors import ForetellError

    with pytest.raises(ForetellError, match=message):
        SamplingParams(**kwargs)


def test_greedy_verification_accepts_the_matching_prefix():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 7, 2, 9]):
        logits[row, best] = 5.0
    v = verify_greedy(logits, Proposal(torch.tensor([3, 7, 5])))
    assert (v.accepted, v.next_token) == (2, 2)
    v = verify_greedy(logits, Proposal(torch.tensor([3, 7, 2])))
    assert (v.accepted, v.next_token) == (3, 9)  # bonus
    v = verify_greedy(logits, Proposal(torch.tensor([4, 7, 2])))
    assert (v.accepted, v.next_token) == (0, 3)


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q, 1), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, None, 0), torch.tensor([0.0, 0.6, 0.4]))


def test_prompt_lookup_uses_longest_most_recent_match():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert find_continuation(tokens, 3, max_ngram=3, min_ngram=1) == [7, 8, 5]  # "2 3" last seen before 7
    assert find_continuation([1, 2, 3, 4], 2, 3, 1) == []  # nothing repeats
    assert find_continuation([4, 5, 4], 5, 3, 1) == [5, 4]
    assert find_continuation([7], 3, 3, 1) == []


def test_rejection_rate_policy_follows_the_seed_rule():
    policy = RejectionRateLength(base=5)
    assert policy.next_length() == 5
    for _ in range(5):
        policy.update(5, 5)  # nothing rejected
    assert policy.next_length() == 7
    for _ in range(20):
        policy.update(5, 0)  # each step: one rejected
    assert policy.next_length() == 4
    mid = RejectionRateLength(base=5, window=10)
    for _ in range(3):
        mid.update(3, 2)  # 2 accepted, 1 rejected: rate 1/3
    assert mid.next_length() == 5


def test_additive_policy_matches_transformers_heuristic():
    policy = AdditiveLength(start=4)
    policy.update(4, 4)
    assert policy.next_length() == 6
    policy.update(6, 2)
    assert policy.next_length() == 5
    for _ in range(10):
        policy.update(policy.next_length(), 0)
    assert policy.next_length() == 1
    assert FixedLength(3).next_length() == 3


def test_text_stream_holds_back_partial_stop_strings():
    tok = make_tokenizer(16)
    ids = tok("w1 w2 w3 w4 w5", add_special_tokens=False)["input_ids"]
    stream = TextStream(tok, stop=("w3 w4",))
    deltas = [stream.update(ids[:n]) for n in range(1, 6)]
    assert "".join(deltas) + stream.flush() == "w1 w2 "
    assert stream.stopped


def test_stats_tau_and_per_position_acceptance():
    s = GenerationStats()
    s.record(4, 2)
    s.record(4, 4)
    s.record(2, 0)
    s.target_passes = 3
    assert s.proposed_per_position == [3, 3, 2, 2]
    assert s.accepted_per_position == [2, 2, 1, 1]
    assert s.tau == (6 + 3) / 3
    assert s.acceptance_rate == 6 / 10
