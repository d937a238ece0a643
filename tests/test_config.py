"""The typed speculative configuration: JSON round trip, every invalid combination refused before any model
loads (naming the option and what to do), the CLI flags that map onto it, and the declared drafter protocol."""

from __future__ import annotations

import ast
import inspect
import json
from argparse import Namespace
from dataclasses import fields, replace
from pathlib import Path

import pytest

from foretell.api import load
from foretell.config import (APPLIES_TO, METHODS, WEIGHTED_METHODS, EagleTreeShape, HeadTreeShape, HiddenStateOptions,
                             SpeculativeConfig, TreeShape, as_speculative)
from foretell.errors import ForetellError

# One configuration per method, each with every option its method takes set away from the default.
FULL = {
    "none": SpeculativeConfig(method="none"),
    "prompt-lookup": SpeculativeConfig(gamma=6, length_policy="additive", lookup_max=4, lookup_min=2,
                                       corpus="smollm2-135m-answers"),
    "draft-model": SpeculativeConfig(method="draft-model", model="d", gamma=5, length_policy="rejection-rate",
                                     hot_vocab=64, draft_quant="int8", lossy_threshold=0.9),
    "draft-tree": SpeculativeConfig(method="draft-tree", model="d", tree=TreeShape(kind="static", branching=(2, 2),
                                    children="sampled"), hot_vocab=32, draft_quant="none", budget="auto",
                                    result_cache="outputs", draft_gate=True, lossy_threshold=0.5),
    "parallel-head": SpeculativeConfig(method="parallel-head", model="h", head_tree=HeadTreeShape(8, 3, 2),
                                       hot_vocab=128, result_cache="prompt", lossy_threshold=1.0),
    "hidden-state": SpeculativeConfig(method="hidden-state", model="x", hidden=HiddenStateOptions(
        depth=4, token_info=False, resample_when="always"), hot_vocab=8192, draft_quant="int8", budget="auto",
        result_cache="prompt", draft_gate=True),
    "eagle3": SpeculativeConfig(method="eagle3", model="e", eagle_tree=EagleTreeShape(depth=3, width=2, max_nodes=9),
                                result_cache="outputs", draft_gate=True, lossy_threshold=0.7),
}
# A value away from the default for every option, to set where it does not belong.
OFF_DEFAULT = {"model": "m", "gamma": 7, "length_policy": "additive", "lookup_max": 5, "lookup_min": 2,
               "tree": TreeShape(depth=3), "head_tree": HeadTreeShape(max_nodes=4), "hidden": HiddenStateOptions(width=2),
               "eagle_tree": EagleTreeShape(width=2),
               "hot_vocab": 10, "draft_quant": "int8", "budget": "auto", "result_cache": "prompt", "draft_gate": True,
               "lossy_threshold": 0.8, "corpus": "c.npz"}


@pytest.mark.parametrize("method", METHODS)
def test_json_round_trip(method, tmp_path):
    spec = FULL[method]
    assert SpeculativeConfig.from_json(spec.to_json()) == spec
    assert SpeculativeConfig.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert SpeculativeConfig.from_file(spec.save(tmp_path / "spec.json")) == spec
    assert as_speculative(spec.to_dict()) == spec
    assert set(spec.to_dict()) == {"method"} | {f.name for f in fields(spec) if spec._is_set(f.name)}


def test_every_method_sets_every_option_it_takes():
    """FULL above really exercises each option: a changed option the table allows is accepted."""
    for option, (methods, _) in APPLIES_TO.items():
        assert any(FULL[m]._is_set(option) for m in methods), option


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("option", list(APPLIES_TO))
def test_an_option_for_another_method_is_refused(method, option):
    methods, flag = APPLIES_TO[option]
    if method in methods:
        return
    base = {"model": "m"} if method in WEIGHTED_METHODS else {}
    with pytest.raises(ForetellError, match=f"^{option} .*applies to the .* not {method}: remove it") as e:
        SpeculativeConfig(method=method, **{**base, option: OFF_DEFAULT[option]})
    assert flag.split()[0] in str(e.value)  # names the CLI flag too


@pytest.mark.parametrize("changes, message", [
    ({"method": "eagle"}, "unknown speculative method 'eagle'; use one of none, prompt-lookup"),
    ({"method": "draft-model"}, "draft-model method needs model: a draft model"),
    ({"gamma": 0}, "gamma .* between 1 and 16"),
    ({"gamma": 17}, "between 1 and 16"),
    ({"gamma": "4"}, "gamma must be an integer, got '4'"),
    ({"gamma": 4.0}, "gamma must be an integer"),
    ({"length_policy": "doubling"}, "length_policy must be one of fixed, rejection-rate, additive"),
    ({"lookup_max": 1, "lookup_min": 2}, "1 <= lookup_min <= lookup_max"),
    ({"method": "draft-model", "model": "d", "hot_vocab": -1}, "hot_vocab must be >= 0"),
    ({"method": "draft-model", "model": "d", "hot_vocab": True}, "hot_vocab must be an integer"),
    ({"method": "draft-model", "model": "d", "draft_quant": "int3"}, "draft_quant must be one of auto, int8, int4, none"),
    ({"method": "draft-model", "model": "d", "budget": "max"}, "budget must be fixed or auto"),
    ({"method": "draft-tree", "model": "d", "result_cache": "everything"}, "result_cache must be outputs, prompt or null"),
    ({"method": "draft-tree", "model": "d", "draft_gate": 1}, "draft_gate must be true or false"),
    ({"method": "draft-model", "model": "d", "lossy_threshold": 0.0}, r"lossy_threshold must be in \(0, 1\]"),
    ({"method": "draft-model", "model": "d", "lossy_threshold": 1.5}, r"in \(0, 1\] \(LOSSY\)"),
    ({"method": "draft-model", "model": "d", "length_policy": "additive", "budget": "auto"},
     "length_policy additive and budget auto both set the draft length: keep one"),
    ({"method": "parallel-head", "model": "h", "head_tree": HeadTreeShape(), "budget": "auto"},
     "head_tree fixes .* budget auto picks it each pass: keep one"),
    ({"method": "hidden-state", "model": "x", "hidden": HiddenStateOptions(max_nodes=8), "budget": "auto"},
     "hidden.max_nodes fixes"),
    ({"method": "draft-model", "model": 3}, "model must be a string or null"),
])
def test_invalid_values_and_combinations(changes, message):
    with pytest.raises(ForetellError, match=message):
        SpeculativeConfig(**changes)


@pytest.mark.parametrize("data, message", [
    ({"method": "prompt-lookup", "gama": 3}, "unknown option.s. gama; known: "),
    ({"method": "draft-tree", "model": "d", "tree": {"depht": 3}}, "tree: unknown option.s. depht"),
    ({"method": "draft-tree", "model": "d", "tree": {"depth": "3"}}, "tree: depth must be an integer"),
    ({"method": "draft-tree", "model": "d", "tree": {"kind": "static", "branching": [2, 0]}}, "branching must be positive"),
    ({"method": "hidden-state", "model": "x", "hidden": {"resample_when": "never"}}, "resample_when must be one of"),
    ({"method": "parallel-head", "model": "h", "head_tree": {"width": 0}}, "must be >= 1"),
    ([1, 2], "must be a JSON object, got list"),
])
def test_bad_json_is_named(data, message):
    with pytest.raises(ForetellError, match=message):
        SpeculativeConfig.from_dict(data)


def test_file_errors(tmp_path):
    with pytest.raises(ForetellError, match="no speculative config file .*missing.json"):
        SpeculativeConfig.from_file(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"method": "prompt-lookup",')
    with pytest.raises(ForetellError, match="broken.json is not valid JSON"):
        SpeculativeConfig.from_file(broken)
    with pytest.raises(ForetellError, match="is not a method"):
        as_speculative("fast")


def test_invalid_configuration_fails_before_any_model_loads(tmp_path):
    """The target does not exist: the configuration's error comes first, so nothing was loaded."""
    with pytest.raises(ForetellError, match="gamma"):
        load(tmp_path / "no-model", {"method": "parallel-head", "model": "h", "gamma": 3})
    with pytest.raises(ForetellError, match="no model"):  # a valid configuration gets as far as the target
        load(tmp_path / "no-model", {"method": "prompt-lookup", "gamma": 3})


def test_with_tree_shapes_whichever_tree_the_method_grows():
    with pytest.raises(ForetellError, match="hidden.max_nodes fixes"):  # budget auto sizes the tree itself
        FULL["hidden-state"].with_tree(nodes=12)
    spec = SpeculativeConfig(method="draft-tree", model="d").with_tree(depth=3, width=2, nodes=9)
    assert (spec.tree.depth, spec.tree.top_k, spec.tree.total_tokens) == (3, 2, 9)
    spec = SpeculativeConfig(method="hidden-state", model="x").with_tree(width=2, nodes=9)
    assert (spec.hidden.depth, spec.hidden.width, spec.hidden.max_nodes) == (5, 2, 9)
    spec = SpeculativeConfig(method="parallel-head", model="h").with_tree(nodes=9, head_depth=3)
    assert spec.head_tree == HeadTreeShape(max_nodes=9, depth=3, width=3)
    with pytest.raises(ForetellError, match="shape a tree drafter's tree"):
        SpeculativeConfig().with_tree(depth=3)
    with pytest.raises(ForetellError, match="static draft tree is shaped by --branching"):
        replace(FULL["draft-tree"]).with_tree(depth=3)


def flags(**given) -> Namespace:
    """The generate parser's speculation flags, all unset, then `given`."""
    from foretell.cli import build_parser

    args = build_parser().parse_args(["generate", "p"])
    return Namespace(**{**vars(args), **given})


def test_flags_map_onto_the_configuration(tmp_path):
    from foretell.spec_args import speculative_from_args

    spec, why = speculative_from_args(flags(), "nowhere", tmp_path)
    # no flag: the target's default (without a trained drafter, prompt lookup on n-grams of 2 or more)
    assert spec == SpeculativeConfig(lookup_min=2) and "no trained drafter" in why
    assert speculative_from_args(flags(gamma=6), "t")[0] == SpeculativeConfig(gamma=6)
    spec = speculative_from_args(flags(draft="d", budget="auto", hot_vocab=64), "t")[0]
    assert spec == SpeculativeConfig(method="draft-model", model="d", budget="auto", hot_vocab=64)
    spec = speculative_from_args(flags(drafter="draft-tree", draft="d", tree_kind="static", branching="2,2"), "t")[0]
    assert spec.tree == TreeShape(kind="static", branching=(2, 2))
    spec = speculative_from_args(flags(hidden_draft="x", tree_budget=12, result_cache="prompt"), "t")[0]
    assert spec == SpeculativeConfig(method="hidden-state", model="x", hidden=HiddenStateOptions(max_nodes=12),
                                     result_cache="prompt")
    # A file, then flags over it.
    path = FULL["draft-tree"].save(tmp_path / "tree.json")
    spec = speculative_from_args(flags(spec_config=str(path), lossy_threshold=0.7), "t")[0]
    assert spec == replace(FULL["draft-tree"], lossy_threshold=0.7)
    for bad, message in [(dict(head="h", gamma=3), "gamma .--gamma. applies to the draft-model, prompt-lookup"),
                         (dict(drafter="parallel-head", draft="d"), "--draft gives weights for draft-model, draft-tree"),
                         (dict(draft="d", head="h"), "give one"),
                         (dict(gamma=4, tree_budget=3), "shape a tree drafter's tree"),
                         (dict(draft="d", branching="2,x", drafter="draft-tree", tree_kind="static"), "comma-separated"),
                         (dict(budget="auto"), "budget .--budget. applies to")]:
        with pytest.raises(ForetellError, match=message):
            speculative_from_args(flags(**bad), "t")


# --- the drafter protocol ----------------------------------------------------------------------


def test_the_engine_reads_declared_capabilities_only():
    """No getattr / hasattr probing in the engine: what it needs of a drafter is in the Drafter protocol."""
    import foretell.engine

    tree = ast.parse(Path(inspect.getfile(foretell.engine)).read_text())
    probes = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr")]
    assert probes == []


def test_every_drafter_declares_the_protocol():
    from foretell.drafters.base import Drafter, DrafterBase
    from foretell.drafters.draft_model import DraftModelDrafter
    from foretell.drafters.draft_tree import DraftTreeDrafter
    from foretell.drafters.eagle_tree import Eagle3Drafter
    from foretell.drafters.hidden_tree import HiddenStateDrafter
    from foretell.drafters.parallel_tree import ParallelHeadDrafter
    from foretell.drafters.prompt_lookup import PromptLookupDrafter

    members = {name for name in vars(Drafter) if not name.startswith("_")} | set(Drafter.__annotations__)
    for cls in (PromptLookupDrafter, DraftModelDrafter, DraftTreeDrafter, ParallelHeadDrafter, HiddenStateDrafter,
                Eagle3Drafter):
        assert issubclass(cls, DrafterBase)
        assert all(hasattr(cls, m) for m in members), cls
    tree_drafters = (DraftTreeDrafter, ParallelHeadDrafter, HiddenStateDrafter, Eagle3Drafter)
    assert all(c.sizes_itself for c in tree_drafters) and not DraftModelDrafter.sizes_itself
    assert not PromptLookupDrafter.sizes_itself and PromptLookupDrafter.target_layers == ()
