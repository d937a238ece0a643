"""A training folder bound to the settings it was made with, so that resuming never mixes two runs.

job.json holds the settings (a job's fingerprint()); a folder holding other settings is refused,
and --no-resume (job.resume False) clears it. done.json marks finished training. AdaSPEC's stages
and the parallel-head and hidden-state runs all keep their training folder this way.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from foretell.errors import ForetellError

DONE = "done.json"
JOB = "job.json"


@dataclass(frozen=True)
class SettingsJob:
    """A training folder and the settings a checkpoint in it must share (what open_job_folder needs)."""

    out: Path
    resume: bool
    settings: dict

    def fingerprint(self) -> dict:
        return self.settings


def differences(saved, wanted, path: str = "") -> list[tuple[str, object, object]]:
    """(dotted path, saved value, wanted value) of every leaf setting that differs (None where one side has none)."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        return [d for key in sorted(set(saved) | set(wanted), key=str)
                for d in differences(saved.get(key), wanted.get(key), f"{path}.{key}" if path else str(key))]
    return [] if saved == wanted else [(path, saved, wanted)]


def earlier_run(folder: Path) -> str:
    """What --no-resume removes from a training folder, in words: a finished run or its checkpoint."""
    try:
        steps = json.loads((folder / DONE).read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        steps = None
    if steps is not None:
        return f"the earlier run's finished training ({steps} steps)"
    if (folder / DONE).is_file():
        return "the earlier run's finished result"
    return "the earlier run's checkpoint and log" if any(folder.iterdir()) else "nothing yet"


def open_job_folder(job) -> None:
    """Ready job.out for job (anything with out, resume and fingerprint()). A folder holding a job
    made with other settings is an error (resuming it would mix two runs); --no-resume clears it."""
    if not job.resume and job.out.exists():
        print(f"foretell train: --no-resume: {earlier_run(job.out)} in {job.out} is removed; starting over")
        shutil.rmtree(job.out)
    job.out.mkdir(parents=True, exist_ok=True)
    path = job.out / JOB
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise ForetellError(f"{path} is corrupt; delete {job.out} to redo the stage") from None
        if saved != job.fingerprint():
            changed = "; ".join(f"{path} was {json.dumps(old)}, now {json.dumps(new)}"
                                for path, old, new in differences(saved, job.fingerprint()))
            raise ForetellError(f"{job.out} holds a stage made with other settings ({changed}); rerun with "
                                "--no-resume to start it over, or give another --out")
    else:  # written whole or not at all: an interrupted write must not leave a "corrupt" folder
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(job.fingerprint(), indent=2))
        partial.replace(path)
