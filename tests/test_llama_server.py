"""llama.cpp's own llama-server as the bench's peer: command lines, the /completion body and reply, the reasons a
method cannot run, and the process's life, against a stand-in server script. The last tests run the real
binaries on SmolLM2's GGUF when scripts/install_llama_cpp.sh has built them, and skip otherwise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from foretell.bench import llama_server, methods
from foretell.bench.llama_server import (PEER_CONFIGS, LlamaServer, ServerConfig, completion_request, find_binary,
                                         parse_completion, pick_draft_flags, server_command)
from foretell.bench.methods import LlamaServerMethod, MethodOptions, Models, build_methods, make_llama_server
from foretell.bench.runner import SUMMARY, RunConfig, run_bench
from foretell.errors import ForetellError

# A /completion reply of llama-server (llama-cpp-python 0.3.36's llama.cpp, native build) on SmolLM2-135M,
# greedy, to "What is the capital of France? One word." in its chat template; token 2 is <|im_end|>.
REPLY = {
    "content": "The capital of France is Paris.", "tokens": [504, 3575, 282, 4649, 314, 7042, 30, 2], "stop": True,
    "tokens_predicted": 8, "tokens_evaluated": 19, "stop_type": "eos",
    "timings": {"cache_n": 0, "prompt_n": 19, "prompt_ms": 67.421, "prompt_per_token_ms": 3.5484736842105264,
                "prompt_per_second": 281.811305082986, "predicted_n": 8, "predicted_ms": 65.035,
                "predicted_per_token_ms": 9.290714285714285, "predicted_per_second": 107.63435073422005},
}
# The same with a draft model: timings carry draft_n and draft_n_accepted.
BUILD = {"version": "0.3.36", "build": "portable", "cmake_flags": ["-DGGML_NATIVE=OFF", "-DGGML_AVX512=ON",
                                                                   "-DGGML_AMX_INT8=OFF"]}
DRAFT_REPLY = {**REPLY, "tokens": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
               "timings": {**REPLY["timings"], "predicted_n": 10, "draft_n": 9, "draft_n_accepted": 6}}


def gguf(path):
    path.write_bytes(b"GGUF")  # only its existence is checked before llama-server reads it
    return path


def test_command_line(tmp_path):
    target, draft = gguf(tmp_path / "t.gguf"), gguf(tmp_path / "d.gguf")
    cmd = server_command(tmp_path / "llama-server", ServerConfig(target, threads=2, slots=4, slot_context=1024,
                                                                 draft=draft), 8123)
    flags = ("-m", "-md", "-t", "-np", "-c", "--host", "--port", "--cache-ram")
    value = {flag: cmd[cmd.index(flag) + 1] for flag in flags}
    assert cmd[0] == str(tmp_path / "llama-server") and "--no-webui" in cmd and "--no-cache-prompt" in cmd
    assert value["-m"] == str(target) and value["-md"] == str(draft) and value["-t"] == "2" and value["-np"] == "4"
    assert value["-c"] == "4096"  # the whole cache: 4 slots of 1024
    assert cmd[cmd.index("--spec-type") + 1] == "draft-simple"  # else -md loads the draft and never drafts
    assert value["--host"] == "127.0.0.1" and value["--port"] == "8123" and value["--cache-ram"] == "0"
    plain = server_command(tmp_path / "llama-server", ServerConfig(target), 1)
    assert "-t" not in plain and "-md" not in plain and "--spec-type" not in plain
    assert plain[plain.index("-np") + 1] == "1"
    ngram = server_command(tmp_path / "llama-server", ServerConfig(target, spec_type="ngram-simple",
                                                                   prompt_cache=True), 1)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple" and "--no-cache-prompt" not in ngram


def test_config_refuses_bad_input(tmp_path):
    with pytest.raises(ForetellError, match="does not exist"):
        ServerConfig(tmp_path / "missing.gguf")
    with pytest.raises(ForetellError, match="draft GGUF"):
        ServerConfig(gguf(tmp_path / "t.gguf"), draft=tmp_path / "missing.gguf")
    with pytest.raises(ForetellError, match="slots must be >= 1"):
        ServerConfig(gguf(tmp_path / "t.gguf"), slots=0)


def test_request_body():
    greedy = completion_request([1, 2, 3], 16, 0.0, None)
    assert greedy == {"prompt": [1, 2, 3], "n_predict": 16, "cache_prompt": False, "return_tokens": True,
                      "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    assert completion_request([1], 4, 0.7, 5)["seed"] == 5


def test_reply_parsing():
    tokens, stats = parse_completion(REPLY, stop_ids={2})
    assert tokens == [504, 3575, 282, 4649, 314, 7042, 30]  # cut before the stop token
    assert stats["tau"] == 1.0 and stats["target_passes"] == 8 and stats["mean_verified_drafts"] == 0.0
    assert stats["prompt_tokens"] == 19 and stats["prefill_seconds"] == pytest.approx(0.067421)
    assert stats["decode_seconds"] == pytest.approx(0.065035)
    tokens, stats = parse_completion(DRAFT_REPLY, stop_ids={2})
    assert len(tokens) == 10 and stats["target_passes"] == 4  # 10 tokens, 6 of them accepted drafts
    assert stats["tau"] == 2.5 and stats["mean_verified_drafts"] == 2.25
    with pytest.raises(ForetellError, match="install_llama_cpp.sh"):
        parse_completion({"content": "x"}, stop_ids=set())


def test_missing_binary_is_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(methods, "find_binary", lambda name: None)
    assert "bash scripts/install_llama_cpp.sh" in make_llama_server(Models("smollm2-135m"), MethodOptions())
    skipped = []
    assert build_methods(["llama-cpp"], Models("smollm2-135m"), MethodOptions(), warn=skipped.append) == []
    assert "skipping llama-cpp" in skipped[0] and "install_llama_cpp.sh" in skipped[0]
    with pytest.raises(ForetellError, match="need --draft"):
        build_methods(["llama-cpp-draft"], Models("smollm2-135m"), MethodOptions())


def test_reasons_for_missing_gguf_files(tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "find_binary", lambda name: tmp_path / name)
    assert "no GGUF file on disk" in make_llama_server(Models(str(tmp_path)), MethodOptions())
    models = Models(str(gguf(tmp_path / "t.gguf")), draft=str(tmp_path / "gone.gguf"))
    draft_cfg = next(c for c in PEER_CONFIGS if c.draft)
    assert "no GGUF file on disk for the draft" in make_llama_server(models, MethodOptions(), draft_cfg)


def test_chunked_preset_gguf_is_assembled_once(tmp_path, monkeypatch):
    from foretell.models import presets

    made = []

    def assemble(preset, out):
        made.append(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        return gguf(out)

    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path))
    monkeypatch.setattr(presets, "preset_available", lambda name: True)
    monkeypatch.setattr(presets, "assemble_chunks", assemble)
    first = llama_server.peer_gguf("qwen2.5-coder-0.5b")  # chunked: its GGUF is deleted after conversion
    assert first == tmp_path / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf" and first.is_file()
    assert llama_server.peer_gguf("qwen2.5-coder-0.5b") == first and len(made) == 1  # kept for the next run
    assert llama_server.peer_gguf(str(tmp_path)) is None  # a folder: no GGUF


STAND_IN = """#!{python}
# A stand-in llama-server: answers /health and every POST with a fixed reply, and logs what it was sent. --help
# lists the draft flags in an older spelling; every start is logged (its arguments) to the launches file.
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
if args == ["--help"]:
    print("--spec-type [none|ngram-simple|draft-simple]  speculative type\\n--draft-max, --draft-n N   drafted tokens\\n"
          "--draft-min, --draft-n-min N\\n--draft-p-min P   minimum draft probability")
    sys.exit(0)
with open({launches!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "--fail" in open({reply!r}).read():
    sys.exit("error: invalid argument: --bogus")

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer({{"status": "ok"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open({seen!r}, "a") as f:
            f.write(json.dumps({{"argv": args, "path": self.path, "body": body}}) + "\\n")
        self.answer(json.loads(open({reply!r}).read()))

    def answer(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass

HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


@pytest.fixture
def stand_in(tmp_path):
    reply, seen, exe = tmp_path / "reply.json", tmp_path / "seen.jsonl", tmp_path / "llama-server"
    reply.write_text(json.dumps(DRAFT_REPLY))
    exe.write_text(STAND_IN.format(python=sys.executable, reply=str(reply), seen=str(seen),
                                   launches=str(tmp_path / "launches.jsonl")))
    exe.chmod(0o755)
    return exe, reply, seen


def test_method_against_a_stand_in_server(stand_in, tmp_path):
    exe, _, seen = stand_in
    server = LlamaServer(exe, ServerConfig(gguf(tmp_path / "t.gguf"), threads=1, draft=gguf(tmp_path / "d.gguf")))
    try:
        method = LlamaServerMethod("llama-cpp-draft", server, MethodOptions(temperature=0.5, seed=7), stop_ids={12},
                                   build=BUILD)
        tokens, stats = method.run([4, 5, 6], 10)
        assert tokens == [5, 6, 7, 8, 9, 10, 11] and stats["tau"] == 2.5
        assert method.memory_bytes() > 0
        # a bench run records the peer's command line and build, its cmake flags included, beside its rows
        prompt = {"dataset": "d", "id": 1, "category": "c", "prompt": "w"}
        run_bench([prompt], [method], lambda text: [4, 5, 6], RunConfig(tmp_path / "bench", 10, progress=False))
        peer = json.loads((tmp_path / "bench" / SUMMARY).read_text())["peers"]["llama-cpp-draft"]
        assert peer["build"]["cmake_flags"] == BUILD["cmake_flags"] and "-md" in peer["command"]
    finally:
        server.stop()
    assert server.proc.returncode is not None  # stopped
    sent = json.loads(seen.read_text().splitlines()[0])  # the method's own request (the bench's follow)
    assert sent["path"] == "/completion" and sent["argv"][sent["argv"].index("-md") + 1] == str(tmp_path / "d.gguf")
    assert sent["body"]["prompt"] == [4, 5, 6] and sent["body"]["seed"] == 7 and sent["body"]["temperature"] == 0.5


def test_a_server_that_exits_says_why(stand_in, tmp_path):
    exe, reply, _ = stand_in
    reply.write_text("--fail")
    with pytest.raises(ForetellError, match=r"exited with status 1 while starting(.|\n)*--bogus"):
        LlamaServer(exe, ServerConfig(gguf(tmp_path / "t.gguf")))


# The real binaries, when built here (not on a fresh clone: the build takes ~10 minutes).
BINARY = find_binary("llama-server")
BENCH = find_binary("llama-bench")


def smollm2_gguf():
    from foretell.models.presets import PRESETS, preset_available, locate_single_gguf

    return locate_single_gguf(PRESETS["smollm2-135m"]) if preset_available("smollm2-135m") else None


needs_binaries = pytest.mark.skipif(BINARY is None or BENCH is None or smollm2_gguf() is None,
                                    reason="llama.cpp's binaries are not built (bash scripts/install_llama_cpp.sh) "
                                           "or SmolLM2's GGUF is not installed")


@needs_binaries
def test_real_llama_server_decodes_token_ids_greedily():
    with LlamaServer(BINARY, ServerConfig(smollm2_gguf(), threads=1, slot_context=256)) as server:
        method = LlamaServerMethod("llama-cpp", server, MethodOptions(), stop_ids=set(), build=llama_server.build_info())
        prompt = server.post("/tokenize", {"content": "The capital of France is"})["tokens"]
        first, stats = method.run(prompt, 6)
        again, _ = method.run(prompt, 6)
        assert len(first) == 6 and first == again  # greedy: the same tokens each time
        assert stats["prompt_tokens"] == len(prompt) and stats["target_passes"] == 6  # the whole prompt: no cache
        assert method.memory_bytes() > 50 * 2**20  # the mapped weights at least
    assert server.proc.returncode is not None


@needs_binaries
def test_real_llama_bench_runs():
    out = subprocess.run([str(BENCH), "-m", str(smollm2_gguf()), "-p", "16", "-n", "4", "-r", "1", "-t", "1",
                          "-o", "json"], capture_output=True, text=True, timeout=120, check=True)
    assert all(row["avg_ts"] > 0 for row in json.loads(out.stdout))


# --- every llama.cpp configuration (PEER_CONFIGS): flags, spelling, bench methods, runs, warm-up, caches ---------

NEW_HELP = "--spec-type TYPE\n--spec-draft-n-max N\n--spec-draft-n-min N\n--spec-draft-p-min P\n--draft-max N (deprecated)"
OLD_HELP = "-md, --model-draft FNAME\n--draft-max, --draft, --draft-n N\n--draft-min, --draft-n-min N\n--draft-p-min P"


def test_draft_flags_follow_the_installed_spelling():
    assert pick_draft_flags(NEW_HELP) == {"draft_max": "--spec-draft-n-max", "draft_min": "--spec-draft-n-min",
                                          "draft_p_min": "--spec-draft-p-min"}  # the newest spelling listed wins
    assert pick_draft_flags(OLD_HELP) == {"draft_max": "--draft-max", "draft_min": "--draft-min",
                                          "draft_p_min": "--draft-p-min"}
    assert pick_draft_flags("--draft-max-tokens N\n--model-draft F") == {}  # whole flags only


def test_every_peer_configuration_has_its_flags(tmp_path):
    target, draft = gguf(tmp_path / "t.gguf"), gguf(tmp_path / "d.gguf")
    names = [c.name for c in PEER_CONFIGS]
    assert len(set(names)) == len(names) and names[:2] == ["plain", "ngram"]
    sweep = [c for c in PEER_CONFIGS if c.draft]
    assert 4 <= len(sweep) <= 6 and sweep[0].name == "draft" and not sweep[0].server_config(target, draft).draft_knobs()
    flags = pick_draft_flags(NEW_HELP)
    for c in PEER_CONFIGS:
        cmd = server_command(tmp_path / "llama-server", c.server_config(target, draft, threads=2), 9000, flags)
        value = lambda flag: cmd[cmd.index(flag) + 1] if flag in cmd else None  # noqa: E731
        assert ("-md" in cmd) == c.draft and value("-md") in (None, str(draft))
        assert value("--spec-type") == ("draft-simple" if c.draft else c.spec_type)
        assert value("--spec-draft-n-max") == (None if c.draft_max is None else str(c.draft_max))
        assert value("--spec-draft-n-min") == (None if c.draft_min is None else str(c.draft_min))
        assert value("--spec-draft-p-min") == (None if c.draft_p_min is None else f"{c.draft_p_min:g}")
        assert "--no-cache-prompt" in cmd and value("--cache-ram") == "0"  # caches off unless asked for
        assert ("no drafting" in c.describe()) == (c.name == "plain")
    with pytest.raises(ForetellError, match="lists no flag for draft_p_min"):
        server_command(tmp_path / "llama-server", sweep[1].server_config(target, draft), 1, {"draft_max": "--draft-max",
                                                                                             "draft_min": "--draft-min"})
    with pytest.raises(ForetellError, match="need a draft model"):
        ServerConfig(target, draft_max=4)


def test_a_draft_sweep_configuration_starts_with_the_binary_s_own_flags(stand_in, tmp_path):
    exe, _, _ = stand_in
    c = next(c for c in PEER_CONFIGS if c.draft_min)
    with LlamaServer(exe, c.server_config(gguf(tmp_path / "t.gguf"), gguf(tmp_path / "d.gguf"), threads=1)) as server:
        pass
    argv = json.loads((tmp_path / "launches.jsonl").read_text().splitlines()[0])  # as the process received them
    assert argv == server.command[1:]
    assert argv[argv.index("--draft-max") + 1] == str(c.draft_max)  # the stand-in's --help spells them the old way
    assert argv[argv.index("--draft-min") + 1] == str(c.draft_min)
    assert argv[argv.index("--draft-p-min") + 1] == f"{c.draft_p_min:g}"


def test_bench_names_every_llama_configuration():
    names = [methods.llama_method_name(c) for c in PEER_CONFIGS]
    assert names[:3] == ["llama-cpp", "llama-cpp-ngram", "llama-cpp-draft"]  # the names earlier runs used
    assert all(n in methods.PEERS for n in names)
    assert {n for n in names if methods.PEERS[n].needs == "draft"} == {methods.llama_method_name(c) for c in PEER_CONFIGS
                                                                        if c.draft}
    warned = []
    assert methods.expand_llama_all(["plain", "llama-cpp-all"], False, warned.append) == ["plain", "llama-cpp",
                                                                                          "llama-cpp-ngram"]
    assert "without --draft" in warned[0]
    assert methods.expand_llama_all(["llama-cpp", "llama-cpp-all"], True) == names  # none twice
    assert methods.has_llama_peer(["plain", "llama-cpp-ngram"]) and methods.has_llama_peer(["llama-cpp-all"])
    assert not methods.has_llama_peer(["plain", "llama-cpp-python", "hf-plain"])


class Recording:
    """A method that records the prompts it is given and its resets, in one shared log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def run(self, prompt_ids, max_new_tokens):
        self.log.append((self.name, "run", tuple(prompt_ids)))
        return [1] * max_new_tokens, {"tau": 1.0, "target_passes": max_new_tokens}

    def reset(self):
        self.log.append((self.name, "reset", None))

    def memory_bytes(self):
        return 1


@pytest.mark.parametrize("caches", [False, True])
def test_bench_runs_warm_up_outside_the_measured_prompts_and_resets_per_request(tmp_path, caches):
    from foretell.bench.runner import WARMUP_PROMPT, read_rows

    log: list = []
    prompts = [{"dataset": "d", "id": i, "category": "c", "prompt": f"prompt {i}"} for i in range(2)]
    encode = lambda text: [len(text), sum(map(ord, text)) % 1000]  # noqa: E731 (distinct ids per text)
    rows = read_rows(run_bench(prompts, [Recording("plain", log), Recording("llama-cpp", log)], encode,
                               RunConfig(tmp_path, 4, warmup_tokens=2, progress=False, runs=3, caches=caches)))
    assert len(rows) == 3 * 2 * 2 and sorted({r["run"] for r in rows}) == [0, 1, 2]
    runs = [entry for entry in log if entry[1] == "run"]
    warm, timed = runs[:2], runs[2:]
    assert {ids for _, _, ids in warm} == {tuple(encode(WARMUP_PROMPT))}
    assert WARMUP_PROMPT not in {p["prompt"] for p in prompts}
    assert not {ids for _, _, ids in timed} & {tuple(encode(WARMUP_PROMPT))}  # the warm-up prompt is never measured
    resets = sum(1 for entry in log if entry[1] == "reset")
    assert resets == 2 + (0 if caches else len(timed))  # after each warm-up; before every timed request unless caches
    assert all(r["greedy_equal_to_plain"] for r in rows)  # each run's rows compare with that run's plain


def test_bench_report_gives_each_side_s_best_by_median(tmp_path):
    from foretell.bench.report import best_section

    def row(method, run, tokens, seconds, pid=0):
        return {"dataset": "d", "id": pid, "category": "c", "method": method, "run": run, "new_tokens": tokens,
                "seconds": seconds}

    # draft-chain's best run (30 tok/s) beats prompt-lookup's, but its median (10) does not (20)
    rows = [row("draft-chain", 0, 30, 1), row("draft-chain", 1, 10, 1), row("draft-chain", 2, 10, 1),
            row("prompt-lookup", 0, 20, 1), row("prompt-lookup", 1, 20, 1), row("prompt-lookup", 2, 21, 1),
            row("llama-cpp", 0, 8, 1), row("llama-cpp", 1, 8, 1), row("llama-cpp", 2, 8, 1),
            row("llama-cpp-draft-n4-p0.75", 0, 10, 1), row("llama-cpp-draft-n4-p0.75", 1, 11, 1),
            row("llama-cpp-draft-n4-p0.75", 2, 5, 1), row("hf-plain", 0, 100, 1)]
    text = "\n".join(best_section(rows, {"settings": {"caches": False},
                                         "peers": {"llama-cpp": {"configuration": "no drafting", "command": ["-m", "x"],
                                                                 "build": BUILD}}}))
    assert "| 1 request | foretell | prompt-lookup (best) | 20.00 | 20.00, 20.00, 21.00 |" in text
    assert "| 1 request | llama.cpp | llama-cpp-draft-n4-p0.75 (best) | 10.00 | 10.00, 11.00, 5.00 |" in text
    assert "| 1 request | prompt-lookup (20.00) | llama-cpp-draft-n4-p0.75 (10.00) | 2.000 |" in text
    assert "hf-plain" not in text and "off on both sides" in text and "-DGGML_AVX512=ON" in text
    assert best_section([r for r in rows if not r["method"].startswith("llama")], {}) == []  # no peer: no section
