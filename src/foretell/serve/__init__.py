"""`foretell serve`: an OpenAI-compatible HTTP server with speculative decoding.

protocol.py (request bodies, errors), responses.py (response bodies, statistics), worker.py (the thread that
owns the engine), metrics.py (Prometheus), app.py (`create_app`), cli.py (the command). Nothing is imported
here, so `foretell --help` does not pay for (or need) the web framework.
"""
