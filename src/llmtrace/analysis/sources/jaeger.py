"""Jaeger query API client: ``/api/v3/traces`` (Jaeger v2; OTLP JSON) and the legacy
``/api/traces`` (Jaeger JSON model).

Both APIs cap a search at a number of traces (``query.search_depth`` / ``limit``) and say
nothing when the cap cut the answer short. The client therefore treats a window that
returns exactly the limit as truncated and splits it in half, recursively, down to
:data:`MIN_WINDOW_NS`; traces that straddle two halves come back twice and are de-duplicated
by the model builder. A ``404`` from v3 means "no traces in this window", not an error.

The HTTP client is ``httpx`` (the ``analysis`` extra) with an injectable transport, so tests
can run against ``httpx.MockTransport`` where a real Jaeger is not the point.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.model import Span
from llmtrace.analysis.sources._json import iter_documents
from llmtrace.analysis.sources.files import ReadStats, spans_from_document
from llmtrace.analysis.sources.otlp import Interner

if TYPE_CHECKING:
    import httpx

#: Below one millisecond a window cannot be split further in the legacy API (µs resolution
#: makes halves meaningless) and a trace burst that dense is better fetched with a higher
#: --limit; the client then keeps what it got and warns.
MIN_WINDOW_NS = 1_000_000
#: Jaeger's own default search depth for v3.
DEFAULT_LIMIT = 1000
_SELF_SERVICES = ("jaeger", "jaeger-all-in-one", "jaeger-query", "jaeger-collector")

ProgressFn = Callable[[int, int], None]


def rfc3339(ns: int) -> str:
    """Format Unix nanoseconds as RFC 3339 with nanoseconds, the v3 API's time format."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}Z"


class JaegerSource:
    """Fetch spans from a Jaeger query service at ``base_url`` (e.g. ``http://host:16686``)."""

    def __init__(
        self,
        base_url: str,
        *,
        api: str = "auto",
        limit: int = DEFAULT_LIMIT,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise SourceError(base_url, "reading from Jaeger needs httpx: pip install 'llmtrace[analysis]'") from None
        self.base_url = base_url.rstrip("/")
        self.limit = limit
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)
        self._api = api
        self.stats = ReadStats()
        self.warnings: list[str] = []
        self._intern = Interner()

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ plumbing
    def _get(self, path: str, params: dict[str, Any]) -> httpx.Response:
        try:
            return self._client.get(path, params=params)
        except self._httpx.HTTPError as exc:
            raise SourceError(self.base_url, f"cannot reach Jaeger: {type(exc).__name__}: {exc}", path) from None
        except (self._httpx.InvalidURL, UnicodeError) as exc:  # a service name no URL can carry
            raise SourceError(self.base_url, f"cannot query Jaeger with {params}: {exc}", path) from None

    def _fail(self, resp: httpx.Response, path: str) -> SourceError:
        body = resp.text.strip().replace("\n", " ")[:200]
        return SourceError(self.base_url, f"HTTP {resp.status_code}: {body}", path)

    @property
    def api(self) -> str:
        if self._api == "auto":
            resp = self._get("/api/v3/services", {})
            self._api = "v3" if resp.status_code == 200 else "legacy"
        return self._api

    def services(self) -> list[str]:
        path = "/api/v3/services" if self.api == "v3" else "/api/services"
        resp = self._get(path, {})
        if resp.status_code != 200:
            raise self._fail(resp, path)
        try:
            body = resp.json()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
            raise SourceError(self.base_url, "malformed JSON in the services list", path) from None
        names = (body.get("services") if self.api == "v3" else body.get("data")) if isinstance(body, dict) else None
        if names is not None and not isinstance(names, list):
            raise SourceError(self.base_url, f"the services list is {type(names).__name__}, not a list", path)
        return sorted(str(s) for s in names or () if str(s) not in _SELF_SERVICES)

    # ------------------------------------------------------------------ fetching
    def iter_spans(
        self, services: list[str] | None, start_ns: int, end_ns: int, progress: ProgressFn | None = None
    ) -> Iterator[Span]:
        """Yield every span of every trace that started in ``[start_ns, end_ns]``."""
        names = services or self.services()
        if not names:
            return
        total = (end_ns - start_ns) * len(names)
        done = 0
        for service in names:
            for lo, hi, spans in self._windows(service, start_ns, end_ns):
                yield from spans
                done += hi - lo
                if progress is not None:
                    progress(done, total)

    def _windows(self, service: str, lo: int, hi: int) -> Iterator[tuple[int, int, list[Span]]]:
        stack = [(lo, hi)]
        while stack:
            a, b = stack.pop()
            spans, traces = self._fetch(service, a, b)
            if traces >= self.limit:
                if b - a > MIN_WINDOW_NS:
                    mid = (a + b) // 2
                    stack.append((mid + 1, b))
                    stack.append((a, mid))
                    continue
                self.warnings.append(
                    f"{self.base_url}: {traces} traces of {service} in {rfc3339(a)}..{rfc3339(b)} hit the "
                    f"limit in a window that cannot be split further; raise --limit"
                )
            yield a, b, spans

    def _fetch(self, service: str, a: int, b: int) -> tuple[list[Span], int]:
        if self.api == "v3":
            path = "/api/v3/traces"
            params: dict[str, Any] = {
                "query.service_name": service,
                "query.start_time_min": rfc3339(a),
                "query.start_time_max": rfc3339(b),
                # Jaeger v2 (1.76) needs num_traces and rejects search_depth alone ("search depth
                # must be greater than 0 and less than max traces"); both are sent, as its UI does.
                "query.search_depth": self.limit,
                "query.num_traces": self.limit,
            }
        else:
            path = "/api/traces"
            params = {"service": service, "start": a // 1000, "end": b // 1000, "limit": self.limit}
        resp = self._get(path, params)
        if resp.status_code == 404 and self.api == "v3":
            return [], 0
        if resp.status_code != 200:
            raise self._fail(resp, path)
        spans: list[Span] = []
        position = f"{path}?service={service}&window={rfc3339(a)}..{rfc3339(b)}"
        for i, doc in enumerate(_documents(resp.text, self.base_url, position)):
            spans.extend(
                spans_from_document(
                    doc,
                    source=self.base_url,
                    position=f"{position} chunk {i}",
                    intern=self._intern,
                    stats=self.stats,
                )
            )
        self.stats.spans += len(spans)
        self.stats.unknown_kinds |= self._intern.unknown_kinds
        return spans, len({s.trace_id for s in spans})


def _documents(text: str, source: str, position: str) -> Iterator[Any]:
    """A v3 response streams one ``{"result": ...}`` object per chunk; decode them all."""
    try:
        for _, doc in iter_documents(text):
            yield doc
    except json.JSONDecodeError as exc:
        raise SourceError(source, f"malformed JSON in response: {exc.msg}", f"{position} char {exc.pos}") from None
