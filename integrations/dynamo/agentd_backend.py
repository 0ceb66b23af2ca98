"""agentd as a worker of NVIDIA Dynamo (ai-dynamo 1.6.1, `dynamo.common.backend`).

One process per agentd node: it registers the node with Dynamo's discovery
(model, context length, KV block size and block count, one data-parallel rank
per agentd replica), serves Dynamo's token-in/token-out `generate` endpoint by
forwarding each request to the node's `agentd serve` as a streaming
`/v1/completions` call with a token-id prompt and `return_token_ids`, and
points Dynamo's KV router at agentd's own vLLM-format KV-event stream
(`--kv-events-config`; Dynamo's worker subscribes to it with a `ZmqSource`).

    python -m integrations.dynamo.agentd_backend --agentd-url http://127.0.0.1:8101 \
        --kv-events-endpoint tcp://127.0.0.1:20080 --discovery-backend file --event-plane zmq

- Session identity: the frontend turns `x-dynamo-session-id`,
  `x-dynamo-parent-session-id` and `x-dynamo-session-final` into the request's
  `agent_context`; they go to agentd as the same headers, which agentd maps to
  its program id, parent and final flag (crates/server/src/program_id.rs), so
  every turn of a session is one agentd program and the last one releases it.
- Token ids back to the client: the frontend refuses `return_token_ids`; a
  client that asks `nvext.extra_fields: ["engine_data"]` gets the generated ids
  in the final chunk's `nvext.engine_data.completion_token_ids`, as Dynamo's
  vLLM worker does.
- Cancellation: Dynamo calls `abort(context)` and closes the generator; both
  close the HTTP stream, which agentd treats as an abort.
- Failure: a request to an agentd that is gone fails with an error naming it;
  a monitor polls agentd's `/health` and, when it stays down, stops this
  worker (SIGTERM: the Dynamo runtime unregisters it), so the router sends
  new requests to the other workers.
- Behind a router (`dynamo.thunderagent_router`, which registers the public
  model itself and reads this worker's KV capacity from its registration):
  register under a name of its own, `--served-model-name MODEL-worker
  --endpoint-types completions`. Dynamo 1.6.1's common-backend worker refuses
  `--endpoint-types none` ("unknown endpoint type 'none'"), and a worker
  registered under the router's name would take a share of the frontend's
  requests for that name past the router (`benches/thunderagent.sh`,
  target ta-agentd-request).
- Load: agentd's `/metrics` (`vllm:kv_cache_usage_perc`, prefix-cache counters)
  feed Dynamo's per-rank snapshot (`kv_used_blocks`, hit rate) for the router.

Why an adapter rather than a native Rust worker: see the README (Dynamo section).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
from typing import Any, AsyncGenerator, Optional
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.common.backend.publisher import ComponentSnapshot, ZmqSource
from dynamo.common.backend.run import run
from dynamo.llm.exceptions import CannotConnect, InvalidArgument, StreamIncomplete, Unknown

logger = logging.getLogger("agentd_backend")

# Sampling fields of Dynamo's `sampling_options` that agentd's completions take
# under the same name (vLLM's); others (n > 1, beam search, guided decoding)
# are refused rather than silently dropped. The token controls are forwarded
# when a frontend sets them; agentd checks them (a bad value is a 400 that
# fails the request with agentd's message).
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
             "bad_words")
_USAGE = ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details")


def agentd_request(request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Dynamo's preprocessed request -> (agentd /v1/completions body, headers)."""
    token_ids = request.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise InvalidArgument("the request has no prompt token ids")
    body: dict[str, Any] = {
        "prompt": token_ids,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if request.get("model"):
        body["model"] = request["model"]
    sc = request.get("stop_conditions") or {}
    if sc.get("max_tokens") is not None:
        body["max_tokens"] = int(sc["max_tokens"])
    if sc.get("ignore_eos"):
        body["ignore_eos"] = True
    # vLLM's min_tokens: agentd holds back EOS and the stop ids below (masked
    # to -inf) until that many tokens; stop strings stay with the frontend.
    if sc.get("min_tokens"):
        body["min_tokens"] = int(sc["min_tokens"])
    # Hidden stop ids end the sequence without being shown; agentd's
    # stop_token_ids do the same (vLLM's meaning). Stop strings stay with the
    # frontend, which detokenizes and stops the stream itself.
    stop_ids = list(sc.get("stop_token_ids_hidden") or []) + list(sc.get("stop_token_ids") or [])
    if stop_ids:
        body["stop_token_ids"] = stop_ids
    so = request.get("sampling_options") or {}
    if (so.get("n") or 1) != 1 or (so.get("best_of") or 1) != 1 or so.get("use_beam_search"):
        raise InvalidArgument("the agentd adapter serves n = 1, no beam search")
    if so.get("guided_decoding"):
        raise InvalidArgument("guided decoding is not forwarded to agentd (use agentd's API)")
    for k in _SAMPLING:
        if so.get(k) is not None:
            body[k] = so[k]
    oo = request.get("output_options") or {}
    if oo.get("logprobs") is not None or oo.get("prompt_logprobs") is not None:
        raise InvalidArgument("logprobs are not forwarded by the agentd adapter")
    nvext = _nvext(request)
    if isinstance(nvext.get("cache_salt"), str) and nvext["cache_salt"]:
        body["cache_salt"] = nvext["cache_salt"]
    headers = {}
    ac = request.get("agent_context") or {}
    for field, header in (("session_id", "x-dynamo-session-id"),
                          ("parent_session_id", "x-dynamo-parent-session-id")):
        v = ac.get(field)
        if isinstance(v, str) and v.strip():
            headers[header] = v.strip()
    if ac.get("session_final") is True and "x-dynamo-session-id" in headers:
        headers["x-dynamo-session-final"] = "true"
    return body, headers


def _nvext(request: dict[str, Any]) -> dict[str, Any]:
    extra = request.get("extra_args")
    nvext = extra.get("nvext") if isinstance(extra, dict) else None
    return nvext if isinstance(nvext, dict) else {}


def wants_engine_data(request: dict[str, Any]) -> bool:
    fields = _nvext(request).get("extra_fields")
    return isinstance(fields, list) and "engine_data" in fields


class Translator:
    """agentd's SSE chunks -> Dynamo chunks. The finish reason is held back until
    agentd's usage chunk, so the final chunk carries both (Dynamo's contract)."""

    def __init__(self, prompt_len: int, engine_data: bool):
        self.prompt_len = prompt_len
        self.engine_data = engine_data
        self.generated: list[int] = []
        self.finish: Optional[str] = None
        self.usage: Optional[dict[str, Any]] = None
        self.done = False

    def feed(self, data: str) -> Optional[dict[str, Any]]:
        """One `data:` payload; the chunk to yield, if any."""
        if data == "[DONE]":
            self.done = True
            return None
        chunk = json.loads(data)
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise Unknown(f"agentd failed the request mid-stream: {msg}")
        ids: list[int] = []
        for c in chunk.get("choices") or []:
            ids += [int(t) for t in c.get("token_ids") or []]
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = {k: v for k, v in chunk["usage"].items() if k in _USAGE and v is not None}
        if not ids:
            return None
        self.generated += ids
        return {"token_ids": ids, "index": 0}

    def final(self) -> dict[str, Any]:
        usage = self.usage or {
            "prompt_tokens": self.prompt_len,
            "completion_tokens": len(self.generated),
            "total_tokens": self.prompt_len + len(self.generated),
        }
        out: dict[str, Any] = {
            "token_ids": [],
            "index": 0,
            "finish_reason": self.finish or "stop",
            "completion_usage": usage,
        }
        if self.engine_data:
            out["engine_data"] = {"completion_token_ids": list(self.generated), "finished": True}
        return out


class AgentdEngine(LLMEngine):
    """Forwards Dynamo's token-id requests to one agentd node."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.url = args.agentd_url.rstrip("/")
        self.session: Optional[aiohttp.ClientSession] = None
        self.inflight: dict[str, aiohttp.ClientResponse] = {}
        self.card: dict[str, Any] = {}
        self.model_path = ""
        self.served_name = ""
        self.block_size = 0
        self.num_blocks = 0
        self.publisher: Any = None
        self.monitor: Optional[asyncio.Task] = None
        self.stopping = False

    @classmethod
    async def from_args(cls, argv=None):
        args = parse_args(argv)
        engine = cls(args)
        # The Rust worker reads the model (tokenizer, chat template) from
        # WorkerConfig.model_name before start(): ask agentd for it now.
        await engine._probe()
        config = WorkerConfig(
            namespace=args.namespace,
            component=args.component,
            endpoint=args.endpoint,
            model_name=engine.model_path,
            served_model_name=engine.served_name,
            endpoint_types=args.endpoint_types,
            discovery_backend=args.discovery_backend,
            request_plane=args.request_plane,
            event_plane=args.event_plane,
            enable_kv_routing=not args.disable_kv_routing,
        )
        return engine, config

    async def _probe(self) -> None:
        """Waits for agentd, then reads its model, context length and KV pool."""
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.args.connect_timeout_s),
            connector=aiohttp.TCPConnector(limit=0),
        )
        await self._wait_up()
        self.card = json.loads(await self._get("/v1/models"))["data"][0]
        metrics = await self._get("/metrics")
        m = re.search(r'vllm:cache_config_info\{block_size="(\d+)",num_gpu_blocks="(\d+)"', metrics)
        if not m:
            raise CannotConnect(f"agentd at {self.url}: no vllm:cache_config_info in /metrics")
        self.block_size, self.num_blocks = int(m.group(1)), int(m.group(2))
        self.model_path = self.args.model_path or self.card.get("root") or self.card["id"]
        if not os.path.isdir(self.model_path):
            raise CannotConnect(
                f"model directory {self.model_path!r} (agentd's /v1/models root) is not here; "
                "pass --model-path (the frontend needs its tokenizer and chat template)"
            )
        self.served_name = self.args.served_model_name or self.card["id"]

    async def _get(self, path: str) -> str:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=5)
        async with self.session.get(self.url + path, timeout=timeout) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"agentd {path}: HTTP {r.status}: {text[:200]}")
            return text

    async def _wait_up(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.args.startup_timeout_s
        while True:
            try:
                await self._get("/health")
                return
            except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError) as e:
                if asyncio.get_running_loop().time() > deadline:
                    raise CannotConnect(
                        f"agentd at {self.url} not up after {self.args.startup_timeout_s:.0f} s: {e}"
                    ) from e
                await asyncio.sleep(0.5)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        logger.info("agentd at %s: model %s (%s), %d blocks of %d tokens x %d replicas",
                    self.url, self.served_name, self.model_path, self.num_blocks,
                    self.block_size, self.args.replicas)
        self.monitor = asyncio.create_task(self._monitor())
        return EngineConfig(
            model=self.model_path,
            served_model_name=self.served_name,
            llm=LlmRegistration(
                context_length=int(self.card.get("max_model_len") or 0) or None,
                kv_cache_block_size=self.block_size,
                total_kv_blocks=self.num_blocks,
                max_num_seqs=self.args.max_num_seqs,
                max_num_batched_tokens=self.args.max_num_batched_tokens,
                data_parallel_size=self.args.replicas,
            ),
        )

    async def kv_event_sources(self):
        if not self.args.kv_events_endpoint:
            return []
        # agentd publishes replica r on the endpoint's port + r (vLLM's rule).
        parts = urlsplit(self.args.kv_events_endpoint)
        host, port = parts.hostname, parts.port
        if parts.scheme != "tcp" or host is None or port is None:
            raise InvalidArgument("--kv-events-endpoint must be tcp://HOST:PORT")
        return [
            ZmqSource(endpoint=urlunsplit(("tcp", f"{host}:{port + r}", "", "", "")),
                      topic=self.args.kv_events_topic, dp_rank=r)
            for r in range(self.args.replicas)
        ]

    def component_metrics_dp_ranks(self) -> list[int]:
        # agentd's /metrics sums its replicas: one snapshot, on rank 0.
        return [0] if self.args.replicas == 1 else []

    def attach_snapshot_publisher(self, publisher) -> None:
        self.publisher = publisher

    async def _monitor(self) -> None:
        """Health and load: polls agentd every --poll-s; stops the worker when
        agentd has been down for --down-after-s."""
        down_since: Optional[float] = None
        last: Optional[tuple[float, float]] = None
        loop = asyncio.get_running_loop()
        while not self.stopping:
            await asyncio.sleep(self.args.poll_s)
            try:
                text = await self._get("/metrics")
                down_since = None
            except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError) as e:
                now = loop.time()
                down_since = down_since or now
                if now - down_since >= self.args.down_after_s:
                    logger.error("agentd at %s down for %.1f s (%s): stopping this worker so "
                                 "the router stops sending it requests", self.url,
                                 now - down_since, e)
                    self.stopping = True
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                continue
            if self.publisher is not None:
                last = self._publish(text, last)

    def _publish(self, text: str, last):
        def value(name: str) -> Optional[float]:
            m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
            return float(m.group(1)) if m else None

        usage = value("vllm:kv_cache_usage_perc") or 0.0
        hits, queries = value("vllm:prefix_cache_hits_total"), value("vllm:prefix_cache_queries_total")
        rate = None
        if hits is not None and queries is not None:
            if last is not None and queries > last[1]:
                rate = (hits - last[0]) / (queries - last[1])
            last = (hits, queries)
        self.publisher.publish(0, ComponentSnapshot(
            kv_used_blocks=round(usage * self.num_blocks), kv_total_blocks=self.num_blocks,
            gpu_cache_usage=usage, dp_rank=0, kv_cache_hit_rate=rate))
        return last

    async def generate(self, request, context) -> AsyncGenerator[dict[str, Any], None]:
        body, headers = agentd_request(request)
        rid = context.id()
        tr = Translator(len(body["prompt"]), wants_engine_data(request))
        url = self.url + "/v1/completions"
        assert self.session is not None
        try:
            resp = await self.session.post(url, json=body, headers=headers)
        except aiohttp.ClientError as e:
            raise CannotConnect(f"agentd at {self.url} unreachable: {e}") from e
        self.inflight[rid] = resp
        try:
            if resp.status != 200:
                text = (await resp.text())[:500]
                exc = InvalidArgument if 400 <= resp.status < 500 else Unknown
                raise exc(f"agentd HTTP {resp.status}: {text}")
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                out = tr.feed(line[5:].strip().decode())
                if out is not None:
                    yield out
                if tr.done:
                    break
            if not tr.done:
                raise StreamIncomplete(
                    f"agentd at {self.url} closed the stream after {len(tr.generated)} "
                    "tokens without finishing (the node went down?)")
            yield tr.final()
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientConnectionError) as e:
            raise StreamIncomplete(
                f"agentd at {self.url} dropped the stream after {len(tr.generated)} tokens: {e}"
            ) from e
        finally:
            self.inflight.pop(rid, None)
            # Closing (not releasing) drops the connection: agentd aborts a
            # request whose client went away at its next step.
            resp.close()

    async def abort(self, context) -> None:
        resp = self.inflight.pop(context.id(), None)
        if resp is not None:
            resp.close()

    async def cleanup(self) -> None:
        self.stopping = True
        if self.monitor is not None:
            self.monitor.cancel()
            self.monitor = None
        for resp in list(self.inflight.values()):
            resp.close()
        self.inflight.clear()
        if self.session is not None:
            await self.session.close()
            self.session = None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="agentd node as a Dynamo worker")
    p.add_argument("--agentd-url", default=os.environ.get("AGENTD_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model-path", default=None,
                   help="model directory (tokenizer, chat template); default: agentd's /v1/models root")
    p.add_argument("--served-model-name", default=None,
                   help="default: agentd's model id; behind a router, a name of its own")
    p.add_argument("--kv-events-endpoint", default=None,
                   help="tcp://HOST:PORT where agentd publishes KV events (its --kv-events-config "
                        "endpoint as seen from here); replica r on PORT + r")
    p.add_argument("--kv-events-topic", default="", help="ZMQ topic filter (default: all)")
    p.add_argument("--replicas", type=int, default=1, help="agentd's --replicas (its DP ranks)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--component", default="backend")
    p.add_argument("--endpoint", default="generate")
    p.add_argument("--endpoint-types", default="chat,completions",
                   help="chat and/or completions ('none' is refused by Dynamo 1.6.1's worker: "
                        "behind a router, register under another --served-model-name)")
    p.add_argument("--discovery-backend", default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"))
    p.add_argument("--request-plane", default=os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    p.add_argument("--event-plane", default=os.environ.get("DYN_EVENT_PLANE"))
    p.add_argument("--disable-kv-routing", action="store_true")
    p.add_argument("--startup-timeout-s", type=float, default=120.0)
    p.add_argument("--connect-timeout-s", type=float, default=5.0)
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--down-after-s", type=float, default=2.0)
    args = p.parse_args(argv)
    if args.replicas < 1:
        p.error("--replicas must be >= 1")
    # Said here rather than as Dynamo's traceback after agentd was probed.
    if "none" in (t.strip().lower() for t in args.endpoint_types.split(",")):
        p.error("--endpoint-types none: Dynamo 1.6.1's common-backend worker refuses it "
                "(unknown endpoint type 'none'); behind a router, register under a name of "
                "its own (--served-model-name MODEL-worker --endpoint-types completions)")
    return args


def main() -> None:
    run(AgentdEngine)


if __name__ == "__main__":
    main()
