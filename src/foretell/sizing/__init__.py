"""The sizing model: how much each pass drafts, in one place.

    cost.py     what a target pass costs on this machine by verified rows (measured once, cached), and that curve
                corrected online by the verification times decoding reports (CorrectedCost)
    chooser.py  the one chooser: the best prefix of node values given draft and verify seconds
    chain.py    a chain drafter's length policies (fixed, rejection-rate, additive, hardware-aware)
    tree.py     the adaptive tree schedule (budget, depth, width of each tree) and a draft tree's level budget
    gate.py     whether the drafter runs at all this pass
    branch.py   how much of the result cache's branch rides along
    batch.py    a batched pass's draft budget across its requests
    request.py  each request's sizer: the one object decoding asks

A policy gives its candidate nodes values and calls the chooser; a new policy is one file here. Sizing picks which
drafts the target verifies, never how it verifies them: output is lossless whatever it says.
"""
