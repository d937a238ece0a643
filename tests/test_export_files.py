"""`foretell export`, training and saving write files other users may read as far as the umask allows (an engine
often runs as another user): 0644 under umask 022, 0600 under 077."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from conftest import make_hf_model, make_tokenizer, save_model_folder
from foretell.api import load
from foretell.cli import main
from foretell.files import current_umask
from foretell.models.eagle3 import Eagle3Config, new_eagle3_head, save_eagle3_head


@pytest.fixture(params=[0o022, 0o077], ids=["umask 022", "umask 077"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def modes(folder) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


def test_umask_is_read_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask


def test_draft_model_export(tiny_pair, tmp_path, umask):
    assert main(["export", "draft-model", "--draft", str(tiny_pair[1]), "--out", str(tmp_path / "hf")]) == 0
    files = modes(tmp_path / "hf")
    assert "model.safetensors" in files and set(files.values()) == {0o666 & ~umask}


def test_eagle3_export(tmp_path, umask):
    target = save_model_folder(tmp_path / "target", make_hf_model("llama", 48, seed=0, layers=4), make_tokenizer(48))
    pipe = load(target, "none", warm_up=False)
    config = Eagle3Config.for_target(pipe.target.model.config, draft_vocab_size=40, aux_layers=(1, 2, 3))
    head = new_eagle3_head(pipe.target.model, config, seed=7, draft_vocab=torch.tensor([0, 2, 3, 5, *range(9, 45)]))
    save_eagle3_head(head, tmp_path / "head")
    assert main(["export", "eagle3", "--head", str(tmp_path / "head"), "--target", str(target),
                 "--out", str(tmp_path / "engine")]) == 0
    files = modes(tmp_path / "engine")
    assert "model.safetensors" in files and set(files.values()) == {0o666 & ~umask}


def test_saved_drafts_and_heads_follow_the_umask(tmp_path, umask):
    """What training writes (a draft model folder, a head folder) is read by engines as well as `foretell export`'s."""
    from foretell.models.derive import save_model_folder as save_draft, truncated_copy

    target = save_model_folder(tmp_path / "target", make_hf_model("llama", 48, seed=0, layers=4), make_tokenizer(48))
    pipe = load(target, "none", warm_up=False)
    draft = save_draft(truncated_copy(pipe.target.model, 1), pipe.tokenizer, tmp_path / "draft")
    config = Eagle3Config.for_target(pipe.target.model.config, draft_vocab_size=40, aux_layers=(1, 2, 3))
    head = new_eagle3_head(pipe.target.model, config, seed=7, draft_vocab=torch.tensor([0, 2, 3, 5, *range(9, 45)]))
    save_eagle3_head(head, tmp_path / "head")
    for folder in (draft, tmp_path / "head"):
        files = modes(folder)
        assert any(name.endswith(".safetensors") for name in files) and set(files.values()) == {0o666 & ~umask}, folder
