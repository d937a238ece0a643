"""Training drafters for a target, one subpackage per seed family, with what they share.

common/          shared by every family: data, training loops, caches, checkpointed run folders, the shared options
adaspec/         AdaSPEC: a small draft model distilled on the tokens it can learn (`foretell train adaspec`)
parallel_head/   a parallel draft head: D tokens per forward from the target's hidden states (`train parallel-head`)
hidden_state/    a hidden-state draft: one layer autoregressing on the target's hidden states (`train hidden-state`)
"""
