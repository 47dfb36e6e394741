"""The reference engine: a continuous-batching loop over a tiny GPT-2, in its own process.

Messages (plain tuples over multiprocessing queues, like vLLM's EngineCore IPC):

* in:  ``("add", {request_id, prompt_ids, max_tokens, temperature, top_p, carrier})``,
  ``("abort", request_id)``, ``("stats", None)``, ``("shutdown", None)``
* out: ``("outputs", [(request_id, token_id), ...], [(request_id, reason, summary), ...])`` once
  per step (batched like vLLM's EngineCoreOutputs: one pickle and one pipe write per step),
  ``("stats", dict)``, ``("ready", dict)``, ``("error", message)``

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


class ReferenceEngine:
    """Owns the model, the scheduler and the llmtrace engine timeline of one process."""

    def __init__(self, config: EngineConfig, out_queue: Any) -> None:
        import torch

        from llmtrace.server.scheduler import Scheduler
        from llmtrace.server.tiny_model import build_gpt2

        torch.set_num_threads(1)  # two cores: more threads spin against the API server
        self.torch = torch
        self.config = config
        self.out = out_queue
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
        from llmtrace.server.scheduler import Sequence

        if kind == "add":
            seq = Sequence(payload["request_id"], list(payload["prompt_ids"]), int(payload["max_tokens"]),
                           float(payload.get("temperature") or 0.0), float(payload.get("top_p") or 1.0))
            try:
                self.scheduler.add(seq)
            except ValueError as exc:
                self.out.put(("outputs", [], [(seq.request_id, "error", {"error": str(exc)})]))
                return True
            self.sequences[seq.request_id] = seq
            self.tracker.add(seq.request_id, carrier=payload.get("carrier"),
                             prompt_tokens=len(seq.prompt_ids), max_tokens=seq.max_tokens)
        elif kind == "abort":
            if self.scheduler.remove(payload) is not None:
                self.sequences.pop(payload, None)
                self.tracker.aborted(payload)
        elif kind == "stats":
            self.out.put(("stats", self.stats()))
        elif kind == "shutdown":
            return False
        return True

    def stats(self) -> dict[str, Any]:
        import llmtrace

        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "free_blocks": self.scheduler.free_blocks, "total_blocks": self.scheduler.total_blocks,
                "open_requests": len(self.tracker), "llmtrace_cpu_s": llmtrace.overhead_cpu_s()}

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        step = self.engine.begin_step()
        # step.mark(): one call per phase boundary, the cheapest way to time the phases.
        step.mark("schedule")
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self.tracker.preempted(seq.request_id)
        if not plan.batch:
            self.engine.end_step(step)
            return
        ids = [seq.request_id for seq in plan.batch]
        step.batch(ids, prefill_tokens=plan.prefill_tokens, decode_tokens=plan.decode_tokens,
                   waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
                   kv_cache_usage=self.scheduler.kv_cache_usage, preempted=len(plan.preempted))
        step.mark("forward")
        logits = self._forward(plan.batch)
        step.mark("sample")
        tokens = self._sample(plan.batch, logits)
        step.tokens()  # one token for every request in the batch
        step.mark("postprocess")
        self._postprocess(plan.batch, tokens)
        self.engine.end_step(step)

    def _forward(self, batch: list[Any]) -> Any:
        torch = self.torch
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
        """Greedy for temperature 0, else temperature + top-p (nucleus) sampling, batched."""
        torch = self.torch
        tokens = logits.argmax(dim=-1)
        rows = [i for i, seq in enumerate(batch) if seq.temperature > 0]
        if rows:
            index = torch.tensor(rows)
            temps = torch.tensor([batch[i].temperature for i in rows]).unsqueeze(1)
            top_p = torch.tensor([batch[i].top_p for i in rows]).unsqueeze(1)
            probs = torch.softmax(logits[index] / temps, dim=-1)
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p  # beyond the nucleus
            sorted_probs[outside] = 0.0
            choice = torch.multinomial(sorted_probs, 1, generator=self.generator)
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
                summary = self.tracker.finished(seq.request_id, reason, output_tokens=len(seq.output_ids))
                finished.append((seq.request_id, reason, summary))
        self.out.put(("outputs", emitted, finished))

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)


def run_engine(config: EngineConfig, in_queue: Any, out_queue: Any) -> None:
    """The engine process's main function."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s engine %(levelname)s %(message)s")
    if config.instrument_options is not None:
        import llmtrace

        llmtrace.instrument(**{**config.instrument_options, "process_role": "engine"})
    try:
        engine = ReferenceEngine(config, out_queue)
    except Exception as exc:
        out_queue.put(("error", f"engine failed to start: {exc!r}"))
        raise
    out_queue.put(("ready", {"pid": os.getpid(), **engine.stats()}))
    running = True
    while running:
        try:
            timeout = 0 if engine.has_work else IDLE_POLL_S
            while True:
                kind, payload = in_queue.get(timeout=timeout) if timeout else in_queue.get_nowait()
                running = engine.handle(kind, payload)
                timeout = 0
                if not running:
                    break
        except queue.Empty:
            pass
        if running and engine.has_work:
            engine.step()
        elif running:
            engine.engine.idle()
    engine.tracker.abort_all()
    if config.instrument_options is not None:
        import llmtrace

        llmtrace.shutdown(timeout_s=10.0)
    out_queue.put(("stopped", None))
