"""Drafters shipped inside the package: loaded by name, checked (checksums, target, kind), the default of
generate for their target; the real ones stay within the size budget and decode exactly as plain."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import PROMPTS, greedy_params
from foretell.build import DrafterWeights, build_engine, default_speculative
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
from foretell.models.shipped import MANIFEST, SHIPPED_DIR, Manifest, sha256_of, ship_drafter, shipped_manifests
from foretell.runtime.loading import load_model

SPEC = {"method": "parallel-head", "budget": "fixed", "result_cache": "prompt"}


@pytest.fixture
def shipped(tiny_pair, tmp_path):
    """A random head for the tiny target, shipped into tmp_path/shipped as 'tiny-head' (the default)."""
    target = load_model(tiny_pair[0])
    saved = save_parallel_head(new_parallel_head(target.model, ParallelHeadConfig.for_target(target.config), seed=3),
                               tmp_path / "run" / "head")
    root = tmp_path / "shipped"
    ship_drafter(saved, "tiny-head", "parallel-head", str(tiny_pair[0]), target.model, SPEC,
                 {"command": "a test", "heldout": {"top1": 0.1}}, default=True, root=root)
    return target, root


def engine_for(target, root, **spec):
    weights = DrafterWeights(target, "tiny", shipped_root=root)
    return build_engine(SpeculativeConfig(**{"method": "parallel-head", "model": "tiny-head", **spec}), weights)


def test_a_shipped_drafter_loads_by_name_and_is_exact(shipped, plain):
    target, root = shipped
    manifest = Manifest.read(root / "tiny-head")
    assert manifest.kind == "parallel-head" and manifest.made_by["command"] == "a test"
    assert set(manifest.files) == {"parallel_head.json", "model.safetensors"}
    engine = engine_for(target, root)
    assert engine.drafter.head.fuse.weight.dtype == torch.float32  # stored bf16, loaded in the target's dtype
    for prompt in PROMPTS:
        assert engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens


def test_the_default_shipped_drafter_of_a_target(shipped, tiny_pair, tmp_path):
    _, root = shipped
    spec, why = default_speculative(str(tiny_pair[0]), tmp_path / "cache", root)
    assert spec == SpeculativeConfig(method="parallel-head", model="tiny-head", result_cache="prompt")
    assert "shipped drafter tiny-head" in why
    fallback = default_speculative("another-model", tmp_path / "cache", root)[0]
    assert (fallback.method, fallback.lookup_min) == ("prompt-lookup", 2)


def test_one_default_a_target_and_make_default_moves_it(shipped, tiny_pair, tmp_path):
    """Shipping a second default unmarks the first; make_default moves the mark back, records the bench figures,
    and leaves the weights' checksums valid."""
    from foretell.models.shipped import make_default, verified_folder

    target, root = shipped
    saved = save_parallel_head(new_parallel_head(target.model, ParallelHeadConfig.for_target(target.config), seed=4),
                               tmp_path / "run2" / "head")
    ship_drafter(saved, "tiny-head-2", "parallel-head", str(tiny_pair[0]), target.model, SPEC,
                 {"command": "another test"}, default=True, root=root)
    defaults = lambda: [m.name for m in shipped_manifests(root) if m.default]  # noqa: E731
    assert defaults() == ["tiny-head-2"]
    figures = {"folder": "runs/x", "method": "tiny-head", "speedup_tau": {"overall": [1.3, 2.1]}}
    assert make_default("tiny-head", figures, root).made_by["bench"] == figures
    assert defaults() == ["tiny-head"]
    assert Manifest.read(root / "tiny-head").made_by["command"] == "a test"  # the rest kept
    for name in ("tiny-head", "tiny-head-2"):
        verified_folder(name, "parallel-head", target.model, root)
    assert default_speculative(str(tiny_pair[0]), tmp_path / "cache", root)[0].model == "tiny-head"


def test_a_cpu_class_can_have_its_own_default(shipped, tiny_pair, tmp_path, monkeypatch):
    """make_default(cpu=...) marks a drafter the default on one class of CPU only, moving the mark from any other
    drafter there; elsewhere (other classes, other devices) the drafter marked default stays the default."""
    from foretell import build
    from foretell.models.shipped import default_shipped, make_default

    target, root = shipped
    saved = save_parallel_head(new_parallel_head(target.model, ParallelHeadConfig.for_target(target.config), seed=4),
                               tmp_path / "run2" / "head")
    ship_drafter(saved, "tiny-head-2", "parallel-head", str(tiny_pair[0]), target.model, SPEC, {"command": "t"},
                 root=root)
    name = str(tiny_pair[0])
    figures = {"folder": "runs/y", "method": "tiny-head-2", "speedup_tau": {"overall": [1.4, 2.2]}}
    assert make_default("tiny-head-2", figures, root, cpu="amx").made_by["bench_on"] == {"amx": figures}
    assert [default_shipped(name, root, cpu).name for cpu in ("amx", "avx2", None)] == \
        ["tiny-head-2", "tiny-head", "tiny-head"]
    make_default("tiny-head", None, root, cpu="amx")  # moves the class's mark, keeps the figures recorded
    assert Manifest.read(root / "tiny-head-2").default_on == []
    assert Manifest.read(root / "tiny-head").default_on == ["amx"]
    make_default("tiny-head-2", None, root, cpu="avx2")
    monkeypatch.setattr("foretell.kernels.cpu_class", lambda: "avx2")
    spec, why = build.default_speculative(name, tmp_path / "cache", root)
    assert spec.model == "tiny-head-2" and "on AVX2 CPUs like this one" in why
    spec, why = build.default_speculative(name, tmp_path / "cache", root, device="cuda")
    assert spec.model == "tiny-head" and "CPUs" not in why


def test_a_damaged_or_misused_shipped_drafter_is_refused(shipped, tiny_pair):
    target, root = shipped
    folder = root / "tiny-head"
    with pytest.raises(ForetellError, match="is a parallel-head drafter, not hidden-state"):
        build_engine(SpeculativeConfig(method="hidden-state", model="tiny-head"), DrafterWeights(target, "t", shipped_root=root))
    with pytest.raises(ForetellError, match="no drafter folder 'tiny-haed', and no shipped drafter of that name .shipped: tiny-head"):
        engine_for(target, root, model="tiny-haed")
    other = load_model(tiny_pair[1])  # same shapes, other weights: another model
    with pytest.raises(ForetellError, match="was trained for .*this target differs .embedding_sha256"):
        build_engine(SpeculativeConfig(method="parallel-head", model="tiny-head"), DrafterWeights(other, "d", shipped_root=root))
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-8] + bytes(8))
    with pytest.raises(ForetellError, match="damaged: model.safetensors does not match its checksum"):
        engine_for(target, root)
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ForetellError, match="damaged"):
        engine_for(target, root)
    weights.unlink()
    with pytest.raises(ForetellError, match="is missing model.safetensors"):
        engine_for(target, root)
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ForetellError, match="manifest.json is damaged"):
        engine_for(target, root)


def test_a_head_method_without_weights_uses_the_targets_shipped_drafter(shipped, tiny_pair, plain):
    target, root = shipped
    weights = DrafterWeights(target, str(tiny_pair[0]), shipped_root=root)
    engine = build_engine(SpeculativeConfig(method="parallel-head"), weights)
    assert engine.drafter is not None and engine.drafter.name != "none"
    assert engine.generate(PROMPTS[0], greedy_params()).tokens == plain.engine.generate(PROMPTS[0], greedy_params()).tokens
    with pytest.raises(ForetellError, match="no eagle3 drafter is shipped for .*: give its folder with --eagle"):
        build_engine(SpeculativeConfig(method="eagle3"), weights)


def test_an_eagle3_head_ships_and_loads_by_name(tiny_pair, tmp_path, plain):
    from foretell.models.eagle3 import Eagle3Config, new_eagle3_head, save_eagle3_head

    target = load_model(tiny_pair[0])
    ids = torch.arange(0, 40)
    head = new_eagle3_head(target.model, Eagle3Config.for_target(target.config, draft_vocab_size=40), seed=2,
                           draft_vocab=ids)
    saved = save_eagle3_head(head, tmp_path / "run" / "head")
    root = tmp_path / "shipped"
    ship_drafter(saved, "tiny-eagle", "eagle3", str(tiny_pair[0]), target.model, {"method": "eagle3"},
                 {"command": "a test", "heldout": {}}, root=root)
    assert set(Manifest.read(root / "tiny-eagle").files) == {"eagle3.json", "model.safetensors"}
    engine = build_engine(SpeculativeConfig(method="eagle3", model="tiny-eagle"),
                          DrafterWeights(target, "tiny", shipped_root=root))
    for prompt in PROMPTS:
        assert engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens
    with pytest.raises(ForetellError, match="is a eagle3 drafter, not parallel-head"):
        build_engine(SpeculativeConfig(method="parallel-head", model="tiny-eagle"),
                     DrafterWeights(target, "tiny", shipped_root=root))


def test_a_hidden_state_draft_ships_in_int8_rows_and_stays_exact(tiny_pair, plain, tmp_path):
    """storage="int8": the draft's matrices as int8 rows with a scale each (fewer bytes than bf16); it loads by
    name, holds those rounded values, and decodes exactly as plain."""
    from safetensors.torch import load_file

    from foretell.models.hidden_draft import load_hidden_draft, new_hidden_draft, save_hidden_draft
    from foretell.models.module_folder import INT8_ROW_SCALE

    target = load_model(tiny_pair[0])
    saved = save_hidden_draft(new_hidden_draft(target.model, seed=5), tmp_path / "run" / "draft")
    root = tmp_path / "shipped"
    for storage in ("bf16", "int8"):
        ship_drafter(saved, f"tiny-hidden-{storage}", "hidden-state", str(tiny_pair[0]), target.model,
                     {"method": "hidden-state"}, {"command": "a test", "heldout": {}}, root=root, storage=storage)
    sizes = {s: (root / f"tiny-hidden-{s}" / "model.safetensors").stat().st_size for s in ("bf16", "int8")}
    assert sizes["int8"] < 0.75 * sizes["bf16"]
    stored = load_file(str(root / "tiny-hidden-int8" / "model.safetensors"))
    packed = [k for k in stored if k + INT8_ROW_SCALE in stored]
    assert packed and all(stored[k].dtype == torch.int8 for k in packed)
    assert Manifest.read(root / "tiny-hidden-int8").storage == "int8"
    original = load_hidden_draft(saved, target.model).state_dict()
    shipped_draft = load_hidden_draft(root / "tiny-hidden-int8", target.model).state_dict()
    rounded = 0
    for k in packed:  # within half a step of each row's scale
        step = stored[k + INT8_ROW_SCALE][:, None]
        error = (shipped_draft[k].float() - original[k].float()).abs()
        assert bool((error <= step * 0.5 + 1e-6).all()), k
        rounded += int(error.max() > 0)
    assert rounded > 0  # the rounding is real
    engine = build_engine(SpeculativeConfig(method="hidden-state", model="tiny-hidden-int8"),
                          DrafterWeights(target, "tiny", shipped_root=root))
    for prompt in PROMPTS:
        assert engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens


# --- the drafters that ship with foretell ---------------------------------------------------------

SIZE_BUDGET = 40 * 2**20


def test_shipped_drafters_fit_the_budget_and_match_their_checksums():
    total = sum(p.stat().st_size for p in SHIPPED_DIR.rglob("*") if p.is_file())
    assert total <= SIZE_BUDGET, f"shipped drafters take {total / 2**20:.1f} MiB, over the 40 MiB budget"
    for m in shipped_manifests():
        assert all(sha256_of(SHIPPED_DIR / m.name / f) == h for f, h in m.files.items()), m.name
        assert {"command", "data", "commit", "heldout"} <= set(m.made_by), f"{m.name}: manifest lacks provenance"
        m.speculative_config()
    defaults = [m.target.name for m in shipped_manifests() if m.default]
    assert len(defaults) == len(set(defaults)), "one default drafter per target"
    by_class = [(m.target.name, cpu) for m in shipped_manifests() for cpu in m.default_on]
    assert len(by_class) == len(set(by_class)), "one default drafter per target on each class of CPU"


def test_run_sh_default_is_the_shipped_drafter_and_exact_on_the_fast_path(capsys):
    """What ./run.sh does on a fresh clone: generate on SmolLM2 with no drafter chosen, on the fast path (the
    file's blocks, 8-bit activations). It picks the shipped default drafter (this CPU's class's, where the bench
    ranked them on one), its greedy text is plain decoding's on that path, token for token, and it says which
    path it ran and what that changes."""
    from pathlib import Path

    from foretell.cli import main
    from foretell.kernels import cpu_class, lean_decode
    from foretell.models.shipped import default_shipped

    default = default_shipped("smollm2-135m", cpu=cpu_class())
    if default is None:
        pytest.skip("no drafter shipped for smollm2-135m yet")
    fast_path = ["--quant", "gguf-q8", "--dtype", "float32"]
    assert " ".join(fast_path) in (Path(__file__).parents[1] / "run.sh").read_text()
    if lean_decode() is None:
        fast_path = ["--dtype", "float32"]  # 8-bit activations run in the lean kernels only
    args = ["generate", "Summarize in two sentences why the sky is blue.", *fast_path, "--max-new-tokens", "48"]

    assert main([*args, "--max-new-tokens", "8"]) == 0
    assert "[path: " in capsys.readouterr().err
    args.append("--json")

    def run(*extra):
        assert main([*args, *extra]) == 0
        captured = capsys.readouterr()
        return json.loads(captured.out), captured.err

    spec, err = run()
    assert default.name in (spec["speculative"].get("model"), spec["speculative"].get("corpus"))
    assert f"shipped drafter {default.name}" in err
    assert spec["tokens"] == run("--drafter", "none")[0]["tokens"]


def test_generate_with_a_head_method_alone_uses_the_shipped_head(capsys):
    """`foretell generate --drafter eagle3` on SmolLM2, no weights given: the shipped EAGLE-3 head drafts, and
    in fp32 the text is plain decoding's."""
    from foretell.cli import main

    shipped = [m.name for m in shipped_manifests() if m.target.name == "smollm2-135m" and m.kind == "eagle3"]
    if not shipped:
        pytest.skip("no EAGLE-3 head shipped for smollm2-135m")
    args = ["generate", "Name three primary colors and one use of each.", "--dtype", "float32",
            "--max-new-tokens", "32", "--json"]

    def run(*extra):
        assert main([*args, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    spec = run("--drafter", "eagle3")
    assert spec["speculative"]["model"] in shipped and spec["stats"]["mean_verified_drafts"] > 0
    assert spec["tokens"] == run("--drafter", "none")["tokens"]


def test_every_shipped_smollm2_drafter_is_exact_in_fp32(capsys):
    """Each drafter shipped for SmolLM2 (not only the default), with its manifest's configuration: fp32 greedy
    text equals plain decoding's."""
    from foretell.cli import main

    names = [m.name for m in shipped_manifests() if m.target.name == "smollm2-135m"]
    if not names:
        pytest.skip("no drafter shipped for smollm2-135m yet")
    args = ["generate", "A train leaves at 3 pm and travels 60 km per hour. How far has it gone by 5 pm?",
            "--dtype", "float32", "--max-new-tokens", "40", "--json"]

    def tokens(*extra):
        assert main([*args, *extra]) == 0
        return json.loads(capsys.readouterr().out)["tokens"]

    plain_tokens = tokens("--drafter", "none")
    flags = {"parallel-head": "--head", "eagle3": "--eagle", "hidden-state": "--hidden-draft", "corpus": "--corpus"}
    for name in names:
        assert tokens(flags[Manifest.read(SHIPPED_DIR / name).kind], name) == plain_tokens, name
