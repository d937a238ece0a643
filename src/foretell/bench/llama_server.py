"""llama.cpp's own llama-server as a benchmark peer: where the binary is, the command line, one server process
(a free loopback port, always stopped), and its /completion endpoint fed foretell's token ids.

scripts/install_llama_cpp.sh builds the binaries into the venv's bin and records the build it kept (native, or
explicit instruction-set flags) in the venv's share/foretell-llama-cpp.json.

PEER_CONFIGS lists, in one place, every llama.cpp configuration the comparisons run (foretell bench's llama-cpp*
methods, benchmarks/serve/serve_batching.py): plain, n-gram drafting from the context, and `-md DRAFT` at
llama.cpp's defaults and a small sweep of draft length / minimum / probability floor, so that each comparison
can pick llama.cpp's best configuration rather than one untuned one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
import ctypes

from foretell.errors import ForetellError
from foretell.runtime.loading import kept_gguf

INSTALL_COMMAND = "bash scripts/install_llama_cpp.sh"
BUILD_INFO = Path(sys.prefix) / "share" / "foretell-llama-cpp.json"


def find_binary(name: str) -> Path | None:
    """`name` next to this Python (the venv's bin, where the install script puts it), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return here
    found = shutil.which(name)
    return Path(found) if found else None


def missing_binary(name: str) -> str:
    return f"llama.cpp's {name} is not installed; run `{INSTALL_COMMAND}`"


def build_info() -> dict:
    """The install script's record of the build (version, native or explicit flags, CPU); {} when absent."""
    try:
        return json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return {}


def peer_gguf(spec: str) -> Path | None:
    """The GGUF file foretell loaded for a model spec, for llama.cpp to run. A chunked preset's file is deleted
    once converted, so it is assembled again from its installed chunks (checksummed) and kept for the next run."""
    return kept_gguf(spec)


@dataclass(frozen=True)
class ServerConfig:
    """What one llama-server process runs."""

    model: Path  # GGUF file
    threads: int | None = None  # -t; None: llama.cpp's own default
    slots: int = 1  # -np: requests decoded together
    slot_context: int = 8192  # KV-cache tokens per slot (prompt plus generation)
    draft: Path | None = None  # -md: llama.cpp's speculative decoding with this draft GGUF
    spec_type: str | None = None  # --spec-type: ngram-simple (drafts from the context); with a draft, draft-simple
    prompt_cache: bool = False  # off: every request processes its whole prompt, as foretell's engine does
    draft_max: int | None = None  # with a draft: most tokens drafted a step (None: llama.cpp's default)
    draft_min: int | None = None  # with a draft: fewest tokens a draft must have to be verified
    draft_p_min: float | None = None  # with a draft: drafting stops below this draft probability
    alias: str = "m"  # the model name its OpenAI endpoints answer to

    def __post_init__(self):
        if not Path(self.model).is_file():
            raise ForetellError(f"GGUF file {self.model} does not exist")
        if self.draft is not None and not Path(self.draft).is_file():
            raise ForetellError(f"draft GGUF file {self.draft} does not exist")
        for what, value in (("slots", self.slots), ("slot_context", self.slot_context), ("threads", self.threads)):
            if value is not None and value < 1:
                raise ForetellError(f"llama-server {what} must be >= 1, got {value}")
        if self.draft is None and self.draft_knobs():
            raise ForetellError("llama-server draft_max / draft_min / draft_p_min need a draft model (-md)")

    def draft_knobs(self) -> dict[str, float | int]:
        """The draft settings given (DRAFT_FLAGS keys -> value), in a fixed order."""
        values = {"draft_max": self.draft_max, "draft_min": self.draft_min, "draft_p_min": self.draft_p_min}
        return {k: v for k, v in values.items() if v is not None}


# Each draft setting's flag, as llama.cpp has spelt it over time (newest first): the first one the installed
# llama-server's --help lists is used, so the command line fits the build the install script made.
DRAFT_FLAGS = {
    "draft_max": ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
    "draft_min": ("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
}


def pick_draft_flags(help_text: str) -> dict[str, str]:
    """DRAFT_FLAGS key -> the spelling a llama-server --help text lists (keys it lists none of are left out)."""
    listed = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", help_text))
    return {key: next(f for f in names if f in listed) for key, names in DRAFT_FLAGS.items()
            if any(f in listed for f in names)}


@functools.lru_cache(maxsize=8)
def _help_text(binary: str, mtime: float) -> str:
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ForetellError(f"could not run {binary} --help to read its draft flags: {e}") from None
    return out.stdout + out.stderr


def draft_flags(binary: Path) -> dict[str, str]:
    """The installed llama-server's spelling of each draft setting (read from its --help once per binary)."""
    return pick_draft_flags(_help_text(str(binary), Path(binary).stat().st_mtime))


@dataclass(frozen=True)
class PeerConfig:
    """One llama.cpp configuration a comparison runs: `name` (the row's suffix), its --spec-type, whether it
    drafts with -md (the comparison's draft GGUF) and the draft settings it sets (None: llama.cpp's default)."""

    name: str
    spec_type: str | None = None
    draft: bool = False
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None

    def server_config(self, model: Path, draft: Path | None = None, **rest) -> ServerConfig:
        """This configuration on `model` (and `draft` when it drafts), with ServerConfig's other fields."""
        return ServerConfig(model, draft=draft if self.draft else None, spec_type=self.spec_type,
                            draft_max=self.draft_max, draft_min=self.draft_min, draft_p_min=self.draft_p_min, **rest)

    def describe(self) -> str:
        """The configuration in llama-server's terms, for reports."""
        if not self.draft:
            return f"--spec-type {self.spec_type} (its default sizes)" if self.spec_type else "no drafting"
        knobs = [f"{k.replace('_', '-')} {v:g}" for k, v in (("draft_max", self.draft_max), ("draft_min", self.draft_min),
                                                             ("p_min", self.draft_p_min)) if v is not None]
        return "-md DRAFT, " + (", ".join(knobs) if knobs else "llama.cpp's default draft settings")


# Every llama.cpp configuration the comparisons run, in one place. The draft sweep is small on purpose (each
# configuration costs a full pass over the prompts): short drafts (4, 8) at the usual probability floor 0.75, and
# more permissive ones (p-min 0.5, at least 2 tokens a draft) at 8 and 16, beside llama.cpp's own defaults.
PEER_CONFIGS = (
    PeerConfig("plain"),
    PeerConfig("ngram", spec_type="ngram-simple"),
    PeerConfig("draft", draft=True),
    PeerConfig("draft-n4-p0.75", draft=True, draft_max=4, draft_min=0, draft_p_min=0.75),
    PeerConfig("draft-n8-p0.75", draft=True, draft_max=8, draft_min=0, draft_p_min=0.75),
    PeerConfig("draft-n8-min2-p0.5", draft=True, draft_max=8, draft_min=2, draft_p_min=0.5),
    PeerConfig("draft-n16-min2-p0.5", draft=True, draft_max=16, draft_min=2, draft_p_min=0.5),
)


def server_command(binary: Path, cfg: ServerConfig, port: int, flags: dict[str, str] | None = None) -> list[str]:
    """The command line. `flags`: DRAFT_FLAGS key -> spelling (None: read from the binary's --help, only when the
    config sets a draft setting)."""
    # -c is the whole KV cache, which llama-server splits evenly among the -np slots.
    cmd = [str(binary), "-m", str(cfg.model), "--host", "127.0.0.1", "--port", str(port), "--alias", cfg.alias,
           "-np", str(cfg.slots), "-c", str(cfg.slot_context * cfg.slots), "--no-webui"]
    if cfg.threads is not None:
        cmd += ["-t", str(cfg.threads)]
    spec_type = cfg.spec_type
    if cfg.draft is not None:
        cmd += ["-md", str(cfg.draft)]
        # This llama.cpp infers only MTP and DFlash drafts from the file: a plain model drafts when told so.
        spec_type = spec_type or "draft-simple"
    if spec_type is not None:
        cmd += ["--spec-type", spec_type]
    knobs = cfg.draft_knobs()
    if knobs:
        flags = draft_flags(binary) if flags is None else flags
        missing = sorted(set(knobs) - set(flags))
        if missing:
            raise ForetellError(f"{binary} lists no flag for {', '.join(missing)} in its --help (looked for "
                                f"{', '.join(f for k in missing for f in DRAFT_FLAGS[k])}); rebuild it with "
                                f"`{INSTALL_COMMAND}` or leave those settings at llama.cpp's defaults")
        for key, value in knobs.items():
            cmd += [flags[key], f"{value:g}"]
    if not cfg.prompt_cache:  # neither the slot's last prompt nor the RAM cache may shorten the next prefill
        cmd += ["--no-cache-prompt", "--cache-ram", "0"]
    return cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies, so a killed bench leaves no server behind."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LlamaServer:
    """One llama-server process on a free loopback port, its output in a log file. stop() (or leaving a `with`
    block) ends it; a finalizer at exit and the parent-death signal end it if the caller cannot."""

    def __init__(self, binary: Path, cfg: ServerConfig, log: Path | None = None, start_timeout: float = 300):
        self.cfg = cfg
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = server_command(binary, cfg, self.port)
        self.temp_log = log is None
        self.log = log or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        with self.log.open("w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self._finalizer()
            raise

    def _wait_ready(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            if time.monotonic() > deadline:
                raise ForetellError(f"llama-server did not start within {limit_s:.0f} s; {self.log_tail()}")
            time.sleep(0.25)
        raise ForetellError(f"llama-server exited with status {self.proc.returncode} while starting; {self.log_tail()}")

    def log_tail(self, lines: int = 8) -> str:
        try:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            tail = []
        return f"its log ({self.log}) ends:\n  " + "\n  ".join(tail) if tail else f"its log is {self.log}"

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        """POST JSON, return the JSON reply; llama-server's error message (or its log) when it fails."""
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise ForetellError(f"llama-server answered {path} with HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            state = "has exited" if self.proc.poll() is not None else "did not answer"
            raise ForetellError(f"llama-server {state} ({e}); {self.log_tail()}") from None

    def rss_bytes(self) -> int:
        """The process's resident memory: its mapped weights, KV cache and compute buffers (0 when unknown)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self) -> None:
        self._finalizer()
        if self.temp_log and self.proc.returncode in (0, -signal.SIGTERM):
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def completion_request(prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int | None) -> dict:
    """A /completion body: the prompt as token ids, no prompt cache, the generated ids returned. Temperature 0 is
    llama.cpp's greedy; otherwise plain temperature sampling (every truncation off), as foretell's engine samples."""
    body = {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
            "temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if seed is not None:
        body["seed"] = seed
    return body


def parse_completion(reply: dict, stop_ids: set[int]) -> tuple[list[int], dict]:
    """New tokens (cut before the first stop token) and the bench's stats, from llama-server's own timings. With
    a draft, each target pass yields its accepted draft tokens plus one: passes = generated - accepted."""
    if "tokens" not in reply or "timings" not in reply:
        raise ForetellError("llama-server's reply has no `tokens` or `timings`; is it a llama.cpp server older "
                            f"than return_tokens? Rebuild it with `{INSTALL_COMMAND}`")
    produced, t = reply["tokens"], reply["timings"]
    stop = next((i for i, tok in enumerate(produced) if tok in stop_ids), len(produced))
    generated = t["predicted_n"]
    accepted, drafted = t.get("draft_n_accepted", 0), t.get("draft_n", 0)
    passes = max(generated - accepted, 1)
    return produced[:stop], {
        "tau": generated / passes, "target_passes": passes, "acceptance_per_position": [],
        "mean_verified_drafts": drafted / passes,
        "prompt_tokens": t["prompt_n"], "prefill_seconds": t["prompt_ms"] / 1000,
        "decode_seconds": t["predicted_ms"] / 1000,  # llama.cpp's own clock: the first token is the prefill's
    }


def peer_configs(names: list[str] | None = None, draft: bool = True) -> list[PeerConfig]:
    """PEER_CONFIGS by name (None: all), without the -md ones when there is no draft model."""
    known = {c.name: c for c in PEER_CONFIGS}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ForetellError(f"unknown llama.cpp configuration(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[n] for n in names] if names is not None else list(PEER_CONFIGS)
    return [c for c in chosen if draft or not c.draft]
