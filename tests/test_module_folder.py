"""The folder format shared by trained drafter modules: every kind fails the same clear way."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models import eagle3, eagle3_format, hidden_draft, parallel_head
from foretell.models.module_folder import WEIGHTS_FILE

KINDS = {
    "parallel head": (parallel_head.new_parallel_head, parallel_head.save_parallel_head,
                      parallel_head.load_parallel_head, parallel_head.CONFIG_FILE),
    "hidden-state draft": (hidden_draft.new_hidden_draft, hidden_draft.save_hidden_draft,
                           hidden_draft.load_hidden_draft, hidden_draft.CONFIG_FILE),
    "EAGLE-3 head": (eagle3.new_eagle3_head, eagle3.save_eagle3_head, eagle3_format.load_eagle3_head, eagle3.CONFIG_FILE),
}
# the method that loads each kind, and the subfolder of a training run's --out folder it is saved in
METHODS = {"parallel head": ("parallel-head", "head"), "hidden-state draft": ("hidden-state", "draft"),
           "EAGLE-3 head": ("eagle3", "head")}


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load(tiny_pair[0], "none", warm_up=False).target.model


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_folders_fail_with_one_clear_line(kind, target, tmp_path):
    new, save, load_module, config_file = KINDS[kind]
    with pytest.raises(ForetellError, match=f"no {kind} folder"):
        load_module(tmp_path / "nowhere", target)
    folder = save(new(target), tmp_path / "saved")
    (folder / WEIGHTS_FILE).write_bytes(b"not a safetensors file at all")
    with pytest.raises(ForetellError, match="not a readable safetensors"):
        load_module(folder, target)
    (folder / WEIGHTS_FILE).unlink()
    with pytest.raises(ForetellError, match=f"the {kind}'s weights are missing"):
        load_module(folder, target)
    (folder / config_file).write_text("{ broken")
    with pytest.raises(ForetellError, match="not valid JSON"):
        load_module(folder, target)
    (folder / config_file).unlink()
    with pytest.raises(ForetellError, match=f"no {config_file}"):
        load_module(folder, target)


@pytest.mark.parametrize("kind", KINDS)
def test_a_training_runs_folder_loads_the_drafter_it_saved(kind, target, tiny_pair, tmp_path):
    """`foretell train KIND --out RUN` saves the drafter in RUN/head (RUN/draft): RUN itself names it, for the
    loaders and for the configuration the CLI's --head / --eagle / --hidden-draft build."""
    new, save, load_module, config_file = KINDS[kind]
    method, part = METHODS[kind]
    saved = save(new(target), tmp_path / "run" / part)
    from_run, direct = load_module(tmp_path / "run", target), load_module(saved, target)
    assert all(torch.equal(a, b) for a, b in zip(from_run.state_dict().values(), direct.state_dict().values()))
    pipe = load(tiny_pair[0], SpeculativeConfig(method=method, model=str(tmp_path / "run")), warm_up=False)
    assert pipe.engine.drafter.name == method
    # a run not finished yet, and a folder that is neither: the error says where the drafter would be
    (tmp_path / "unfinished" / "train").mkdir(parents=True)
    (tmp_path / "unfinished" / "train" / "job.json").write_text("{}")
    with pytest.raises(ForetellError, match=f"training run whose {kind} is not saved yet .*rerun its `foretell train`"):
        load_module(tmp_path / "unfinished", target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForetellError, match=f"has no {config_file}, nor has .*empty/{part}.* saves it in OUT/{part}"):
        load_module(tmp_path / "empty", target)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_file_and_tensor(kind, bad, target, tmp_path):
    new, save, load_module, _ = KINDS[kind]
    folder = save(new(target), tmp_path / "saved")
    state = load_file(str(folder / WEIGHTS_FILE))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    state[name][0, 0] = bad
    save_file(state, str(folder / WEIGHTS_FILE))
    with pytest.raises(ForetellError, match=f"{folder / WEIGHTS_FILE} holds NaN or infinite values \\(in {name}\\)"):
        load_module(folder, target)


FLAGS = {"parallel head": "--head", "hidden-state draft": "--hidden-draft", "EAGLE-3 head": "--eagle"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_finished_run_of_another_kind_says_what_it_holds_and_which_flag_takes_it(kind, target, tiny_pair, tmp_path):
    """`--eagle RUN` where RUN is a finished parallel-head run once said the head "is not saved yet: rerun its
    foretell train command"; every loader now names the kind the folder holds and the flag that takes it."""
    new, save, _, _ = KINDS[kind]
    method, part = METHODS[kind]
    save(new(target), tmp_path / "run" / part)
    (tmp_path / "run" / "train").mkdir()
    (tmp_path / "run" / "train" / "job.json").write_text("{}")
    for other, (_, _, load_other, _) in KINDS.items():
        if other == kind:
            continue
        wanted = f"holds a {kind} .*, not a {other}: pass it with {FLAGS[kind]} \\(--drafter {method}\\)"
        for folder in (tmp_path / "run", tmp_path / "run" / part):
            with pytest.raises(ForetellError, match=wanted) as refused:
                load_other(folder, target)
            assert "not saved yet" not in str(refused.value)
        with pytest.raises(ForetellError, match=wanted):  # as the CLI's flag builds it
            load(tiny_pair[0], SpeculativeConfig(method=METHODS[other][0], model=str(tmp_path / "run")), warm_up=False)


@pytest.mark.parametrize("kind", KINDS)
def test_eval_draft_given_a_head_says_it_measures_draft_models_and_where_the_heads_figures_are(
        kind, target, tiny_pair, tmp_path, capsys):
    """eval-draft on a head's run folder failed deep in loading a tokenizer; it now names the kind, the report
    its training run writes (OUT/eval.json) and the flag that decodes with it, before loading anything."""
    from foretell.cli import main

    new, save, _, _ = KINDS[kind]
    method, part = METHODS[kind]
    save(new(target), tmp_path / "run" / part)
    argv = ["eval-draft", "--target", str(tiny_pair[0]), "--draft", str(tmp_path / "run")]
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"holds a {kind}" in error and "eval-draft measures draft models" in error
    assert f"goes to {tmp_path / 'run' / 'eval.json'} when its `foretell train {method}` run finishes" in error
    assert f"--drafter {method} {FLAGS[kind]}" in error and "Traceback" not in error
    (tmp_path / "run" / "eval.json").write_text("{}")
    assert main([*argv[:-1], str(tmp_path / "run" / part)]) == 2  # the module's own folder: the same answer
    assert f"held-out acceptance is in {tmp_path / 'run' / 'eval.json'}" in " ".join(capsys.readouterr().err.split())
