"""The folder format shared by trained drafter modules: every kind fails the same clear way."""

import pytest

from foretell.api import load
from foretell.errors import ForetellError
from foretell.models import hidden_draft, parallel_head
from foretell.models.module_folder import WEIGHTS_FILE

KINDS = {
    "parallel head": (parallel_head.new_parallel_head, parallel_head.save_parallel_head,
                      parallel_head.load_parallel_head, parallel_head.CONFIG_FILE),
    "hidden-state draft": (hidden_draft.new_hidden_draft, hidden_draft.save_hidden_draft,
                           hidden_draft.load_hidden_draft, hidden_draft.CONFIG_FILE),
}


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
