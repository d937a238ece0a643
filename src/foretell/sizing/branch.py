"""The branch policy: how much of the result cache's branch (result_cache.py) rides along with a pass that the
adaptive tree schedule (sizing/tree.py) sized."""

from __future__ import annotations

from dataclasses import dataclass

from foretell.sizing.chooser import best_of_prefixes


@dataclass
class BranchSizer:
    """How much of the branch a pass sized by the adaptive scheduler verifies (hardware-aware, lossless).

    The scheduler sizes the drafter's tree before the branch is merged in, so on a CPU where each extra row of a
    pass costs much (a steep cost curve) a full branch of max_branch tokens can cost more than it brings. The
    branch is taken as a chain whose every token is accepted with probability q, estimated from the branch
    tokens verified so far (decayed; a prior of one accepted and one rejected); of its prefixes, the one with
    the most expected tokens per second, by the scheduler's own cost curve and tree value, is kept. A scheduler
    probe keeps the whole branch, so q stays measured when the branch has been trimmed away."""

    decay: float = 0.9
    _accepted: float = 0.0  # decayed branch tokens accepted
    _stopped: float = 0.0  # decayed passes whose branch was cut short by a rejection

    @property
    def acceptance(self) -> float:
        return (self._accepted + 1.0) / (self._accepted + self._stopped + 2.0)

    def size(self, branch: int, tree_nodes: int, tree_tokens: float, verify_seconds, draft_seconds: float) -> int:
        """Branch tokens to keep: branch (its length), tree_nodes / tree_tokens (the tree's size and expected
        tokens), verify_seconds(tokens) (the scheduler's corrected cost curve), draft_seconds (already spent)."""
        q = self.acceptance
        # expected[k] = tree_tokens + the branch's k-token gain, summed apart from tree_tokens as before (not the
        # chooser's running sum from tree_tokens): the rates keep their last bit.
        expected, gain, reach = [tree_tokens], 0.0, 1.0
        for _ in range(branch):
            reach *= q
            gain += reach
            expected.append(tree_tokens + gain)
        return best_of_prefixes(expected, draft_seconds, lambda rows: verify_seconds(tree_nodes + rows)).n

    def record(self, offered: int, accepted: int) -> None:
        """One pass's branch: `offered` nodes only the branch proposed, `accepted` of them on the accepted path."""
        self._accepted = self.decay * self._accepted + accepted
        self._stopped = self.decay * self._stopped + (accepted < offered)
