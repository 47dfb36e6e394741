"""The reference engine: a continuous-batching loop over a tiny GPT-2, in its own process.

Messages (plain tuples over multiprocessing queues, like vLLM's EngineCore IPC):

* in (a queue):  ``("add", {request_id, prompt_ids, max_tokens, temperature, top_p, seed, carrier})``,
  ``("abort", request_id)``, ``("finish", (request_id, reason))`` (the front end found a stop
  sequence), ``("stats", None)``, ``("shutdown", None)``
* out (a pipe whose only write end is here, so the API server reads this process's death as
  end-of-file): ``("outputs", [(request_id, token_id), ...], [(request_id, reason, summary), ...])``
  once per step (batched like vLLM's EngineCoreOutputs: one pickle and one pipe write per step),
  ``("stats", dict)``, ``("ready", dict)``, ``("error", message)``, ``("stopped", None)``

Nothing a request carries can stop this process: an ``add`` that does not describe a
servable request fails that request alone (the front end checked it already; this is the
second line), and an exception inside a step fails only the requests whose forward pass or
sampling raised, found by running the batch's requests one by one.

The W3C carrier of the API server's ``llm.request`` travels in the add message;
the engine's queue/prefill/decode spans join that trace, and the durations go
back in ``finished`` (timestamps never cross the process boundary).

The model recomputes the whole sequence each step instead of keeping a real KV
cache (keeps the engine small); the scheduler's block budget models a paged KV
cache's admission and preemption, so preemption happens under load as in vLLM.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llmtrace.server")

#: The engine waits this long for work when idle, so that shutdown stays prompt.
IDLE_POLL_S = 0.05
#: Below this temperature a request is sampled greedily: dividing the logits by less overflows them.
MIN_SAMPLING_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True)
class EngineConfig:
    vocab_size: int
    eos_token_id: int
    total_blocks: int = 256
    block_size: int = 16
    max_batch: int = 16
    max_model_len: int = 512
    seed: int = 0
    engine_id: str = "dp0"
    #: Options for llmtrace.instrument() in this process; None leaves the engine untraced.
    instrument_options: dict[str, Any] | None = None
    #: Artificial delay per forward, seconds: lets tests make steps slow enough to queue.
    forward_delay_s: float = 0.0
    #: Fault injection for tests: a forward pass over a prompt holding this token id raises.
    fail_on_token_id: int | None = None
    #: Modeled prefill cost, seconds per prompt token computed (not served by the prefix cache).
    #: This engine recomputes every token each step, so without it a cache hit saves no time;
    #: the demo sets it to show what a hit is worth on an engine with a KV cache.
    prefill_token_delay_s: float = 0.0
    #: For counted benchmarks: with nothing running, wait (blocked, not polling) until this many
    #: requests wait, and start them as one batch. A load of that many clients then runs the same
    #: steps with the same batches however fast its front end is; 0 steps as soon as one waits.
    gather_batch: int = 0


class ReferenceEngine:
    """Owns the model, the scheduler and the llmtrace engine timeline of one process."""

    def __init__(self, config: EngineConfig, outbox: Any) -> None:
        import torch

        from llmtrace.server.scheduler import Scheduler
        from llmtrace.server.tiny_model import build_gpt2

        torch.set_num_threads(1)  # two cores: more threads spin against the API server
        self.torch = torch
        self.config = config
        self.out = outbox
        self.model = build_gpt2(config.vocab_size, seed=config.seed, eos_token_id=config.eos_token_id).eval()
        self.scheduler = Scheduler(config.total_blocks, config.block_size, config.max_batch)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.sequences: dict[str, Any] = {}
        import llmtrace

        self.engine = llmtrace.EngineTracer(config.engine_id)
        self.tracker = self.engine.tracker

    # ------------------------------------------------------------------ messages
    def handle(self, kind: str, payload: Any) -> bool:
        """Apply one message; False means shut down."""
        if kind == "add":
            self._add(payload)
        elif kind == "abort":
            if self.scheduler.remove(payload) is not None:
                self.sequences.pop(payload, None)
                self.tracker.aborted(payload)
        elif kind == "finish":
            request_id, reason = payload
            seq = self.scheduler.remove(request_id)
            if seq is not None:
                self.sequences.pop(request_id, None)
                self.out.send(("outputs", [], [(request_id, reason, self._finished(seq, reason))]))
        elif kind == "stats":
            self.out.send(("stats", self.stats()))
        elif kind == "shutdown":
            return False
        else:
            log.error("reference engine: unknown message %r (ignored)", kind)
        return True

    def _add(self, payload: Any) -> None:
        request_id = payload.get("request_id") if isinstance(payload, dict) else None
        if not isinstance(request_id, str):
            log.error("reference engine: an add message without a request id (ignored)")
            return
        try:
            seq = self._sequence(request_id, payload)
            self.scheduler.add(seq)
        except (ValueError, TypeError, KeyError) as exc:
            self.out.send(("outputs", [], [(request_id, "error", {"error": f"invalid request: {exc}",
                                                                   "status": 400})]))
            return
        self.sequences[seq.request_id] = seq
        self.tracker.add(seq.request_id, carrier=payload.get("carrier"),
                         prompt_tokens=len(seq.prompt_ids), max_tokens=seq.max_tokens)

    def _sequence(self, request_id: str, payload: dict[str, Any]) -> Any:
        """The request as a scheduler Sequence; raises ValueError for anything the model cannot run."""
        from llmtrace.server.scheduler import Sequence

        ids, max_tokens = payload["prompt_ids"], payload["max_tokens"]
        if not isinstance(ids, list | tuple) or not ids or not all(
                isinstance(t, int) and 0 <= t < self.config.vocab_size for t in ids):
            raise ValueError(f"prompt_ids must be a non-empty list of token ids below {self.config.vocab_size}")
        if not isinstance(max_tokens, int) or max_tokens < 1 or len(ids) + max_tokens > self.config.max_model_len:
            raise ValueError(f"max_tokens must be an integer >= 1 that fits the context of "
                             f"{self.config.max_model_len} tokens with the prompt's {len(ids)}")
        temperature, top_p, seed = payload.get("temperature", 0.0), payload.get("top_p", 1.0), payload.get("seed")
        if not isinstance(temperature, int | float) or not 0.0 <= temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE}]")
        if not isinstance(top_p, int | float) or not 0.0 <= top_p <= 1.0:
            raise ValueError("top_p must be a number in [0, 1]")
        if seed is not None and not isinstance(seed, int):
            raise ValueError("seed must be an integer")
        generator = None
        if seed is not None:  # the request's own random stream: the same seed samples the same tokens
            generator = self.torch.Generator().manual_seed(seed % 2**64)
        return Sequence(request_id, list(ids), max_tokens, float(temperature), float(top_p), generator=generator)

    def _finished(self, seq: Any, reason: str) -> dict[str, Any]:
        """End a request's record; the summary for the front end, with the prefix-cache hit
        that the API's usage reports whether or not this process is traced."""
        summary = self.tracker.finished(seq.request_id, reason, output_tokens=len(seq.output_ids))
        summary.setdefault("cached_tokens", seq.cached_tokens or 0)
        return summary

    def stats(self) -> dict[str, Any]:
        import llmtrace

        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "free_blocks": self.scheduler.free_blocks, "total_blocks": self.scheduler.total_blocks,
                "open_requests": len(self.tracker), "llmtrace_cpu_s": llmtrace.overhead_cpu_s()}

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        step = self.engine.begin_step()
        try:
            self._step(step)
        finally:
            self.engine.end_step(step)

    def _step(self, step: Any) -> None:
        # step.mark(): one call per phase boundary, the cheapest way to time the phases.
        step.mark("schedule")
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self.tracker.preempted(seq.request_id)
        for seq in plan.admitted:  # the first admission's prefix-cache hit is the request's
            if seq.cached_tokens is not None and (handle := self.tracker.get(seq.request_id)) is not None:
                handle.prompt_cached(seq.cached_tokens)
        if not plan.batch:
            return
        ids = [seq.request_id for seq in plan.batch]
        step.batch(ids, prefill_tokens=plan.prefill_tokens, decode_tokens=plan.decode_tokens,
                   waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
                   kv_cache_usage=self.scheduler.kv_cache_usage, preempted=len(plan.preempted),
                   cached_tokens=plan.cached_tokens)
        step.mark("forward")
        batch = plan.batch
        try:
            logits = self._forward(batch)
            if self.config.prefill_token_delay_s and plan.prefill_tokens:
                time.sleep(self.config.prefill_token_delay_s * plan.prefill_tokens)
            step.mark("sample")
            tokens = self._sample(batch, logits)
        except Exception as exc:  # noqa: BLE001 - find the request(s) it came from; the rest go on
            batch, tokens = self._isolate(batch, exc)
        step.tokens()  # one token for every request in the batch
        step.mark("postprocess")
        self._postprocess(batch, tokens)

    def _isolate(self, batch: list[Any], batch_error: Exception) -> tuple[list[Any], list[int]]:
        """The batch's forward or sampling raised: run each request alone, fail those that raise again."""
        log.error("reference engine: a step of %d requests raised %r; running them one by one", len(batch),
                  batch_error)
        survivors, tokens = [], []
        for seq in batch:
            try:
                tokens.append(self._sample([seq], self._forward([seq]))[0])
                survivors.append(seq)
            except Exception as exc:
                log.exception("reference engine: request %s failed", seq.request_id)
                self.fail(seq.request_id, exc)
        return survivors, tokens

    def fail(self, request_id: str, error: BaseException) -> None:
        """End one request as an error (its span ERROR) and tell the front end (a 500 for it)."""
        self.scheduler.remove(request_id)
        self.sequences.pop(request_id, None)
        summary = self.tracker.aborted(request_id, error=error)
        summary.update(error=f"engine error: {type(error).__name__}: {error}", status=500)
        self.out.send(("outputs", [], [(request_id, "error", summary)]))

    def fail_all(self, error: BaseException) -> None:
        """A step failed outside forward and sampling: its scheduler state cannot be trusted, so every
        open request fails and the engine starts over with a fresh scheduler (the process lives on)."""
        from llmtrace.server.scheduler import Scheduler

        log.exception("reference engine: a step failed; failing its %d open requests", len(self.sequences))
        for request_id in list(self.sequences):
            self.fail(request_id, error)
        self.scheduler = Scheduler(self.config.total_blocks, self.config.block_size, self.config.max_batch)

    def _forward(self, batch: list[Any]) -> Any:
        torch = self.torch
        if self.config.fail_on_token_id is not None and any(self.config.fail_on_token_id in seq.prompt_ids
                                                            for seq in batch):
            raise RuntimeError(f"injected fault: token {self.config.fail_on_token_id} in the batch")
        longest = max(seq.length for seq in batch)
        input_ids = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, seq in enumerate(batch):  # left padding: the next-token logits sit in the last column
            tokens = seq.prompt_ids + seq.output_ids
            input_ids[row, longest - len(tokens):] = torch.tensor(tokens)
            mask[row, longest - len(tokens):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             use_cache=False, logits_to_keep=1)
        if self.config.forward_delay_s:
            time.sleep(self.config.forward_delay_s)
        return out.logits[:, -1, :]

    def _sample(self, batch: list[Any], logits: Any) -> list[int]:
        """Greedy for temperature 0, else temperature + top-p (nucleus) sampling, batched; a request
        with a seed draws from its own generator, so its tokens do not depend on its batch-mates."""
        torch = self.torch
        tokens = logits.argmax(dim=-1)
        rows = [i for i, seq in enumerate(batch) if seq.temperature >= MIN_SAMPLING_TEMPERATURE]
        if rows:
            index = torch.tensor(rows)
            temps = torch.tensor([batch[i].temperature for i in rows]).unsqueeze(1)
            top_p = torch.tensor([batch[i].top_p for i in rows]).unsqueeze(1)
            probs = torch.softmax(logits[index] / temps, dim=-1)
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p  # beyond the nucleus
            outside[:, 0] = False  # the most likely token is always in it (top_p 0 is greedy)
            sorted_probs[outside] = 0.0
            choice = torch.empty((len(rows), 1), dtype=torch.long)
            shared = [k for k, i in enumerate(rows) if batch[i].generator is None]
            if shared:
                choice[shared] = torch.multinomial(sorted_probs[shared], 1, generator=self.generator)
            for k, i in enumerate(rows):
                if batch[i].generator is not None:
                    choice[k] = torch.multinomial(sorted_probs[k], 1, generator=batch[i].generator)
            tokens[index] = order.gather(-1, choice).squeeze(1)
        return [int(t) for t in tokens.tolist()]

    def _postprocess(self, batch: list[Any], tokens: list[int]) -> None:
        emitted: list[tuple[str, int]] = []
        finished: list[tuple[str, str, dict[str, Any]]] = []
        for seq, token in zip(batch, tokens, strict=True):
            seq.needs_prefill = False
            seq.output_ids.append(token)
            emitted.append((seq.request_id, token))
            reason = None
            if token == self.config.eos_token_id:
                reason = "stop"
            elif len(seq.output_ids) >= seq.max_tokens or seq.length >= self.config.max_model_len:
                reason = "length"
            if reason is not None:
                self.scheduler.remove(seq.request_id)
                self.sequences.pop(seq.request_id, None)
                finished.append((seq.request_id, reason, self._finished(seq, reason)))
        self.out.send(("outputs", emitted, finished))

    @property
    def has_work(self) -> bool:
        """A step to run: something running, or enough waiting (one, or ``gather_batch``)."""
        waiting = len(self.scheduler.waiting)
        return bool(self.scheduler.running) or waiting >= max(1, self.config.gather_batch)

    @property
    def gathering(self) -> bool:
        """Nothing runs and fewer than ``gather_batch`` requests wait: the next message is awaited."""
        return self.config.gather_batch > 0 and not self.has_work


def run_engine(config: EngineConfig, in_queue: Any, outbox: Any) -> None:
    """The engine process's main function; *outbox* is the write end of a pipe to the API server."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s engine %(levelname)s %(message)s")
    if config.instrument_options is not None:
        import llmtrace

        llmtrace.instrument(**{**config.instrument_options, "process_role": "engine"})
    try:
        engine = ReferenceEngine(config, outbox)
    except Exception as exc:
        outbox.send(("error", f"engine failed to start: {exc!r}"))
        raise
    outbox.send(("ready", {"pid": os.getpid(), **engine.stats()}))
    running = True
    while running:
        running = _take_messages(engine, in_queue)
        if running and engine.has_work:
            try:
                engine.step()
            except Exception as exc:  # noqa: BLE001 - the process serves on; the step's requests fail
                engine.fail_all(exc)
        elif running:
            engine.engine.idle()
    engine.tracker.abort_all()
    if config.instrument_options is not None:
        import llmtrace

        llmtrace.shutdown(timeout_s=10.0)
    outbox.send(("stopped", None))


def _take_messages(engine: ReferenceEngine, in_queue: Any) -> bool:
    """Apply every waiting message (waiting up to IDLE_POLL_S for one when idle, as long as it takes
    while gathering a batch); False means shut down."""
    wait: float | None = 0 if engine.has_work else None if engine.gathering else IDLE_POLL_S
    while True:
        try:
            kind, payload = in_queue.get(timeout=wait) if wait != 0 else in_queue.get_nowait()
        except queue.Empty:
            return True
        wait = 0
        try:
            if not engine.handle(kind, payload):
                return False
        except Exception:
            log.exception("reference engine: handling a %r message failed (ignored)", kind)
