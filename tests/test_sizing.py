"""Draft sizing (sizing/request.py): each request's decoding holds one sizer, made fresh for it, and consults nothing else
about sizes. A request sizes its drafts as it would alone: after other requests on the same engine, and beside
others in a batch; what the machine measured (cost corrections) carries over."""

from __future__ import annotations

import ast
import copy
import inspect
import math
from pathlib import Path

import pytest

import foretell.decoding
from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.batching import BatchEngine
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head
from foretell.sizing.chain import HardwareAwareLength
from foretell.sizing.chain import AdditiveLength, FixedLength, RejectionRateLength
from foretell.sizing.cost import CostCurve
from foretell.sizing.request import DraftSizer, RequestSizer
from foretell.sizing.tree import AdaptiveTreeScheduler, ScheduleLimits
from test_batching import submit

GREEDY = greedy_params()
FLAT = CostCurve([1, 8, 64], [0.010, 0.011, 0.030], context=256)
POLICIES = {
    "rejection-rate": lambda: RejectionRateLength(base=3, min_gamma=1, window=8),
    "additive": lambda: AdditiveLength(start=2, max_gamma=6),
    "hardware-aware": lambda: HardwareAwareLength(FLAT, draft_step_seconds=0.004, max_gamma=8),
}


def sizes(stats) -> tuple:
    """What a request's sizing decided, pass by pass in sum: drafts proposed and accepted by depth, passes."""
    return stats.proposed_per_position, stats.accepted_per_position, stats.target_passes


@pytest.fixture(scope="module")
def draft_model(tiny_pair):
    return load(tiny_pair[1], "none", warm_up=False).target.model


def chain_engine(plain, draft_model, policy):
    return plain.with_drafter(DraftModelDrafter(draft_model, 48), length_policy=policy).engine


# --- decoding.py consults its sizer, nothing else -------------------------------------------------------------


def test_decoding_consults_only_its_sizer_about_sizes():
    """No length policy, gate, scheduler or branch sizer is reached from decoding.py (no getattr either); what it
    asks its sizer is the DraftSizer protocol."""
    tree = ast.parse(Path(foretell.decoding.__file__).read_text())
    attributes = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    forbidden = {"length_policy", "draft_gate", "scheduler", "schedule", "history", "draft_budget", "sizes_itself",
                 "next_length", "growth_limits"}
    assert not forbidden & {a.attr for a in attributes}
    assert not {"getattr", "hasattr"} & {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    sizer = [a for a in attributes if a.attr == "sizer"]
    assert sizer and all(isinstance(a.value, ast.Name) and a.value.id == "self" for a in sizer)  # its own
    asked = {a.attr for a in attributes if isinstance(a.value, ast.Attribute) and a.value.attr == "sizer"}
    protocol = {name for name, _ in inspect.getmembers(DraftSizer, inspect.isfunction)}
    assert asked and asked <= protocol


def test_each_decoding_holds_a_sizer_of_its_own(plain, draft_model):
    engine = chain_engine(plain, draft_model, AdditiveLength(start=2))
    first, second = engine.start(PROMPTS[0], GREEDY), engine.start(PROMPTS[0], GREEDY)
    assert isinstance(first.sizer, RequestSizer)
    assert first.sizer is not second.sizer and first.sizer.length is not second.sizer.length
    assert first.sizer.length is not engine.length_policy  # the engine's is the configuration, a copy decodes
    assert plain.engine.start(PROMPTS[0], GREEDY).sizer.draft_tokens(room=10) == 0  # no drafter: no drafts


# --- a request sizes as it would alone ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_two_requests_in_sequence_size_as_each_alone(plain, draft_model, policy):
    make = POLICIES[policy]
    alone = [sizes(chain_engine(plain, draft_model, make()).generate(p, GREEDY).stats) for p in PROMPTS[:3]]
    engine = chain_engine(plain, draft_model, make())
    template = copy.deepcopy(engine.length_policy)
    in_sequence = [engine.generate(p, GREEDY) for p in PROMPTS[:3]]
    assert [sizes(r.stats) for r in in_sequence] == alone
    assert [r.tokens for r in in_sequence] == [plain.engine.generate(p, GREEDY).tokens for p in PROMPTS[:3]]
    assert engine.length_policy == template  # the configuration is never what learns


@pytest.mark.parametrize("policy", list(POLICIES))
def test_requests_in_one_batch_and_one_after_another_size_as_each_alone(plain, draft_model, policy):
    make = POLICIES[policy]
    prompts = PROMPTS[:3]
    alone = [sizes(chain_engine(plain, draft_model, make()).generate(p, GREEDY).stats) for p in prompts]
    batch = BatchEngine(plain.target.model, lambda: chain_engine(plain, draft_model, make()), max_batch=3)
    together = [submit(batch, p, GREEDY) for p in prompts]
    batch.run()
    assert [sizes(c.result.stats) for c in together] == alone
    shared = chain_engine(plain, draft_model, make())  # one engine, its requests one after another in the batch
    for prompt, want in zip(prompts, alone):
        collected = submit(batch, prompt, GREEDY, shared)
        batch.run()
        assert sizes(collected.result.stats) == want


def test_a_fixed_length_sizes_every_pass_the_same(plain, draft_model):
    engine = chain_engine(plain, draft_model, FixedLength(3))
    sizer = engine.start(PROMPTS[0], GREEDY).sizer
    assert [sizer.draft_tokens(room) for room in (10, 4, 3, 1)] == [3, 3, 2, 0]  # never past the token limit
    assert sizer.draft_tokens(10, limit=1) == 1  # a batch's cap


# --- the tree schedule: the text's estimates fresh, the machine's kept -------------------------------------------


def chain_tree(length: int, p: float = 0.8) -> tuple[list[float], list[int]]:
    """Scores and parents of a chain whose every node has conditional probability p."""
    return [math.log(p) * (i + 1) for i in range(length)], [i - 1 for i in range(length)]


def test_a_fresh_schedule_chooses_as_a_new_scheduler_with_the_same_cost_corrections():
    sched = AdaptiveTreeScheduler(FLAT, ScheduleLimits(max_nodes=16, probe_every=3))
    scores, parents = chain_tree(12)
    for _ in range(4):  # rejections at the first node, and passes slower than the curve
        n = sched.choose(scores, parents, 0.002)
        sched.record(parents[:n], scores[:n], accepted_depth=0, verify_seconds=0.03)
    fresh = sched.fresh()
    new = AdaptiveTreeScheduler(FLAT, ScheduleLimits(max_nodes=16, probe_every=3))
    new.cost.correction.update(sched.cost.correction)
    assert fresh.history == [] and fresh.last_choice is None and fresh.calibration(1) == 1.0
    assert fresh.growth_limits() == new.growth_limits() == (16, 8)
    picks = [fresh.choose(scores, parents, 0.002) for _ in range(4)]
    assert picks == [new.choose(scores, parents, 0.002) for _ in range(4)]
    assert sched.history[4:] == fresh.history  # the configured scheduler logs every request's choices
    fresh.record(parents[:2], scores[:2], accepted_depth=2, verify_seconds=0.05)
    assert fresh.cost is sched.cost and sched.cost.correction  # what the machine costs is shared


def test_each_request_grows_its_trees_by_a_fresh_schedule(plain):
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=3))
    sched = AdaptiveTreeScheduler(FLAT, ScheduleLimits(max_nodes=12, probe_every=4))
    engine = plain.with_drafter(ParallelHeadDrafter(head, scheduler=sched)).engine
    assert engine.generate(PROMPTS[0], GREEDY).tokens == plain.engine.generate(PROMPTS[0], GREEDY).tokens
    first = engine.drafter.schedule
    assert first.history and sched.history == first.history and first.cost.correction  # logged, and timings measured
    state = engine.start(PROMPTS[2], GREEDY)
    schedule = state.sizer.tree
    assert schedule is engine.drafter.schedule and schedule is not first and schedule is not sched
    assert schedule.history == [] and schedule.calibration(1) == 1.0 and schedule.growth_limits() == (12, 8)
    assert schedule.cost is sched.cost  # the machine's timings carried over
