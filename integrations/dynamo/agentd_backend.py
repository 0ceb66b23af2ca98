"""agentd as a backend of NVIDIA Dynamo (`dynamo.common.backend.LLMEngine`).

Thin adapter: Dynamo's frontend and router hand this worker token-id requests;
each is forwarded to the node's `agentd serve` as a streaming
`/v1/completions` call with `return_token_ids`, and the generated ids are
streamed back in Dynamo's shape (`{"token_ids", "finish_reason",
"completion_usage"}`). Cancelling the Dynamo request closes the HTTP stream,
which agentd treats as an abort (the engine frees the request at its next
step). The worker registers the model name, context length and KV block size
read from agentd itself (`/v1/models`, `/metrics` `vllm:cache_config_info`).

Why an adapter and not a native Rust worker: the `dynamo-runtime` crates pull
in Dynamo's whole runtime (NATS/etcd clients, tokio stack) and track Dynamo's
release cadence; the Python `LLMEngine` contract is Dynamo's documented
extension point for custom engines and keeps agentd's default build free of it.

Program identity: Dynamo's session id (`x-dynamo-session-id`, forwarded by
the frontend in the request annotations when present) becomes agentd's
`program_id`, so every turn of a session lands on the same agentd program.

Status: UNTESTED. Written against the `LLMEngine` contract as described for
ai-dynamo 1.6.1 (from_args / start / generate / abort / cleanup); Dynamo was
not installed when it was written, so names of the request fields
(`token_ids`, `stop_conditions`, `sampling_options`, the session annotation)
are to be checked against `dynamo.common.backend` before first use.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request

import aiohttp
from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration

AGENTD_URL = os.environ.get("AGENTD_URL", "http://127.0.0.1:8000")


def _get(path: str) -> str:
    with urllib.request.urlopen(AGENTD_URL + path, timeout=30) as r:
        return r.read().decode()


def _registration() -> tuple[str, int, int]:
    """(model name, context length, KV block size) as agentd reports them."""
    models = json.loads(_get("/v1/models"))["data"][0]
    metrics = _get("/metrics")
    m = re.search(r'vllm:cache_config_info\{block_size="(\d+)"', metrics)
    block_size = int(m.group(1)) if m else 16
    return models["id"], int(models.get("max_model_len") or 0), block_size


class AgentdEngine(LLMEngine):
    """Forwards Dynamo's token-id requests to one agentd node."""

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.inflight: dict[str, aiohttp.ClientResponse] = {}

    @classmethod
    def from_args(cls, argv=None):  # Dynamo's constructor hook
        return cls()

    async def start(self, worker_id) -> EngineConfig:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        name, context_length, block_size = _registration()
        return EngineConfig(
            model=name,
            llm=LlmRegistration(context_length=context_length, kv_cache_block_size=block_size),
        )

    async def generate(self, request, context):
        """`request["token_ids"]` in, chunks of generated ids out."""
        sc = request.get("stop_conditions") or {}
        so = request.get("sampling_options") or {}
        body = {
            "prompt": request["token_ids"],
            "max_tokens": sc.get("max_tokens") or 256,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "ignore_eos": bool(sc.get("ignore_eos", False)),
        }
        if so.get("temperature") is not None:
            body["temperature"] = so["temperature"]
        if so.get("top_p") is not None:
            body["top_p"] = so["top_p"]
        session_id = (request.get("annotations_map") or {}).get("session_id") or request.get(
            "session_id"
        )
        if session_id:
            body["program_id"] = session_id
        rid = context.id() if hasattr(context, "id") else str(id(context))
        assert self.session is not None
        async with self.session.post(AGENTD_URL + "/v1/completions", json=body) as resp:
            self.inflight[rid] = resp
            try:
                if resp.status != 200:
                    raise RuntimeError(f"agentd {resp.status}: {await resp.text()}")
                async for line in resp.content:
                    line = line.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    out = {"token_ids": []}
                    for c in chunk.get("choices", []):
                        out["token_ids"] += c.get("token_ids") or []
                        if c.get("finish_reason"):
                            out["finish_reason"] = c["finish_reason"]
                    if chunk.get("usage"):
                        out["completion_usage"] = chunk["usage"]
                    if out["token_ids"] or "finish_reason" in out or "completion_usage" in out:
                        yield out
            finally:
                self.inflight.pop(rid, None)

    async def abort(self, context) -> None:
        """Closing the stream is agentd's cancellation."""
        rid = context.id() if hasattr(context, "id") else str(id(context))
        resp = self.inflight.pop(rid, None)
        if resp is not None:
            resp.close()

    async def cleanup(self) -> None:
        if self.session is not None:
            await self.session.close()


if __name__ == "__main__":
    # The worker entry point is Dynamo's (its `sample_main.py` shows how an
    # LLMEngine subclass is served); it was not available to check here.
    raise SystemExit(
        "serve AgentdEngine with dynamo.common.backend's worker main "
        "(see its sample_main.py); this module only defines the engine"
    )
