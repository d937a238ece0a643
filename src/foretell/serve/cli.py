"""The `foretell serve` command: flags -> ServeSettings and a SpeculativeConfig, a pipeline, then uvicorn
(server.py).

Imports of the web stack wait until the command runs, so the rest of the CLI works without the serve extra.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch

from foretell.api import load
from foretell.errors import ForetellError
from foretell.runtime.quant import describe_target
from foretell.serve.settings import ServeSettings
from foretell.spec_args import add_model_args, add_speculative_args, speculative_from_args

LOOPBACK = ("127.0.0.1", "localhost", "::1")


HELP = "OpenAI-compatible HTTP server with speculative decoding"
DESCRIPTION = (
    "Serve one model on /v1/completions, /v1/chat/completions and /v1/models, with /health and /metrics "
    "(Prometheus). Speculation is configured as for `foretell generate`. Requests queue for the engine, which "
    "batches them continuously: up to --max-batch are decoded together, one target pass a step for all of them, and "
    "a request joins or leaves the batch between passes."
)
# The options that set the ServeSettings field of the same name, whose default they take: (field, type or
# choices, help); each help ends with its default.
SETTINGS_OPTIONS = (
    ("max_queue", int, "requests that may wait for the engine; more are answered 503 with Retry-After"),
    ("request_timeout", float, "seconds a request may take, waiting included"),
    ("max_body_bytes", int, "largest request body; larger ones get 413"),
    ("max_batch", int, "requests decoded together, one target pass verifying all their drafts; 1 turns batching off"),
    ("batch_budget", ("auto", "fixed", "none"), "draft tokens each request may have verified per pass: auto = "
     "foretell's batch-aware budget (measured cost curve), fixed = by batch size (vLLM's rule), none = each drafter "
     "as configured"),
    ("prefill_chunk", int, "prompt tokens read per pass, so long prompts never stall running requests"),
    ("prefix_cache_mb", int, "MiB of prompt prefixes (their KV rows) kept for later requests that start with them, "
     "as a conversation's next turn does; 0 turns it off"),
    ("shutdown_timeout", float, "on SIGTERM or Ctrl-C, seconds to let requests in flight finish; the ones still "
     "running then are answered 503 (a stream: an error event, then [DONE])"),
    ("header_timeout", float, "seconds a connection may take to send a request's line and headers; slower ones are "
     "closed"),
    ("body_timeout", float, "seconds a request's body may take to arrive once its headers have; slower ones are "
     "answered 408 and closed"),
    ("keep_alive_timeout", float, "seconds an idle connection stays open between requests"),
)


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help=HELP, description=DESCRIPTION)
    add_model_args(p)
    add_speculative_args(p)
    defaults = ServeSettings()
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: %(default)s, this machine only; 0.0.0.0 = every interface)")
    g.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    g.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 (default: $FORETELL_API_KEY if set, "
                   "else no key)")
    g.add_argument("--served-model-name", help="the model id clients send (default: the last part of --model)")
    for name, kind, text in SETTINGS_OPTIONS:
        typed = {"choices": kind} if isinstance(kind, tuple) else {"type": kind}
        g.add_argument("--" + name.replace("_", "-"), default=getattr(defaults, name),
                       help=f"{text} (default: %(default)s)", **typed)
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level; info logs every request (default: %(default)s)")
    p.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> None:
    try:
        from foretell.serve.app import create_app
        from foretell.serve.server import Server
        from foretell.serve.worker import on_a_passing_thread
    except ImportError as e:
        raise ForetellError(f"foretell serve needs the serve extra ({e.name} is missing): "
                            "pip install 'foretell[serve]'") from None
    # oneDNN keeps a compiled kernel per matrix shape, 1024 by default; a server sees many shapes (every mix of
    # requests), and a small cache measured as fast here with far less memory (docs/serving.md).
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")

    settings = ServeSettings(api_key=args.api_key or os.environ.get("FORETELL_API_KEY") or None,
                             **{name: getattr(args, name) for name, _, _ in SETTINGS_OPTIONS})
    if not 0 <= args.port <= 65535:
        raise ForetellError(f"--port must be in 0..65535, got {args.port}")
    spec, why = speculative_from_args(args, args.model)
    if args.save_spec_config:
        print(f"[speculative config written to {spec.save(args.save_spec_config)}]", file=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)

    name = args.served_model_name or Path(str(args.model).rstrip("/")).name

    def make():  # every torch computation off the main thread (worker.on_a_passing_thread says why)
        pipeline = load(args.model, spec, dtype=args.dtype, device=args.device, quant=args.quant, compile=args.compile,
                        kv_dtype=args.kv_dtype)
        return pipeline, create_app(pipeline, name, settings)

    pipeline, app = on_a_passing_thread(make, torch.get_num_threads())
    chose = f": {why}; --drafter picks another" if why else ""
    weights = describe_target(args.quant, args.dtype, pipeline.target.model)
    print(f"[foretell serve: model {name!r}, drafter {spec.describe()}{chose}, {weights}; "
          f"http://{args.host}:{args.port}/v1{', API key required' if settings.api_key else ''}]", file=sys.stderr)
    if args.host not in LOOPBACK and settings.api_key is None:
        print(f"[warning: listening on {args.host} without an API key: anyone who can reach it may use it]",
              file=sys.stderr)
    # uvicorn handles SIGTERM itself (stop accepting, let requests in flight finish or end them, stop the worker),
    # then raises the signal again for the previous handler: this one makes that an exit with status 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    server = Server(app, host=args.host, port=args.port, log_level=args.log_level)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn raises it again once it has shut down
        pass
    if not server.started:
        raise ForetellError(f"the server did not start on {args.host}:{args.port}: see the log above")


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
