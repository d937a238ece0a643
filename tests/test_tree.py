"""Tree layout (mask, positions, retrieval) on trees drawn by hand, and tree verification."""

import pytest
import torch
from scipy.stats import chisquare

from foretell.sampling import processed_probs, sample
from foretell.tree import (
    accepted_slots,
    attention_mask,
    chain_parents,
    check_parents,
    depths,
    path_to,
    retrieve_indices,
    slot_positions,
)
from foretell.types import Proposal, SamplingParams, Verification
from foretell.verify import residual, verify, verify_tree_greedy, verify_tree_sampled

T, F = True, False

# root ─ 0 ─ 1 ─ 2            (chain)
CHAIN = torch.tensor([-1, 0, 1])
# root ─┬ 0
#       ├ 1
#       └ 2                    (wide)
WIDE = torch.tensor([-1, -1, -1])
# root ─┬ 0 ─┬ 2 ─ 4
#       │    └ 3
#       └ 1 ─ 5                (unbalanced)
UNBALANCED = torch.tensor([-1, -1, 0, 0, 2, 1])


def test_chain_layout():
    assert torch.equal(chain_parents(3), CHAIN)
    assert torch.equal(slot_positions(CHAIN, 10), torch.tensor([10, 11, 12, 13]))
    assert torch.equal(attention_mask(CHAIN), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(retrieve_indices(CHAIN), torch.tensor([[0, 1, 2, 3]]))


def test_wide_layout():
    assert torch.equal(depths(WIDE), torch.tensor([1, 1, 1]))
    expected = torch.tensor([[T, F, F, F], [T, T, F, F], [T, F, T, F], [T, F, F, T]])
    assert torch.equal(attention_mask(WIDE), expected)
    assert torch.equal(retrieve_indices(WIDE), torch.tensor([[0, 1], [0, 2], [0, 3]]))


def test_unbalanced_layout():
    assert torch.equal(slot_positions(UNBALANCED, 5), torch.tensor([5, 6, 6, 7, 7, 8, 7]))
    expected = torch.tensor(
        [
            # root n0 n1 n2 n3 n4 n5
            [T, F, F, F, F, F, F],  # root
            [T, T, F, F, F, F, F],  # n0
            [T, F, T, F, F, F, F],  # n1
            [T, T, F, T, F, F, F],  # n2
            [T, T, F, F, T, F, F],  # n3
            [T, T, F, T, F, T, F],  # n4
            [T, F, T, F, F, F, T],  # n5
        ]
    )
    assert torch.equal(attention_mask(UNBALANCED), expected)
    assert torch.equal(
        retrieve_indices(UNBALANCED), torch.tensor([[0, 1, 4, -1], [0, 1, 3, 5], [0, 2, 6, -1]])  # leaves 3, 4, 5
    )
    assert path_to(4, UNBALANCED) == [0, 2, 4]
    assert torch.equal(accepted_slots([0, 2, 4]), torch.tensor([0, 1, 3, 5]))


def test_deep_layout():
    deep = chain_parents(12)
    assert torch.equal(depths(deep), torch.arange(1, 13))
    assert attention_mask(deep).sum() == 13 * 14 // 2


def test_bad_parents_are_rejected():
    with pytest.raises(ValueError):
        check_parents(torch.tensor([-1, 1]))
    with pytest.raises(ValueError):
        check_parents(torch.tensor([-1, -2]))


def one_hot_logits(best: list[int], vocab: int = 10) -> torch.Tensor:
    logits = torch.full((len(best), vocab), -5.0)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_tree_follows_the_argmax_path():
    tokens = torch.tensor([4, 7, 1, 2, 9, 3])  # on UNBALANCED
    # slots: root wants 7 (node 1), node 1 wants 3 (node 5), node 5 wants 8 (not drafted)
    logits = one_hot_logits([7, 0, 3, 0, 0, 0, 8])
    v = verify_tree_greedy(logits, Proposal(tokens, parents=UNBALANCED))
    assert (v.path, v.next_token, v.accepted) == ([1, 5], 8, 2)
    # the first of two siblings that both match is taken, and a miss at the root gives []
    v = verify_tree_greedy(one_hot_logits([6, 0, 0, 0]), Proposal(torch.tensor([1, 2, 3]), parents=WIDE))
    assert (v.path, v.next_token) == ([], 6)


def test_tree_verify_on_a_chain_equals_chain_verify():
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(4, 12, generator=g)
    q = processed_probs(torch.randn(3, 12, generator=g), params)
    tokens = torch.tensor([sample(q[i], g) for i in range(3)])
    for seed in range(50):
        chain = verify(logits, Proposal(tokens, q), params, torch.Generator().manual_seed(seed))
        tree = verify_tree_sampled(logits, Proposal(tokens, q, CHAIN), params, torch.Generator().manual_seed(seed))
        assert chain.accepted == tree.accepted and chain.next_token == tree.next_token


# --- statistics: the first emitted token of a tree step must follow the target's p -------------

def wrong_no_residual_update(target_logits, proposal, params, generator):
    """WRONG: keep testing siblings against the original p after a rejection."""
    p = processed_probs(target_logits[0], params)
    for child in [i for i, par in enumerate(proposal.parents.tolist()) if par == -1]:
        x = int(proposal.tokens[child])
        q_x = 1.0 if proposal.q is None else float(proposal.q[child, x])
        if float(torch.rand((), generator=generator)) * q_x < float(p[x]):
            return Verification(1, 0, [child])
    return Verification(0, sample(residual(p, proposal.q[0] if proposal.q is not None else None, x), generator), [])


def first_tokens(rule, logits, q_root, params, children_mode, n_children, runs, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.shape[-1])
    parents = torch.full((n_children,), -1)
    top = torch.topk(q_root, n_children).indices
    for _ in range(runs):
        if children_mode == "sampled":
            tokens = torch.multinomial(q_root, n_children, replacement=True, generator=g)
            proposal = Proposal(tokens, q_root.expand(n_children, -1), parents)
        else:
            proposal = Proposal(top, None, parents)
        v = rule(logits, proposal, params, g)
        counts[int(proposal.tokens[v.path[0]]) if v.path else v.next_token] += 1
    return counts


def p_value(counts, probs):
    keep = probs > 0
    assert counts[~keep].sum() == 0
    expected = probs[keep].double() / probs[keep].double().sum() * counts.sum()
    return float(chisquare(counts[keep].double().numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("children_mode", ["sampled", "topk"])
@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)], ids=["t1.0", "t0.7-top_p0.9"]
)
def test_tree_verification_is_lossless(children_mode, params):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 10, generator=g) * 1.5
    q_root = processed_probs(logits[0] + torch.randn(10, generator=g), params)
    p_root = processed_probs(logits[0], params)
    runs = 12000
    right = first_tokens(verify_tree_sampled, logits, q_root, params, children_mode, 3, runs, seed=1)
    assert p_value(right, p_root) > 1e-3
    wrong = first_tokens(wrong_no_residual_update, logits, q_root, params, children_mode, 3, runs, seed=1)
    assert p_value(wrong, p_root) < 1e-6
