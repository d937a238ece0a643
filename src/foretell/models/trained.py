"""Draft models that foretell trains itself, usable by name once their command has run.

They are too large to keep in the repository (a 2-layer SmolLM2 draft still carries the 49K x 576
embedding), so a name points to where the documented command writes the model, and a missing
one fails with that command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrainedDraft:
    name: str
    run_dir: str  # under the foretell cache: the `foretell train adaspec --out` folder
    command: str  # what builds it

    def model_dir(self, cache_dir: Path) -> Path:
        return cache_dir / "drafts" / self.run_dir / "draft" / "model"


_TABLE = "bash benchmarks/adaspec/adaspec_table.sh"
TRAINED_DRAFTS = {
    d.name: d
    for d in (
        TrainedDraft("smollm2-135m-adaspec-gsm8k", "smollm2-adaspec-gsm8k", f"DATASETS=gsm8k {_TABLE}"),
        TrainedDraft("smollm2-135m-adaspec-sharegpt", "smollm2-adaspec-sharegpt", f"DATASETS=sharegpt {_TABLE}"),
    )
}
