"""Losslessness of chain speculative sampling and of the coupled rule, tested statistically.

Two levels: the verifier alone on synthetic p and q (many samples, cheap), and the whole
engine on a tiny model, whose exact output distribution is computed by enumeration. Each
test also runs a deliberately wrong rule and requires the same test to reject it, so the
sample size is shown to be large enough to catch a bias.
"""

import pytest
import torch
from scipy.stats import chisquare

from foretell.coupled import Coupling, GumbelNoise, draft_ranking
from foretell.sampling import processed_probs, sample
from foretell.types import Proposal, SamplingParams, Verification
from foretell.verify import verify, verify_sampled


def no_residual_rule(target_logits, proposal, params, generator, coupling=None):
    """WRONG: on rejection, resample from p instead of norm(max(0, p - q))."""
    p = processed_probs(target_logits, params)
    for i, x in enumerate(proposal.tokens.tolist()):
        q_x = 1.0 if proposal.q is None else float(proposal.q[i, x])
        if float(torch.rand(1, generator=generator)) * q_x >= float(p[i, x]):
            return Verification(i, sample(p[i], generator))
    return Verification(proposal.size, sample(p[proposal.size], generator))


def accept_if_argmax_rule(target_logits, proposal, params, generator, coupling=None):
    """WRONG: accept a draft when it equals the target's most likely token."""
    p = processed_probs(target_logits, params)
    best = p.argmax(-1).tolist()
    for i, x in enumerate(proposal.tokens.tolist()):
        if x != best[i]:
            return Verification(i, sample(p[i], generator))
    return Verification(proposal.size, sample(p[proposal.size], generator))


def first_token_counts(rule, p_logits, q_probs, params, n_samples, seed, deterministic=False):
    """Draft one token from q, verify it, count which token the step emits first."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p_logits.shape[-1])
    for _ in range(n_samples):
        x = sample(q_probs, g)
        proposal = Proposal(torch.tensor([x]), None if deterministic else q_probs[None])
        v = rule(p_logits, proposal, params, g)
        counts[x if v.accepted else v.next_token] += 1
    return counts


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives zero probability"
    expected = probs[keep].double() / probs[keep].double().sum() * counts.sum()
    return float(chisquare(counts[keep].double().numpy(), expected.numpy()).pvalue)


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)]


@pytest.mark.parametrize("params", PARAMS, ids=["t1.0", "t0.7-top_p0.9"])
def test_verifier_first_token_follows_target(params):
    g = torch.Generator().manual_seed(0)
    target_logits = torch.randn(2, 8, generator=g) * 1.5
    draft_logits = target_logits[0] + torch.randn(8, generator=g)  # a draft close to the target, as in practice
    q = processed_probs(draft_logits, params)
    p = processed_probs(target_logits[0], params)
    n = 20000
    assert p_value(first_token_counts(verify_sampled, target_logits, q, params, n, seed=1), p) > 1e-3
    for wrong in (no_residual_rule, accept_if_argmax_rule):
        assert p_value(first_token_counts(wrong, target_logits, q, params, n, seed=1), p) < 1e-6, wrong.__name__


def test_verifier_with_deterministic_draft_follows_target():
    """Prompt lookup proposes tokens with q one-hot: acceptance p(x), residual p without x."""
    params = SamplingParams(temperature=1.0)
    target_logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(2))
    p = processed_probs(target_logits[0], params)
    q = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # always proposes token 1
    counts = first_token_counts(verify_sampled, target_logits, q, params, 20000, seed=3, deterministic=True)
    assert p_value(counts, p) > 1e-3
    wrong = first_token_counts(no_residual_rule, target_logits, q, params, 20000, seed=3, deterministic=True)
    assert p_value(wrong, p) < 1e-6


# --- the coupled rule (coupled.py) ------------------------------------------------------------


def accept_if_argmax_coupled(target_logits, proposal, params, generator, coupling):
    """WRONG: under the coupled rule, also accept a draft that is the target's most likely token (chains)."""
    p = processed_probs(target_logits, params)
    for i, x in enumerate(proposal.tokens.tolist()):
        want = coupling.token(target_logits[i], params, i)
        if x != want and x != int(p[i].argmax()):
            return Verification(i, want)
    return Verification(proposal.size, coupling.token(target_logits[proposal.size], params, proposal.size))


def coupled_first_token_counts(rule, p_logits, q_logits, params, n_samples, children=1, coupled_drafts=True):
    """One seed per sample: draft `children` tokens below the root (a chain of one, or sibling nodes), either
    ranked with the verifier's noise or sampled from q independently of it; count the first emitted token."""
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(p_logits.shape[-1])
    for seed in range(n_samples):
        coupling = Coupling(GumbelNoise(seed, origin=0, vocab_size=p_logits.shape[-1]), 0)
        if coupled_drafts:
            picks = draft_ranking(q_logits, params, coupling.noise, 0).topk(children).indices.tolist()
        else:
            picks = torch.multinomial(processed_probs(q_logits, params), children, generator=g).tolist()
        parents = None if children == 1 else torch.full((children,), -1)
        proposal = Proposal(torch.tensor(picks), parents=parents)
        v = rule(p_logits[: children + 1], proposal, params, None, coupling)
        first = proposal.tokens[v.path[0] if v.path else 0] if v.accepted else v.next_token
        counts[int(first)] += 1
    return counts


@pytest.mark.parametrize("params", PARAMS, ids=["t1.0", "t0.7-top_p0.9"])
@pytest.mark.parametrize("children, coupled_drafts", [(1, True), (1, False), (3, True)],
                         ids=["chain", "chain-free", "tree"])
def test_coupled_verifier_first_token_follows_target(params, children, coupled_drafts):
    """Whatever the drafts (ranked with the noise or not; one or sibling nodes), the first emitted token follows p,
    and drafts ranked with the noise are accepted more often than independent ones."""
    g = torch.Generator().manual_seed(0)
    target_logits = torch.randn(4, 8, generator=g) * 1.5
    draft_logits = target_logits[0] + torch.randn(8, generator=g)
    p = processed_probs(target_logits[0], params)
    n = 10000
    counts = coupled_first_token_counts(verify, target_logits, draft_logits, params, n, children, coupled_drafts)
    assert p_value(counts, p) > 1e-3
    if children == 1 and not coupled_drafts:
        wrong = coupled_first_token_counts(accept_if_argmax_coupled, target_logits, draft_logits, params, n, 1, False)
        assert p_value(wrong, p) < 1e-6


def test_coupled_drafts_are_accepted_more_often():
    """With q close to p, ranking with the verifier's noise drafts the target's token more often than sampling q."""
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(1)
    p_logits = torch.randn(2, 50, generator=g) * 2
    q_logits = p_logits[0] + 0.3 * torch.randn(50, generator=g)

    def accepted(coupled_drafts: bool) -> float:
        hits = 0
        for seed in range(2000):
            coupling = Coupling(GumbelNoise(seed, origin=0, vocab_size=p_logits.shape[-1]), 0)
            if coupled_drafts:
                x = int(draft_ranking(q_logits, params, coupling.noise, 0).argmax())
            else:
                x = int(torch.multinomial(processed_probs(q_logits, params), 1, generator=g))
            hits += verify(p_logits, Proposal(torch.tensor([x])), params, None, coupling).accepted
        return hits / 2000

    assert accepted(True) > accepted(False) + 0.2
