"""Drive `agentd serve` with SkyRL's own HTTP client (`RemoteInferenceClient`
from the `skyrl` wheel on PyPI, unchanged): the calls a SkyRL trainer makes
on vLLM between and during rollouts.

Usage: python scripts/trainer_client_check.py URL REFERENCE_URL CKPT2
  URL            agentd serve with VLLM_SERVER_DEV_MODE=1, on the first checkpoint
  REFERENCE_URL  agentd serve on the second checkpoint (CKPT2), for its output
  CKPT2          the second checkpoint's directory (an absolute path)

Everything called is the wheel's code, unchanged. Two stand-ins are
installed before it is imported, each only where it is needed:
- skyrl 0.4 imports torch when loaded (trainer-side helpers: dataclass
  annotations, dtype constants), though none of the calls below runs torch
  code; where torch is absent, `_torch_stand_in` provides those names so the
  client imports without a multi-GB CUDA build of torch.
- skyrl 0.3.0 declares Python >= 3.11, but its `skyrl.tinker.types` (loaded
  by the package, not used by the client) hands pydantic a
  `typing.TypedDict`, which pydantic refuses below Python 3.12; there,
  `typing.TypedDict` is pointed at `typing_extensions.TypedDict`, the class
  pydantic asks for, before the import.
Exits non-zero on the first failure.
"""

import asyncio
import importlib.util
import json
import sys
import types
import typing
import urllib.request


def _torch_stand_in():
    """The names skyrl's modules touch at import time, and nothing else."""
    torch = types.ModuleType("torch")

    class _Type:
        pass

    class Size(tuple):
        pass

    torch.Tensor, torch.device, torch.dtype, torch.Size = _Type, _Type, _Type, Size
    for name in ["int8", "int16", "int32", "int64", "long", "bool", "uint8", "uint16",
                 "float16", "bfloat16", "float32", "float64"]:
        setattr(torch, name, _Type())
    sys.modules["torch"] = torch


if importlib.util.find_spec("torch") is None:
    _torch_stand_in()
if sys.version_info < (3, 12):
    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict
from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (  # noqa: E402
    RemoteInferenceClient,
)

url, ref_url, ckpt2 = sys.argv[1], sys.argv[2], sys.argv[3]


def http(base, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read() or b"null")


async def is_sleeping(client):
    """The client's own call where it has one (skyrl >= 0.4: one bool for
    its servers), else vLLM's route read directly on every server."""
    if hasattr(client, "is_sleeping"):
        return await client.is_sleeping()
    return all(http(u, "/is_sleeping")["is_sleeping"] for u in client.server_urls)


def programs(base):
    return [p["id"] for p in http(base, "/programs")]


async def main():
    model = http(url, "/v1/models")["data"][0]["id"]
    client = RemoteInferenceClient(proxy_url=url, server_urls=[url],
                                   data_parallel_size=1, model_name=model)
    ref = RemoteInferenceClient(proxy_url=ref_url, server_urls=[ref_url],
                                data_parallel_size=1, model_name=model)
    prompt = ("You are an agent in a repository. Run the tests, read the "
              "failures and fix them. " * 4)
    [ids] = await client.tokenize([prompt])
    print(f"tokenize: {len(ids)} ids")
    # SkyRL's vLLM sampling params (engine_utils.get_vllm_sampling_params), greedy.
    sp = {"min_tokens": 1, "skip_special_tokens": True, "include_stop_str_in_output": True,
          "max_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
          "logprobs": 0, "stop": None}
    out = await client.generate({"prompt_token_ids": [ids], "sampling_params": sp,
                                 "session_ids": ["traj-1"]})
    got = out["response_ids"][0]
    print("generate:", got, out["stop_reasons"], [round(x, 3) for x in out["response_logprobs"][0][:4]], "...")
    want = http(url, "/v1/completions", {"prompt": ids, "max_tokens": 16, "temperature": 0,
                                         "return_token_ids": True})["choices"][0]["token_ids"]
    assert got == want, (got, want)
    print("  == /v1/completions for the same ids")
    assert len(out["response_logprobs"][0]) == len(got)
    assert out["responses"][0] == http(url, "/detokenize", {"tokens": got})["prompt"]

    # Turn 2 of the same trajectory: its program kept the first turn's KV.
    assert "traj-1" in programs(url), programs(url)
    turn2 = ids + got + (await client.tokenize([" Tool output: 3 failed."]))[0]
    out2 = await client.generate({"prompt_token_ids": [turn2], "sampling_params": sp,
                                  "session_ids": ["traj-1"]})
    print("turn 2:", out2["response_ids"][0], out2["stop_reasons"])
    await client.finish_session("traj-1")
    assert "traj-1" not in programs(url), programs(url)
    print("finish_session: traj-1 released; /programs:", programs(url))

    print("get_world_size:", await client.get_world_size())
    print("pause(keep):", await client.pause(mode="keep"))
    print("resume:", await client.resume())
    print("reset_prefix_cache:", await client.reset_prefix_cache())
    slept = await client.sleep(level=1)
    asleep = await is_sleeping(client)
    print("sleep(level=1):", slept, "is_sleeping:", asleep)
    assert asleep is True
    woke = await client.wake_up()
    asleep = await is_sleeping(client)
    print("wake_up:", woke, "is_sleeping:", asleep)
    assert asleep is False
    again = await client.generate({"prompt_token_ids": [ids], "sampling_params": sp})
    assert again["response_ids"][0] == got, "the same tokens after sleep and wake-up"

    # Weight sync from a checkpoint directory: vLLM's /update_weights.
    print("pause(abort):", await client.pause(mode="abort"))
    print("update_named_weights:", await client.update_named_weights({"path": ckpt2}))
    print("resume:", await client.resume())
    client.increment_weight_version()
    new = await client.generate({"prompt_token_ids": [ids], "sampling_params": sp})
    want2 = await ref.generate({"prompt_token_ids": [ids], "sampling_params": sp})
    print("after the update:", new["response_ids"][0],
          [round(x, 3) for x in new["response_logprobs"][0][:4]], "...")
    assert new["response_ids"][0] == want2["response_ids"][0], (new, want2)
    assert new["response_logprobs"] == want2["response_logprobs"]
    print("  == the second checkpoint's own server")
    # Random tiny checkpoints may agree on the argmax: the logprobs differ.
    assert new["response_ids"][0] != got or new["response_logprobs"] != out["response_logprobs"]
    print("  != the first checkpoint's output")
    await client.teardown()
    await ref.teardown()
    print("OK: SkyRL's RemoteInferenceClient drove agentd")


asyncio.run(main())
