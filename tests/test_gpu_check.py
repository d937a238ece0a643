"""benchmarks/gpu/gpu_check.sh runs on CPU in its dry mode, so the prepared GPU check cannot rot between GPU loans."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "benchmarks/gpu/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and set(report["exactness"]) == {"prompt-lookup", "draft-model", "draft-tree",
                                                                "parallel-head", "hidden-state"}
    assert all(report["exactness"].values())
    assert all(ms > 0 for ms in report["cost"]["tiny"]["eager_ms"].values())
    assert "greedy = plain" in (tmp_path / "gpu_check.md").read_text()
