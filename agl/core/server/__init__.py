"""The agl HTTP server: the Store API under ``/api`` and an OpenAI-compatible LLM gateway under ``/gw``.

One module per concern: ``app`` (routes and their bodies), ``gateway`` (the LLM proxy and its ``llm`` spans),
``errors`` (strict body parsing, error messages, body limits, the crash guard), ``running`` (``AglServer`` in a thread,
``serve`` in the foreground). Spans reach the store through ``agl.core.span_pipeline``.
"""

from agl.core.server.app import MAX_WAIT_S, create_app
from agl.core.server.errors import format_validation_errors
from agl.core.server.gateway import Gateway
from agl.core.server.running import AglServer, serve

__all__ = ["MAX_WAIT_S", "AglServer", "Gateway", "create_app", "format_validation_errors", "serve"]
