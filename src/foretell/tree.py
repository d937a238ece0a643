"""Token trees as plain data, and the pure functions that lay one out for a single target pass.

A tree hangs below the *root*: the last committed token, which is not yet in the target's
cache. Nodes are numbered 0..N-1 in topological order (a parent's index is smaller than its
children's); `parents[i] == -1` means node i is a child of the root. The target pass feeds
N + 1 tokens: slot 0 is the root, slot i + 1 is node i. A chain is the tree with
parents [-1, 0, 1, ...].
"""

from __future__ import annotations

import torch


def chain_parents(n: int) -> torch.Tensor:
    return torch.arange(-1, n - 1, dtype=torch.long)


def check_parents(parents: torch.Tensor) -> None:
    idx = torch.arange(len(parents))
    if len(parents) and bool(((parents >= idx) | (parents < -1)).any()):
        raise ValueError(f"parents must point to an earlier node or -1 (the root): {parents.tolist()}")


def depths(parents: torch.Tensor) -> torch.Tensor:
    """[N] depth of each node; children of the root have depth 1."""
    d = torch.zeros(len(parents), dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        d[i] = 1 if p < 0 else d[p] + 1
    return d


def slot_positions(parents: torch.Tensor, root_position: int) -> torch.Tensor:
    """[N + 1] position ids of the slots: the root at root_position, a node at root + depth."""
    return torch.cat([torch.zeros(1, dtype=torch.long), depths(parents)]) + root_position


def attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """[N + 1, N + 1] bool: slot i may attend to slot j iff j is i itself or an ancestor of i."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True  # every slot sees the root
    mask[0, 0] = True
    for i, p in enumerate(parents.tolist()):
        mask[i + 1] = mask[p + 1]  # inherit the parent's ancestors (p = -1 -> the root's row)
        mask[i + 1, i + 1] = True
    return mask


def children_lists(parents: torch.Tensor) -> list[list[int]]:
    """children[0] = the root's children, children[i + 1] = node i's children, in index order."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents.tolist()):
        children[p + 1].append(i)
    return children


def path_to(node: int, parents: torch.Tensor | list[int]) -> list[int]:
    """Nodes from the root's child down to `node` (inclusive); [] for the root (-1)."""
    path = []
    while node != -1:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def retrieve_indices(parents: torch.Tensor) -> torch.Tensor:
    """[num_leaves, max_depth + 1] slot indices of each root-to-leaf path, padded with -1.

    Column 0 is the root slot. Row r picks path r's rows out of the verified logits.
    """
    n = len(parents)
    has_child = torch.zeros(n, dtype=torch.bool)
    for p in parents.tolist():
        if p >= 0:
            has_child[p] = True
    leaves = [i for i in range(n) if not has_child[i]]
    if not leaves:
        return torch.zeros(1, 1, dtype=torch.long)
    paths = [[0] + [s + 1 for s in path_to(leaf, parents)] for leaf in leaves]
    width = max(len(p) for p in paths)
    return torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)


def accepted_slots(path: list[int]) -> torch.Tensor:
    """Slots to keep in the cache after accepting `path`: the root and the path's nodes."""
    return torch.tensor([0] + [i + 1 for i in path], dtype=torch.long)
