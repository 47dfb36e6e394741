"""Bottleneck diagnosis: which resource limits the server, with evidence and a remedy.

Every class gets a score in [0, 1] from the measurements below; the highest score wins,
and a score under :data:`MIN_SCORE` means nothing is saturated (``none``: the server has
headroom). The same rules run per ``llm.engine`` window with the window's own numbers, so
a report can say "compute-bound at peak, host-bound in the tail".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from llmtrace import semconv as sc
from llmtrace.analysis._steps import StepStats
from llmtrace.analysis.gpu_idle import EngineIdle
from llmtrace.analysis.model import RequestView, WindowView
from llmtrace.analysis.prefix_cache import PrefixCacheStats


class Bottleneck(str, Enum):
    COMPUTE = "compute"
    MEMORY = "kv-memory"
    HOST = "host-scheduling"
    QUEUEING = "queueing-load"
    NETWORK = "network-streaming"
    PREFIX_MISS = "prefix-cache-misses"
    NONE = "none"


#: Below this no class is called a bottleneck: the evidence is too weak to act on.
MIN_SCORE = 0.35
#: GPU busy (forward) share of the sampled time above which the device is the limit; vLLM
#: at saturation runs forwards ~90-95% of wall time, the rest is unavoidable step overhead.
BUSY_SATURATED = 0.85
#: Share of idle-with-work time with the engine's own queue empty above which the engine is
#: starved by its front end rather than slow between steps.
UPSTREAM_STARVED = 0.5
#: Idle-with-work-waiting share of sampled time at which host overhead costs real
#: throughput: 30% idle with requests in flight is a third more tokens left on the table.
HOST_IDLE_FULL = 0.30
#: Preemptions per request at which recomputation dominates (each preemption redoes a
#: prefill); 0.2 = one request in five is evicted at least once.
PREEMPT_FULL = 0.2
#: KV-cache usage at which the block manager starts refusing admissions.
KV_HIGH = 0.9
#: Queue share of request latency at which users feel load rather than model speed.
QUEUE_FULL = 0.4
#: Network/streaming share of latency at which the HTTP layer, not the model, is the cost.
NETWORK_FULL = 0.3
#: Prefill share of request latency at which recomputing prompts is what users wait for
#: (a chat request with a cached system prompt spends most of its TTFT elsewhere).
PREFILL_FULL = 0.4


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A verdict: the class, its score, the numbers behind it, what to do."""

    cls: Bottleneck
    score: float
    evidence: Mapping[str, float]
    recommendation: str
    scores: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Features:
    busy_ratio: float
    idle_with_work_ratio: float
    host_cause_share: Mapping[str, float]
    #: Of the idle-with-work time, the share when the engine held no request (work upstream);
    #: None where it is not measured (a window's features).
    upstream_share: float | None
    preemptions_per_request: float
    kv_usage_p90: float
    queue_share: float
    queue_growth: float
    network_share: float
    mean_batch: float
    #: Whether the data holds an engine timeline (sampled ``llm.forward`` time): without one
    #: (vLLM's own tracing, a front end traced alone) compute, KV-memory and host limits are
    #: unmeasured, not absent.
    engine_observed: bool = True
    #: Prefill's share of request latency.
    prefill_share: float = 0.0
    #: Share of prompt tokens the engine computed (not served by its prefix cache or a KV
    #: transfer); None where no engine reported it, and then the class is not scored.
    cache_miss_share: float | None = None
    #: Requests with a real prefix-cache hit, of those that reported (shared prefixes exist).
    cache_hit_requests_share: float = 0.0


def _clip(x: float) -> float:
    return max(0.0, min(1.0, x))


def score(f: Features) -> dict[Bottleneck, float]:
    saturated = _clip((f.busy_ratio - 0.5) / (BUSY_SATURATED - 0.5))
    return {
        Bottleneck.COMPUTE: saturated * (1.0 - _clip(f.idle_with_work_ratio / HOST_IDLE_FULL)) * 0.9,
        Bottleneck.MEMORY: max(
            _clip(f.preemptions_per_request / PREEMPT_FULL),
            _clip((f.kv_usage_p90 - KV_HIGH) / (1 - KV_HIGH)) * (1.0 if f.queue_growth > 0 else 0.6),
        ),
        Bottleneck.HOST: _clip(f.idle_with_work_ratio / HOST_IDLE_FULL),
        # Queueing needs a saturated engine or a growing queue behind it; with no engine timeline
        # the requests' own queue share is the only evidence there is, and it is taken alone.
        Bottleneck.QUEUEING: _clip(f.queue_share / QUEUE_FULL)
        * (max(saturated, _clip(f.queue_growth)) if f.engine_observed else 1.0),
        Bottleneck.NETWORK: _clip(f.network_share / NETWORK_FULL),
        # Only where the engine reported prompt provenance: scored from nothing, it would read as
        # "no misses" when it is "not measured".
        **({Bottleneck.PREFIX_MISS: _clip(f.prefill_share / PREFILL_FULL) * f.cache_miss_share}
           if f.cache_miss_share is not None else {}),
    }


#: Ties between scores go to the class declared first.
_DECLARED = {b: i for i, b in enumerate(Bottleneck)}


def diagnose(f: Features) -> Diagnosis:
    scores = score(f)
    cls, best = max(scores.items(), key=lambda kv: (kv[1], -_DECLARED[kv[0]]))
    if best < MIN_SCORE:
        cls = Bottleneck.NONE
    return Diagnosis(
        cls,
        round(best, 3),
        _evidence(cls, f),
        _recommend(cls, f),
        {k.value: round(v, 3) for k, v in scores.items()},
    )


def _evidence(cls: Bottleneck, f: Features) -> dict[str, float]:
    base = {"gpu_busy_ratio": f.busy_ratio, "idle_with_work_ratio": f.idle_with_work_ratio}
    if cls is Bottleneck.COMPUTE:
        extra = {"mean_batch_size": f.mean_batch, "queue_share": f.queue_share}
    elif cls is Bottleneck.MEMORY:
        extra = {"preemptions_per_request": f.preemptions_per_request, "kv_usage_p90": f.kv_usage_p90}
    elif cls is Bottleneck.HOST:
        extra = {f"idle_share_{k}": v for k, v in f.host_cause_share.items() if v > 0}
        if f.upstream_share is not None:
            extra["idle_with_work_upstream_share"] = f.upstream_share
    elif cls is Bottleneck.QUEUEING:
        extra = {"queue_share": f.queue_share, "queue_growth_per_s": f.queue_growth}
    elif cls is Bottleneck.NETWORK:
        extra = {"network_share": f.network_share}
    elif cls is Bottleneck.PREFIX_MISS:
        extra = {"prefill_share": f.prefill_share, "prompt_tokens_computed_share": f.cache_miss_share or 0.0,
                 "requests_with_cache_hit_share": f.cache_hit_requests_share}
    else:
        extra = {"queue_share": f.queue_share, "mean_batch_size": f.mean_batch}
    return {k: round(v, 4) for k, v in {**base, **extra}.items()}


def _recommend_host(f: Features) -> str:
    if (f.upstream_share or 0.0) >= UPSTREAM_STARVED:
        return (
            f"GPU idle {f.idle_with_work_ratio:.0%} of the time with requests in flight, but for "
            f"{f.upstream_share:.0%} of that idle time the engine's own queue was empty: the front end "
            "starves it (HTTP handling, tokenization, hand-off to the engine, streaming out) — add API-server "
            "processes or workers, tokenize off the event loop, and compare llm.tokenize and network time."
        )
    top = max(f.host_cause_share.items(), key=lambda kv: kv[1], default=("other", 0.0))
    hints = {
        "schedule": "the scheduler: enable async scheduling / overlap scheduling with the forward pass",
        "postprocess": "output processing: move detokenization/streaming off the engine loop",
        "sample": "sampling: use the fused GPU sampler, avoid per-request logits processors in Python",
        "gc": "garbage-collector pauses: gc.freeze() after warm-up, raise gc thresholds",
        "tokenize": "tokenization: tokenize in a separate process or batch it",
        "other": "untraced host work between steps: profile the engine loop (py-spy)",
    }
    return (
        f"GPU idle {f.idle_with_work_ratio:.0%} of the time with requests waiting; "
        f"{top[1]:.0%} of that idle time is in {hints.get(top[0], top[0])}; "
        "CUDA graphs cut launch overhead."
    )


def _recommend_memory(f: Features) -> str:
    return (
        f"{f.preemptions_per_request:.2f} preemptions/request, KV usage p90 {f.kv_usage_p90:.0%}: "
        "raise gpu_memory_utilization, lower max_num_seqs, enable prefix caching or KV quantization "
        "(fp8), or add a replica."
    )


def _recommend_queueing(f: Features) -> str:
    return (
        f"{f.queue_share:.0%} of latency is queueing while the GPU is {f.busy_ratio:.0%} busy: arrivals "
        "exceed capacity — add replicas, rate-limit, or raise max_num_batched_tokens if memory allows."
    )


def _recommend_compute(f: Features) -> str:
    return (
        f"forward passes occupy {f.busy_ratio:.0%} of the time (mean batch {f.mean_batch:.1f}): "
        "the model itself is the limit — quantize, use a smaller/speculative draft model, "
        "tensor-parallel across more GPUs, or add replicas."
    )


def _recommend_network(f: Features) -> str:
    return (
        f"{f.network_share:.0%} of latency is outside the engine (HTTP, streaming): check response "
        "streaming chunk sizes, proxies buffering SSE, and client read speed."
    )


def _recommend(cls: Bottleneck, f: Features) -> str:
    recommend = {
        Bottleneck.HOST: _recommend_host,
        Bottleneck.MEMORY: _recommend_memory,
        Bottleneck.QUEUEING: _recommend_queueing,
        Bottleneck.COMPUTE: _recommend_compute,
        Bottleneck.PREFIX_MISS: _recommend_prefix,
        Bottleneck.NETWORK: _recommend_network,
    }.get(cls, _recommend_none)
    return recommend(f)


def _recommend_prefix(f: Features) -> str:
    computed = f.cache_miss_share or 0.0
    head = (f"{f.prefill_share:.0%} of latency is prefill and {computed:.0%} of the prompt tokens were "
            "computed, not served from the prefix cache: ")
    if f.cache_hit_requests_share > 0:
        return head + (
            f"{f.cache_hit_requests_share:.0%} of requests did hit, so prefixes are shared but evicted or "
            "spread: route requests with the same prefix to the same replica (prefix-aware routing), give the "
            "KV cache more memory so prefixes survive, and keep shared text (system prompt, tools) first and "
            "byte-identical.")
    return head + (
        "no request hit: check that prefix caching is on (vLLM: enable_prefix_caching), that shared text "
        "comes first in the prompt and is byte-identical across requests; if prompts share nothing, "
        "prefill is simply the model's work — chunked prefill or a prefill/decode split helps TTFT.")


def _recommend_none(f: Features) -> str:
    if not f.engine_observed:
        return (
            f"no saturation visible in the requests (queueing {f.queue_share:.0%} of latency), but the data "
            "holds no engine timeline (llm.step / llm.forward spans), so compute, KV-cache and scheduling "
            "limits are unmeasured: trace the engine too (llmtrace.instrument(); for vLLM, LLMTRACE_VLLM=1)."
        )
    return "no resource is saturated: the server has headroom at this load."


def features(
    idle: Sequence[EngineIdle],
    steps: StepStats,
    requests: Sequence[RequestView],
    queue_share: float,
    network_share: float,
    prefill_share: float = 0.0,
    prefix_cache: PrefixCacheStats | None = None,
) -> Features:
    covered = sum(e.covered_ns for e in idle)
    idle_ns = sum(e.idle_ns for e in idle)
    with_work = sum(e.with_work_waiting_ns for e in idle)
    causes: dict[str, int] = {}
    for e in idle:
        for k, v in e.by_cause_ns.items():
            causes[k] = causes.get(k, 0) + v
    preempt = [r.num(sc.LLM_PREEMPTIONS) or 0.0 for r in requests]
    return Features(
        busy_ratio=(covered - idle_ns) / covered if covered else 0.0,
        idle_with_work_ratio=with_work / covered if covered else 0.0,
        host_cause_share={k: v / idle_ns for k, v in causes.items()} if idle_ns else {},
        upstream_share=sum(e.upstream_ns for e in idle) / with_work if with_work else 0.0,
        preemptions_per_request=(sum(preempt) / len(preempt)) if preempt else steps.preemptions_per_request,
        kv_usage_p90=steps.kv_p90,
        queue_share=queue_share,
        queue_growth=steps.queue_growth,
        network_share=network_share,
        mean_batch=steps.mean_batch,
        engine_observed=covered > 0,
        prefill_share=prefill_share,
        cache_miss_share=prefix_cache.miss_share if prefix_cache is not None else None,
        cache_hit_requests_share=prefix_cache.hit_requests / prefix_cache.requests if prefix_cache else 0.0,
    )


def window_features(
    window: WindowView, steps: StepStats, idle_ns: int, with_work_ns: int, causes: Mapping[str, int]
) -> Features:
    """The same features measured inside one ``llm.engine`` window (no request-level shares)."""
    dur = max(1, window.end_ns - window.start_ns)
    waiting, batch = steps.waiting_sum, steps.batch_sum
    return Features(
        busy_ratio=(dur - idle_ns) / dur,
        idle_with_work_ratio=with_work_ns / dur,
        host_cause_share={k: v / idle_ns for k, v in causes.items()} if idle_ns else {},
        upstream_share=None,  # the engine-side split is an overall measure
        preemptions_per_request=steps.preemptions_per_request,
        kv_usage_p90=steps.kv_p90,
        queue_share=_clip(waiting / max(1.0, waiting + batch)),
        queue_growth=steps.queue_growth,
        network_share=0.0,
        mean_batch=steps.mean_batch,
    )
