"""Stock SGLang's prompt limit, so the gateway can refuse a prompt it will never take ahead of
admission (context.py), as it does over this project's engines (why: docs/design/overload.md).

Our engines report their limit in every `/get_load` answer; stock SGLang's load route
(`/v1/loads`) has none. So each SGLang pod is asked once, when its load route first answers (a
setting: it does not change while the pod lives); one that did not answer is asked again
`RETRY_S` later. Until it answers, or when its answer is not what this module reads, it has no
limit. A pod whose load poll failed is asked again (`forget`): it may be another SGLang at the
same address.

- `GET /v1/models`: the card's `max_model_len` is the tokenizer manager's `context_len`
  (sglang/srt/entrypoints/http_server.py `available_models`), the very figure SGLang's check
  compares a prompt with. OpenAI's route, present in every SGLang version, and cheap.
- `GET /server_info` (`/get_server_info` where that is 404: SGLang before 0.5): its server
  arguments, flat. SGLang refuses a prompt of `tokens >= context_len` (prompt_rules.py has the
  message) unless `allow_auto_truncate` (it cuts the prompt and serves it: `ANY_LENGTH`, which
  wins over other pods' limits, engine_load.py); with a speculative algorithm (EAGLE) it adds
  reserved draft slots to the count, in the check and in its message, by a figure it does not
  publish: no limit (SGLang decides). The gateway refuses only what SGLang would refuse, in its
  words."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from collections.abc import Iterable
from typing import Protocol

from laps_agent.gateway.proxy.upstream import UpstreamError, UpstreamPool, address
from laps_agent.modelio.prompt_rules import PromptLimit
from laps_agent.policy.routing import Endpoint

log = logging.getLogger(__name__)
MODELS_PATH = "/v1/models"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
TIMEOUT_S = 5.0    # /server_info waits on every scheduler's internal state: not a load poll's
RETRY_S = 30.0
# An SGLang that truncates an over-long prompt (--allow-auto-truncate) and serves it: a known
# limit, unlike None (unknown), so that it wins the largest of the pods' limits (a rollout adding
# the flag must not keep the old pods' limit refusing prompts the new pods serve).
ANY_LENGTH = PromptLimit(sys.maxsize, sglang=True)


def context_length(body: bytes) -> int | None:
    """The context length in an SGLang `/v1/models` answer (its base model's card; a LoRA
    adapter's card says null); None when it names none. ValueError: not JSON."""
    cards = json.loads(body).get("data") or ()
    lengths = [card["max_model_len"] for card in cards
               if isinstance(card, dict) and type(card.get("max_model_len")) is int]
    return max(lengths) if lengths else None


def server_limit(server_info: bytes, context: int) -> PromptLimit | None:
    """The limit of an SGLang with these server arguments and context length: `context - 1`
    when it refuses exactly the prompts of `tokens >= context_len` (with the message
    prompt_rules.py words), ANY_LENGTH when it truncates them, None when it refuses by a figure
    it does not publish (speculative decoding). ValueError: not SGLang's server arguments."""
    info = json.loads(server_info)
    if not isinstance(info, dict) or "allow_auto_truncate" not in info:
        raise ValueError("not SGLang's server arguments")
    if info["allow_auto_truncate"]:
        return ANY_LENGTH
    if str(info.get("speculative_algorithm") or "none").lower() != "none":
        return None
    return PromptLimit(context - 1, sglang=True)


async def fetch_limit(pool: UpstreamPool, url: str) -> PromptLimit | None:
    """The limit of the SGLang server at `url` (server_limit; None also when it names no
    context). UpstreamError: it did not answer; ValueError: not SGLang's answers."""
    host, port = address(url)
    models = await pool.get(host, port, MODELS_PATH)
    body = await models.read()
    if models.status != 200:
        raise UpstreamError(f"{MODELS_PATH} answered {models.status}")
    context = context_length(body)
    if context is None or context < 2:
        return None
    for path in SERVER_INFO_PATHS:
        info = await pool.get(host, port, path)
        body = await info.read()
        if info.status != 404:
            break
    else:   # a server with SGLang's /v1/models but neither route: asking again changes nothing
        raise ValueError(f"neither of {', '.join(SERVER_INFO_PATHS)} is served")
    if info.status != 200:
        raise UpstreamError(f"{path} answered {info.status}")
    return server_limit(body, context)


class LimitSink(Protocol):
    """Where a learnt limit goes (engine_load.EngineLoads, which keeps each pod's limit)."""

    def learnt_limit(self, name: str, limit: PromptLimit | None) -> None: ...


class SGLangLimits:
    """Asks each SGLang pod its limit (in the background, on connections of its own: an answer
    may take longer than a load poll may wait) and gives it to `loads`."""

    def __init__(self, loads: LimitSink) -> None:
        self._loads = loads
        self._pool = UpstreamPool(connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S, max_idle_per_host=0)
        self._due: dict[str, float] = {}            # pod -> when to ask it (again); inf: known
        self._asking: dict[str, asyncio.Task] = {}

    def ask(self, endpoint: Endpoint) -> None:
        """Ask `endpoint` its limit, unless it is known, being asked, or failed lately."""
        loop = asyncio.get_running_loop()
        if endpoint.name not in self._asking and self._due.get(endpoint.name, 0.0) <= loop.time():
            self._asking[endpoint.name] = loop.create_task(self._learn(endpoint))

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget pods that left: one that comes back is asked again."""
        keep = set(names)
        for name in [n for n in self._due if n not in keep]:
            del self._due[name]
        for name in [n for n in self._asking if n not in keep]:
            self._asking.pop(name).cancel()

    def forget(self, name: str) -> None:
        """A load poll of pod `name` failed other than by a timeout: forget its limit and ask
        again once its load route answers. With static discovery an SGLang restarted with
        another --context-length (or --allow-auto-truncate) comes back at the same address,
        and this is how its restart shows: its port refuses connections while it loads its
        model, and the old keep-alive connections break. Cheaper than asking every pod again
        on a slow period, which costs a /server_info (it waits on every scheduler) per pod per
        period and still keeps the old limit up to a period: this costs nothing while the pod
        serves. A timeout is no restart: a loaded SGLang answers slowly, and forgetting then
        would ask /server_info when it is busiest and leave long prompts unrefused meanwhile."""
        if (task := self._asking.pop(name, None)) is not None:
            task.cancel()   # it may be answered by the SGLang that went away
        if self._due.get(name) == math.inf:
            del self._due[name]
            self._loads.learnt_limit(name, None)

    async def stop(self) -> None:
        for task in self._asking.values():
            task.cancel()
        await asyncio.gather(*self._asking.values(), return_exceptions=True)
        await self._pool.aclose()

    async def _learn(self, endpoint: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                limit = await fetch_limit(self._pool, endpoint.url)
        except (UpstreamError, TimeoutError) as exc:
            log.info("SGLang pod %s did not say its context length (asked again in %.0f s): %s",
                     endpoint.name, RETRY_S, exc)
            self._due[endpoint.name] = loop.time() + RETRY_S
            return
        except Exception as exc:   # noqa: BLE001 - another server's answers, whatever they break
            # Not asked again (a warning once, not on every poll): its limit is left to it.
            log.warning("SGLang pod %s: its prompt limit is left to it (%r)", endpoint.name, exc)
            limit = None
        else:
            if limit is None:
                log.info("SGLang pod %s: its prompt limit is left to it (it names no context, or "
                         "decodes speculatively)", endpoint.name)
            else:
                log.info("SGLang pod %s takes prompts of %s tokens", endpoint.name, "any number of"
                         if limit == ANY_LENGTH else f"at most {limit.tokens}")
        finally:
            # Only its own entry: a task cancelled as its pod left may end after the pod came
            # back and a new task was started for it, which stop() must still find.
            if self._asking.get(endpoint.name) is asyncio.current_task():
                del self._asking[endpoint.name]
        self._due[endpoint.name] = math.inf
        self._loads.learnt_limit(endpoint.name, limit)
