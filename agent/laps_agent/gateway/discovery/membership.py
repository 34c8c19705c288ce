"""Which pods the gateway may route to, behind one interface for every mode.

`Membership` is an immutable snapshot (prefill groups "short"/"long" and decode pods); a
discovery replaces it whole when something changes, so a request reads one consistent view.
`StaticDiscovery` serves local mode (URL lists, or a JSON/YAML file re-read when it changes);
`laps_agent.gateway.discovery.kubernetes.KubernetesDiscovery` watches EndpointSlices."""
from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from laps_agent.policy.classes import CLASSES, LONG, SHORT
from laps_agent.policy.routing import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Membership:
    groups: Mapping[str, tuple[Endpoint, ...]] = field(
        default_factory=lambda: {g: () for g in CLASSES})
    decode: tuple[Endpoint, ...] = ()

    def endpoints(self) -> list[Endpoint]:
        """Every pod: the prefill groups', then the decode pool's."""
        return [e for group in self.groups.values() for e in group] + list(self.decode)


class Discovery(abc.ABC):
    @abc.abstractmethod
    def membership(self) -> Membership: ...

    async def start(self) -> None:  # noqa: B027 - optional hook: static membership tracks nothing
        """Begin tracking; returns without waiting for the first pods to appear."""

    async def stop(self) -> None:  # noqa: B027 - optional hook, as start
        """Stop every task or thread started by `start`."""


@dataclass(frozen=True)
class StaticSpec:
    prefill_short: tuple[str, ...] = ()
    prefill_long: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Mapping) -> StaticSpec:
        if not isinstance(data, Mapping):
            raise ValueError("static membership must be a mapping of URL lists")
        unknown = set(data) - {"prefill_short", "prefill_long", "decode"}
        if unknown:
            raise ValueError(f"unknown keys in static membership: {sorted(unknown)}")
        return cls(*(tuple(_check_url(u) for u in data.get(k) or ())
                     for k in ("prefill_short", "prefill_long", "decode")))

    @classmethod
    def from_file(cls, path: Path) -> StaticSpec:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return cls.from_mapping(yaml.safe_load(text) or {})
        return cls.from_mapping(json.loads(text))

    def write(self, path: Path) -> None:
        """Atomically replace `path` (a reader never sees half a file)."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"prefill_short": list(self.prefill_short),
                                   "prefill_long": list(self.prefill_long),
                                   "decode": list(self.decode)}, indent=1))
        tmp.replace(path)


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"endpoint URL must look like http://host:port, got {url!r}")
    return url.rstrip("/")


def split_urls(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(_check_url(u.strip()) for u in items if u.strip())


def endpoint_name(url: str) -> str:
    """The name static discovery gives the endpoint at `url` (its host:port): what the load
    tracker and the engines' reports are keyed by."""
    return urlsplit(url).netloc


class StaticDiscovery(Discovery):
    """Fixed URLs. An endpoint joins the membership once its `/get_server_info` answered (that
    also gives a prefill engine's bootstrap port, cached from then on), so engines still loading
    their model are not routed to."""

    def __init__(self, spec: StaticSpec | None = None, *, file: Path | None = None,
                 poll_s: float = 0.5) -> None:
        if (spec is None) == (file is None):
            raise ValueError("give exactly one of a static spec or a membership file")
        self._file, self._poll_s = file, poll_s
        self._spec = spec if spec is not None else StaticSpec.from_file(file)
        self._file_mtime = file.stat().st_mtime_ns if file else None
        self._bootstrap: dict[str, int | None] = {}  # url -> bootstrap port, once resolved
        self._membership = Membership()
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None

    def membership(self) -> Membership:
        return self._membership

    @property
    def spec(self) -> StaticSpec:
        return self._spec

    async def update(self, spec: StaticSpec) -> None:
        """Change the membership now (`laps local`'s allocation loop moves pods); with a
        membership file, the file is rewritten, so a restart keeps the change."""
        if self._file is not None:
            spec.write(self._file)
        self._spec = spec
        await self._refresh()

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(2.0), trust_env=False)
        await self._refresh()
        self._task = asyncio.create_task(self._run(), name="static-discovery")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self._refresh()
            except Exception:  # a bad file edit must not end discovery
                log.exception("static discovery refresh failed")

    def _reload_file(self) -> None:
        mtime = self._file.stat().st_mtime_ns
        if mtime != self._file_mtime:
            self._spec = StaticSpec.from_file(self._file)
            self._file_mtime = mtime
            log.info("membership file %s reloaded", self._file)

    async def _refresh(self) -> None:
        if self._file is not None:
            try:
                self._reload_file()
            except (OSError, ValueError) as exc:
                log.warning("keeping the previous membership: %s", exc)
        spec = self._spec
        urls = {*spec.prefill_short, *spec.prefill_long, *spec.decode}
        unresolved = [u for u in urls if u not in self._bootstrap]
        if unresolved:
            await asyncio.gather(*(self._resolve(u) for u in unresolved))
        self._membership = Membership(
            groups={SHORT: self._endpoints(spec.prefill_short),
                    LONG: self._endpoints(spec.prefill_long)},
            decode=self._endpoints(spec.decode))

    async def _resolve(self, url: str) -> None:
        try:
            response = await self._client.get(f"{url}/get_server_info")
            response.raise_for_status()
            info = response.json()
            # Builtin engines say `bootstrap_port`; stock SGLang `disaggregation_bootstrap_port`
            # (a prefill server's; a decode server reports the default too, which means nothing).
            port = info.get("bootstrap_port")
            if port is None and info.get("disaggregation_mode") == "prefill":
                port = info.get("disaggregation_bootstrap_port")
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # not up yet; asked again on the next poll
        self._bootstrap[url] = int(port) if port is not None else None
        log.info("endpoint %s is up (bootstrap port %s)", url, port)

    def _endpoints(self, urls: Sequence[str]) -> tuple[Endpoint, ...]:
        return tuple(
            Endpoint(name=endpoint_name(u), url=u, bootstrap_host=urlsplit(u).hostname,
                     bootstrap_port=self._bootstrap[u])
            for u in urls if u in self._bootstrap)
