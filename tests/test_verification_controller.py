"""The verification controller (lossy.py): lossless by default, the seed's LOSSY shortcut opt-in;
the monitoring metrics; the lossy bench table (GSM8K accuracy, agreement with plain)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.config import HeadTreeShape, SpeculativeConfig
from foretell.bench.lossy_table import final_number, lossy_rows, prefix_agreement
from foretell.cli import main
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.errors import ForetellError
from foretell.lossy import check_lossy_threshold, confident_path, verify_controlled
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
from foretell.types import GenerationStats, Proposal, SamplingParams

GREEDY = SamplingParams()


def head_engine(plain, **extras):
    target = plain.engine.target
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3)
    return replace(plain.with_drafter(ParallelHeadDrafter(head, HeadTreeShape())).engine, **extras)


def logits_for(best: list[int], vocab: int = 8) -> torch.Tensor:
    """Target logits whose argmax row by row is `best`."""
    out = torch.zeros(len(best), vocab)
    out[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return out


# --- the controller on hand-made proposals ----------------------------------------------------


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, 2, float("nan"), "0.9", True])
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(ForetellError, match=r"lossy_threshold must be a number in \(0, 1\]"):
        check_lossy_threshold(bad)
    assert check_lossy_threshold(None) is None and check_lossy_threshold(1) == 1.0


def test_chain_waives_the_confident_prefix_then_verifies():
    # Path probabilities 0.9, 0.81, 0.405: above 0.8 only for the first two drafts.
    chain = Proposal(torch.tensor([1, 2, 3]), draft_prob=torch.tensor([0.9, 0.9, 0.5]))
    assert confident_path(chain, 0.8) == [0, 1]
    target = logits_for([7, 7, 3, 4])  # the target rejects drafts 1 and 2 but agrees with draft 3
    lossless = verify_controlled(target, chain, GREEDY, None, None)
    assert (lossless.accepted, lossless.next_token, lossless.waived) == (0, 7, 0)
    lossy = verify_controlled(target, chain, GREEDY, None, 0.8)
    assert (lossy.accepted, lossy.next_token, lossy.waived) == (3, 4, 2)  # bonus token from the last row
    assert verify_controlled(target, chain, GREEDY, None, 1.0) == lossless  # nothing exceeds 1


def test_tree_waives_the_most_confident_path_and_verifies_its_subtree():
    #        root
    #   0 (a=1, 0.95)        1 (b=2, 0.05)
    #   2 (c=3, 0.6)  3 (d=4, 0.3)
    #   4 (e=5, 1.0) under 3
    tree = Proposal(torch.tensor([1, 2, 3, 4, 5]), parents=torch.tensor([-1, -1, 0, 0, 3]),
                    draft_prob=torch.tensor([0.95, 0.05, 0.6, 0.3, 1.0]))
    assert confident_path(tree, 0.5) == [0, 2]  # 0.95, then 0.57; node 3 (0.285) is not confident
    assert confident_path(tree, 0.9) == [0]
    # slots: root, n0..n4. The target wants b at the root, then d after a, then e after d.
    target = logits_for([2, 4, 0, 7, 5, 6])
    assert verify_controlled(target, tree, GREEDY, None, None).path == [1]
    lossy = verify_controlled(target, tree, GREEDY, None, 0.9)  # waive a, then verify a's subtree: d, e
    assert (lossy.path, lossy.accepted, lossy.next_token, lossy.waived) == ([0, 3, 4], 3, 6, 1)
    deep = verify_controlled(target, tree, GREEDY, None, 0.5)  # waive a and c; c is a leaf: target's token
    assert (deep.path, deep.next_token, deep.waived) == ([0, 2], 7, 2)


def test_sampled_lossy_runs_and_waives(plain):
    engine = head_engine(plain, lossy_threshold=1e-6)
    result = engine.generate(PROMPTS[0], SamplingParams(temperature=1.0, seed=1, max_new_tokens=20, ignore_eos=True))
    assert result.stats.lossy_accepted > 0 and len(result.tokens) == 20


# --- through the engine -----------------------------------------------------------------------


def test_default_and_threshold_one_equal_plain(plain):
    default, one = head_engine(plain), head_engine(plain, lossy_threshold=1.0)
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, greedy_params()).tokens
        assert default.generate(prompt, greedy_params()).tokens == want
        result = one.generate(prompt, greedy_params())
        assert result.tokens == want and result.stats.lossy_accepted == 0
        assert result.stats.summary().startswith("LOSSY (threshold 1")
    assert default.generate(PROMPTS[0], greedy_params()).stats.to_dict()["lossy_threshold"] is None
    assert not default.generate(PROMPTS[0], greedy_params()).stats.summary().startswith("LOSSY")


def test_low_threshold_accepts_unverified_tokens_and_says_so(plain):
    engine = head_engine(plain, lossy_threshold=1e-6)  # every drafted path is "confident"
    result = engine.generate(PROMPTS[2], greedy_params())
    stats = result.stats
    assert stats.lossy_accepted > 0 and stats.lossy_accepted <= sum(stats.accepted_per_position)
    assert stats.to_dict()["lossy_threshold"] == 1e-6 and stats.to_dict()["lossy_accepted"] == stats.lossy_accepted
    assert stats.summary().startswith("LOSSY") and "without target check" in stats.summary()
    assert stats.tau > head_engine(plain).generate(PROMPTS[2], greedy_params()).stats.tau


def test_chain_and_tree_draft_models_provide_draft_probabilities(tiny_pair):
    for drafter in ("draft-model", "draft-tree"):
        pipe = load(tiny_pair[0], SpeculativeConfig(method=drafter, model=str(tiny_pair[1]), lossy_threshold=0.5, draft_quant="none"), dtype="float32", warm_up=False)
        for params in (greedy_params(20), SamplingParams(temperature=1.0, seed=0, max_new_tokens=20, ignore_eos=True)):
            assert pipe.engine.generate(PROMPTS[0], params).stats.lossy_threshold == 0.5


def test_verification_is_the_engines_strategy(plain):
    """Lossless `verify` by default, lossy.py's strategy with a threshold; decoding.py verifies through the engine's
    verifier and nothing else."""
    import ast
    from pathlib import Path

    import foretell.decoding
    from foretell.lossy import LossyVerifier
    from foretell.verify import LOSSLESS

    assert plain.engine.verifier is LOSSLESS and LOSSLESS.threshold is None
    assert head_engine(plain, lossy_threshold=0.5).verifier == LossyVerifier(0.5)
    tree = ast.parse(Path(foretell.decoding.__file__).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "verifier" in names and not {"verify", "verify_controlled", "judge", "lossy_threshold"} & names


def test_errors_name_the_problem(plain, tiny_pair):
    with pytest.raises(ForetellError, match="lossy_threshold .* not prompt-lookup"):
        load(tiny_pair[0], SpeculativeConfig(method="prompt-lookup", lossy_threshold=0.9), warm_up=False)
    with pytest.raises(ForetellError, match=r"in \(0, 1\]"):
        load(tiny_pair[0], SpeculativeConfig(method="draft-model", model=str(tiny_pair[1]), lossy_threshold=1.5),
             warm_up=False)
    engine = replace(plain.with_drafter(PromptLookupDrafter()).engine, lossy_threshold=0.9)
    with pytest.raises(ForetellError, match="the prompt-lookup drafter does not provide"):
        engine.generate([1, 5, 9, 5, 9, 5, 9, 5], greedy_params(10))


# --- monitoring metrics -----------------------------------------------------------------------


def test_monitoring_metrics_by_hand():
    # 4 passes with drafts (3 accepted something), 1 without; 12 draft tokens verified, 5 accepted.
    s = GenerationStats(target_passes=5, draft_passes=4, passes_with_accepted=3, draft_tokens_verified=12)
    for proposed, accepted in [(3, 2), (3, 0), (3, 1), (3, 2)]:
        s.record(proposed, accepted)
    assert s.verification_pass_rate == 0.75
    assert s.accepted_per_verified == pytest.approx(5 / 12)
    assert s.wasted_share == pytest.approx(7 / 12)
    d = s.to_dict()
    assert d["verification_pass_rate"] == 0.75 and d["wasted_share"] == round(7 / 12, 4)
    assert "pass rate 0.75 (0.42 per draft token), wasted 0.58" in s.summary()
    assert GenerationStats().wasted_share == 0.0 and "pass rate" not in GenerationStats().summary()


def test_monitoring_metrics_from_the_engine(plain):
    stats = head_engine(plain).generate(PROMPTS[2], greedy_params()).stats
    accepted = sum(stats.accepted_per_position)
    assert stats.draft_passes <= stats.target_passes and stats.passes_with_accepted <= stats.draft_passes
    assert stats.accepted_per_verified * stats.draft_tokens_verified == pytest.approx(accepted)
    assert stats.draft_passes == sum(stats.proposed_per_position[:1])  # every pass with drafts proposes depth >= 1


# --- the lossy table --------------------------------------------------------------------------


def test_final_number_and_agreement():
    assert final_number("so 9 * 2 = $18.\n#### 1,800") == "1800"
    assert final_number("The answer is 18.00 dollars") == "18"
    assert final_number("no numbers") is None
    assert final_number("she pays -3 then 42") == "42"
    assert prefix_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert prefix_agreement([1, 2], [1, 2]) == 1.0


def test_lossy_rows_by_hand():
    base = dict(dataset="gsm8k", category="gsm8k", seconds=1.0, new_tokens=4, draft_passes=1)
    rows = [
        dict(base, id=0, method="plain", tokens=[1, 2, 3, 4]),
        dict(base, id=0, method="parallel-head-lossy-0.9", tokens=[1, 2, 5, 6], seconds=0.5, lossy_accepted=2),
        dict(base, id=1, method="plain", tokens=[7, 7]),
        dict(base, id=1, method="parallel-head-lossy-0.9", tokens=[7, 7], seconds=0.5, lossy_accepted=0),
        dict(base, id=1, method="hf-plain", tokens=[7, 7], draft_passes=None) | {"draft_passes": 0},
    ]
    del rows[-1]["draft_passes"]  # a transformers peer: no monitoring counters, so no row in the table
    answers = {(1, 2, 3, 4): "answer 4", (1, 2, 5, 6): "answer 6", (7, 7): "answer 7"}
    out = {s["method"]: s for s in lossy_rows(rows, lambda t: answers[tuple(t)], {"0": "4", "1": "7"})}
    lossy = out["parallel-head-lossy-0.9"]
    assert lossy["speedup"] == 2.0 and lossy["agreement"] == 0.75 and lossy["exact"] == 0.5
    assert lossy["gsm8k_accuracy"] == 0.5 and out["plain"]["gsm8k_accuracy"] == 1.0
    assert lossy["unverified_share"] == 0.25 and "hf-plain" not in out


def test_cli_generate_and_bench_lossy_table_end_to_end(plain, tiny_pair, tmp_path, monkeypatch, capsys):
    target = plain.engine.target
    head_dir = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3),
                                  tmp_path / "head")
    code = main(["generate", "w5 w6 w7", "--model", str(tiny_pair[0]), "--head", str(head_dir), "--dtype", "float32",
                 "--max-new-tokens", "6", "--lossy-threshold", "0.01"])
    assert code == 0 and "LOSSY (threshold 0.01" in capsys.readouterr().err
    # A GSM8K-format file in the tiny tokenizer's words: answers are numbers it can never print.
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    data.joinpath("test.jsonl").write_text("".join(
        json.dumps({"question": f"w{5 + i} w{9 + i} w{12 + i}", "answer": f"w3 #### {i}"}) + "\n" for i in range(2)))
    monkeypatch.setenv("FORETELL_DATA", str(tmp_path / "data"))
    args = ["bench", "--model", str(tiny_pair[0]), "--head", str(head_dir), "--dtype", "float32", "--datasets", "gsm8k",
            "--per-category", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "out"),
            "--methods", "plain,parallel-head,parallel-head-lossy-0.5,parallel-head-lossy-0.01,parallel-head-cache"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| pass rate | wasted |" in out and "# LOSSY verification" in out
    table = (tmp_path / "out" / "lossy.md").read_text()
    assert "| parallel-head-lossy-0.01 | 2 |" in table and "| parallel-head | 2 |" in table
    assert "| plain | 2 | 1.00x | 1.000 | 1.00 |" in table  # the reference agrees with itself
