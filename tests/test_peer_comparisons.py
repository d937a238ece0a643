"""The comparison scripts against llama.cpp (benchmarks/serve/serve_batching.py, benchmarks/bench/
decode_vs_llama_bench.py) and foretell/bench/best.py: each configuration's median over runs, each side's best per
level, a fresh server per (level, run, configuration) counted at the stand-in llama-server, warm-up prompts outside
the measured set, the llama.cpp configurations' flags, caches off on both sides by default. Nothing is timed; servers
are stand-ins on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from foretell.bench.best import best_by_level, best_ratio, markdown, median_by_config, runs_note

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "serve"))
sys.path.insert(0, str(ROOT / "benchmarks" / "bench"))
import decode_vs_llama_bench  # noqa: E402
import serve_batching  # noqa: E402
from test_llama_server import gguf, stand_in  # noqa: E402,F401  (the stand-in llama-server fixture)
from test_trained_drafts import have_spec_bench  # noqa: E402


def rows_of(table: dict) -> list[dict]:
    """{(config, side, level): [run values]} -> rows."""
    return [{"config": c, "side": s, "level": lv, "run": i, "v": v}
            for (c, s, lv), values in table.items() for i, v in enumerate(values)]


def test_best_is_the_highest_median_not_the_highest_run():
    entries = median_by_config(rows_of({
        ("spec", "foretell", 1): [50, 10, 12], ("plain", "foretell", 1): [20, 21, 19],
        ("llama", "llama.cpp", 1): [9, 10, 11], ("llama-ngram", "llama.cpp", 1): [30, 8, 7],
        ("spec", "foretell", 4): [40, 41, 39], ("plain", "foretell", 4): [30, 30, 30],
        ("llama", "llama.cpp", 4): [10, 10, 10], ("llama-ngram", "llama.cpp", 4): [20, 19, 21]}), "v")
    best = best_by_level(entries)
    assert best[1]["foretell"]["config"] == "plain" and best[1]["llama.cpp"]["config"] == "llama"
    assert best[4]["foretell"]["config"] == "spec" and best[4]["llama.cpp"]["config"] == "llama-ngram"
    assert best_ratio(best, "foretell", "llama.cpp") == {
        1: {"foretell": "plain", "llama.cpp": "llama", "ratio": 2.0}, 4: {"foretell": "spec", "llama.cpp": "llama-ngram",
                                                                          "ratio": 2.0}}
    table = "\n".join(markdown(entries, "foretell", "llama.cpp", level_name="clients"))
    assert "| 1 | foretell | plain (best) | 20.00 | 20.00, 21.00, 19.00 |" in table
    assert "| 1 | foretell | spec | 12.00 | 50.00, 10.00, 12.00 |" in table  # every configuration, every run
    assert "| 4 | spec (40.00) | llama-ngram (20.00) | 2.000 |" in table
    assert runs_note(entries) == "" and "only 1 time" in runs_note(median_by_config(rows_of({("a", "x", 1): [1]}), "v"))


@pytest.mark.skipif(not have_spec_bench(), reason="Spec-Bench data (../shared/data) is not on this machine")
def test_warm_up_prompts_are_never_measured():
    prompts, warm = serve_batching.split_prompts(2, seed=0)
    assert prompts and warm and not set(prompts) & set(warm)
    assert len(set(prompts)) == len(prompts)


class FakeServer:
    def __init__(self, name, clients, launches):
        self.name, self.clients, self.url = name, clients, f"http://127.0.0.1:1/{name}/{clients}/{len(launches)}"
        self.command, self.stopped = f"serve {name}", False
        launches.append(self)

    def stop(self):
        self.stopped = True


def test_a_fresh_server_per_level_run_and_configuration_in_rotating_order(tmp_path):
    launches, loads = [], []
    starters = {name: (lambda clients, log, name=name: FakeServer(name, clients, launches))
                for name in ("plain", "speculative", "llama-server")}
    prompts, warm = ["m1", "m2", "m3"], ["w1", "w2"]

    def load(url, texts, requests, clients, tokens, rng):
        loads.append((url, tuple(texts), requests, clients, tokens))
        assert all(not s.stopped for s in launches if s.url == url)  # measured while running
        return [serve_batching.summarize.__globals__["Outcome"]("ok", tokens=tokens, ttft=0.1, gaps=[0.01])] * requests, 1.0

    rows = serve_batching.measure([(1, 3), (4, 8)], 3, starters, prompts, warm, 16, 0, tmp_path, load=load)
    assert len(launches) == 2 * 3 * 3 and all(s.stopped for s in launches)  # levels x runs x configurations
    assert len(rows) == len(launches) and {(r["server"], r["clients"], r["run"]) for r in rows} == {
        (n, c, run) for n in starters for c in (1, 4) for run in range(3)}
    firsts = [launches[i].name for i in range(0, 9, 3)]  # the first server of each run at the first level
    assert firsts == ["plain", "speculative", "llama-server"]
    for server in launches:  # per server: one warm-up on the warm-up prompts, then the measured ones
        mine = [entry for entry in loads if entry[0] == server.url]
        assert [set(m[1]) for m in mine] == [set(warm), set(prompts)]
        assert mine[0][4] == serve_batching.WARMUP_TOKENS and mine[1][2] == (3 if server.clients == 1 else 8)
        assert mine[0][3] == mine[1][3] == server.clients


def test_llama_configurations_launch_fresh_with_their_flags(stand_in, tmp_path, monkeypatch):
    exe, _, _ = stand_in
    target, draft = gguf(tmp_path / "t.gguf"), gguf(tmp_path / "d.gguf")
    monkeypatch.setattr(serve_batching, "find_binary", lambda name: exe)
    monkeypatch.setattr(serve_batching, "peer_gguf", lambda spec: target)

    class Args:
        model, threads, slot_context, caches = "m", 2, 256, False

    chosen = ["llama-server", "llama-server-ngram", "llama-server-draft-n8-min2-p0.5"]
    starters = {n: serve_batching.llama_starter(Args, serve_batching.LLAMA_SERVERS[n], draft) for n in chosen}
    assert "no draft model" in serve_batching.llama_starter(Args, serve_batching.LLAMA_SERVERS["llama-server-draft"],
                                                            None)
    empty = lambda url, texts, requests, clients, tokens, rng: ([], 1.0)  # noqa: E731 (no client load)
    rows = serve_batching.measure([(1, 2), (4, 2)], 2, starters, ["m"], ["w"], 8, 0, tmp_path, load=empty)
    launched = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]
    assert len(launched) == len(rows) == 2 * 2 * 3  # a new process every (level, run, configuration)
    value = lambda argv, flag: argv[argv.index(flag) + 1] if flag in argv else None  # noqa: E731
    for row, argv in zip(rows, launched):
        assert value(argv, "-np") == str(row["clients"]) and "--no-cache-prompt" in argv and value(argv, "-t") == "2"
        assert row["command"].split()[1:] == argv
        spec = value(argv, "--spec-type")
        if row["server"] == "llama-server":
            assert spec is None and "-md" not in argv
        elif row["server"] == "llama-server-ngram":
            assert spec == "ngram-simple" and "-md" not in argv
        else:
            assert spec == "draft-simple" and value(argv, "-md") == str(draft)
            assert (value(argv, "--draft-max"), value(argv, "--draft-min"), value(argv, "--draft-p-min")) == ("8", "2",
                                                                                                              "0.5")


def test_caches_off_drop_the_foretell_drafter_s_result_cache(tmp_path):
    flags, what = serve_batching.foretell_drafter_flags(
        "smollm2-135m", ["--drafter", "prompt-lookup", "--corpus", "smollm2-135m-answers"], False, tmp_path)
    assert flags == ["--spec-config", str(tmp_path / "spec-no-result-cache.json")] and "corpus" in what
    saved = json.loads((tmp_path / "spec-no-result-cache.json").read_text())
    assert saved["method"] == "prompt-lookup" and "result_cache" not in saved and "corpus" not in saved
    on = ["--drafter", "prompt-lookup", "--corpus", "smollm2-135m-answers"]
    assert serve_batching.foretell_drafter_flags("smollm2-135m", on, True, tmp_path)[0] == on  # --caches: as given
    plain = ["--drafter", "prompt-lookup"]
    assert serve_batching.foretell_drafter_flags("smollm2-135m", plain, False, tmp_path)[0] == plain  # nothing to drop


def test_serve_report_shows_every_run_each_side_s_best_and_the_ratio(tmp_path):
    def row(server, clients, run, rate):
        return {"server": server, "clients": clients, "run": run, "tokens_per_second": rate, "served": 3, "failed": 0,
                "ttft_p50": 0.1, "ttft_p90": 0.2, "itl_p50": 0.01, "itl_p90": 0.02, "itl_p99": 0.03,
                "mean_acceptance_length": None, "side": "llama.cpp" if server.startswith("llama") else "foretell"}

    rows = [row("plain", 1, r, v) for r, v in enumerate([10, 11, 12])]
    rows += [row("speculative", 1, r, v) for r, v in enumerate([30, 14, 15])]
    rows += [row("llama-server", 1, r, v) for r, v in enumerate([6, 7, 5])]
    rows += [row("llama-server-ngram", 1, r, v) for r, v in enumerate([8, 4, 4])]
    levels = serve_batching.median_rows(rows)
    spec = next(r for r in levels if r["server"] == "speculative")
    assert spec["tokens_per_second"] == 15 and spec["run"] == 2 and spec["runs_tokens_per_second"] == [30, 14, 15]
    entries = median_by_config(rows, "tokens_per_second", config="server", level="clients")
    ratios = serve_batching.ratios(levels, entries)
    assert ratios[1] == {"speculative / plain": 1.364, "foretell best / llama.cpp best": round(15 / 6, 3)}
    results = {"settings": {"runs": "3"}, "caches": False, "runs": rows, "levels": levels, "ratios": ratios,
               "foretell": {"drafter": "prompt-lookup"},
               "llama_cpp": {"build": {"build": "portable", "cmake_flags": ["-DGGML_AVX2=ON"]},
                             "configurations": {"llama-server": "no drafting"}}}
    serve_batching.write_report(tmp_path, results)
    text = (tmp_path / "report.md").read_text()
    assert "| 1 | foretell | speculative (best) | 15.00 | 30.00, 14.00, 15.00 |" in text
    assert "| 1 | speculative (15.00) | llama-server (6.00) | 2.500 |" in text
    assert "off on both sides" in text and "-DGGML_AVX2=ON" in text and "- llama-server: no drafting" in text


def test_decode_vs_llama_bench_picks_each_side_s_best_and_keeps_paired_ratios():
    assert decode_vs_llama_bench.LLAMA_BENCH_CONFIGS["llama-bench-fa"]("-fa, --flash-attn <0|1>") == ["-fa", "1"]
    assert decode_vs_llama_bench.LLAMA_BENCH_CONFIGS["llama-bench-fa"]("-fa, --flash-attn <on|off|auto>") == ["-fa", "on"]
    assert decode_vs_llama_bench.round_order(["a", "b", "c"], 1) == ["b", "c", "a"]
    rounds = [{"foretell": 10, "llama-bench": 8, "llama-bench-fa": 20}, {"foretell": 12, "llama-bench": 6,
                                                                         "llama-bench-fa": 9},
              {"foretell": 11, "llama-bench": 10, "llama-bench-fa": 9.5}]
    out = decode_vs_llama_bench.summarize_rounds(rounds, ["llama-bench", "llama-bench-fa"])
    assert out["medians"] == {"foretell": 11, "llama-bench": 8, "llama-bench-fa": 9.5}
    assert out["best"] == {"foretell": "foretell", "llama.cpp": "llama-bench-fa"}  # 9.5 > 8 by median, not by max
    assert out["best_ratio"] == round(11 / 9.5, 3)
    assert out["paired"]["llama-bench"]["ratio_median"] == pytest.approx(1.25)  # 10/8, 12/6, 11/10
