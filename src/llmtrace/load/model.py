"""The load's data model: what is planned, what one request measured, and what a run produced.

Frozen dataclasses, no I/O: the planners (arrivals, replay) produce :class:`PlannedRequest`
lists, the client turns each into a :class:`RequestResult`, and the report is a pure function
of the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """How one request ended, from the client's side."""

    OK = "ok"
    #: The server answered with a non-2xx status.
    HTTP_ERROR = "http_error"
    #: No complete answer within --timeout.
    TIMEOUT = "timeout"
    #: The connection failed or broke (refused, reset, closed mid-stream).
    CONNECTION_ERROR = "connection_error"
    #: A 2xx answer that is not what an OpenAI-compatible server sends (no SSE on a stream
    #: request, unparsable JSON, no choices).
    PROTOCOL_ERROR = "protocol_error"
    #: A chaos client did what it was told (hung up, sent junk, read slowly); never a server error.
    CHAOS = "chaos"
    #: The run ended (Ctrl-C, --duration) before the answer did.
    CANCELLED = "cancelled"


class Chaos(str, Enum):
    """What a chaos client does instead of a well-behaved request."""

    DISCONNECT = "disconnect"  # hangs up after a few chunks of a stream
    MALFORMED = "malformed"  # sends a body that is not a valid request; a 4xx is the right answer
    SLOW_READER = "slow-reader"  # reads the stream slowly, applying back-pressure


@dataclass(frozen=True)
class Step:
    """One load step: an offered rate (open loop) or a number of clients (closed loop)."""

    index: int
    start_s: float
    duration_s: float
    qps: float | None = None
    concurrency: int | None = None

    @property
    def label(self) -> str:
        if self.qps is not None:
            return f"qps={self.qps:g}"
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        return "replay"


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: when (seconds from the run's start), how long its prompt and answer are."""

    at_s: float
    input_tokens: int
    output_tokens: int
    step: int = 0
    #: Prefix blocks shared with other requests (Mooncake ``hash_ids``): equal ids, equal text.
    prefix_blocks: tuple[int, ...] = ()
    chaos: Chaos | None = None


@dataclass(frozen=True)
class RequestResult:
    """What the client measured for one request. Times are seconds; latencies count from the
    request's *intended* send time (``scheduled_s``), so a late send is never hidden."""

    index: int
    step: int
    scheduled_s: float
    send_lag_s: float
    outcome: Outcome
    input_tokens: int
    output_tokens: int = 0
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: tuple[float, ...] = ()
    status: int | None = None
    error: str | None = None
    chaos: Chaos | None = None
    trace_id: str | None = None
    #: What the answer said about itself: ``id``, ``model`` and the first choice's ``finish_reason``.
    response_id: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    #: Time spent waiting for a connection of the client's pool (``--max-connections``), inside e2e.
    pool_wait_s: float = 0.0

    @property
    def counts_as_server_error(self) -> bool:
        return self.outcome in (Outcome.HTTP_ERROR, Outcome.CONNECTION_ERROR, Outcome.PROTOCOL_ERROR)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in seconds; ``None`` is no objective on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, result: RequestResult) -> bool:
        """A request meets the SLO when it succeeded and every set objective holds."""
        if result.outcome is not Outcome.OK:
            return False
        checks = ((self.ttft_s, result.ttft_s), (self.tpot_s, result.tpot_s), (self.e2e_s, result.e2e_s))
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None


@dataclass(frozen=True)
class SelfCheck:
    """How the load tool itself kept up: send lag and its own CPU."""

    send_lag_p50_s: float
    send_lag_p99_s: float
    send_lag_max_s: float
    cpu_s: float
    wall_s: float
    processes: int

    @property
    def cpu_share(self) -> float:
        """CPU seconds per wall second per process (1.0: one core saturated)."""
        return self.cpu_s / max(self.wall_s * self.processes, 1e-9)


@dataclass(frozen=True)
class RunResult:
    """Everything one run measured, also when it ended early."""

    url: str
    endpoint: str
    profile: str
    steps: tuple[Step, ...]
    results: tuple[RequestResult, ...]
    wall_s: float
    self_check: SelfCheck
    interrupted: str | None = None
    #: Prompt tokens per synthetic word, as measured against the server (None: not calibrated).
    tokens_per_word: float | None = None
    warnings: tuple[str, ...] = field(default=())
