"""Trained drafts by name, and the Spec-Bench prompt source of eval-draft."""

import pytest

from foretell.bench.datasets import spec_bench_path
from foretell.errors import ForetellError
from foretell.models.trained import TRAINED_DRAFTS
from foretell.runtime.loading import resolve_model_dir
from foretell.train.adaspec.evaluate import eval_prompts


def test_untrained_name_fails_with_the_command_that_builds_it(tmp_path):
    with pytest.raises(ForetellError, match="adaspec_table.sh"):
        resolve_model_dir("smollm2-135m-adaspec-gsm8k", cache_dir=tmp_path)


def test_trained_name_resolves_to_the_distill_output(tmp_path):
    draft = TRAINED_DRAFTS["smollm2-135m-adaspec-sharegpt"]
    folder = draft.model_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert resolve_model_dir(draft.name, cache_dir=tmp_path) == folder


def have_spec_bench() -> bool:
    try:
        return spec_bench_path().is_file()
    except ForetellError:  # raised when the data folder is absent
        return False


@pytest.mark.skipif(not have_spec_bench(), reason="Spec-Bench data (../shared/data) is not on this machine")
def test_spec_bench_prompts_cover_every_category():
    prompts = eval_prompts("spec-bench", 12)
    assert len(prompts) == 12
    assert all(len(p) == 1 and p[0]["role"] == "user" and p[0]["content"] for p in prompts)
    assert len({p[0]["content"] for p in prompts}) == 12
