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


def test_a_forward_off_the_cpu_bounds_its_last_position_without_reading_it():
    """Off the CPU a forward sizes its rotary table from the cache (no device-to-host copy, which a CUDA graph's
    capture forbids); on the CPU it reads the positions. A tensor on the meta device has no values to read at all."""
    import torch

    from foretell.kv_cache import KVCache
    from foretell.models.transformer import last_position

    cache = KVCache(1, 1, 8, 32, torch.float32, "cpu")
    cache.commit_prefix(5)
    tree = torch.tensor([5, 6, 6, 7])  # a tree of 4 nodes after 5 committed slots: its deepest at depth 2
    assert last_position(tree, cache, 4) == 7
    assert last_position(tree.to("meta"), cache, 4) == 8
