"""``llmtrace load``'s client against ``vllm bench serve``'s client, on the same servers.

Three parts, arms interleaved (ours, vLLM's; then the next rate) so drift on a shared host
hits both alike:

1. **Rate a client sustains** — a null streaming server on loopback (aiohttp, its own
   process: 32 SSE chunks per response, no model). Each client is offered a Poisson rate for
   ``--duration`` seconds; it *sustains* the rate when it completes >= 95% of it (ours must
   also keep its send-lag p99 <= 5 ms). Ours runs traced (a CLIENT span per request, to a file),
   as a user runs it; then again with ``--processes 2`` at the top rates.
   The client's CPU per request (a run of 2x the rate's requests minus a 5-request run, so the
   interpreter start cancels out) says what one core can drive.
2. **Agreement** — the reference server (``python -m llmtrace.server``), both clients at one
   fixed rate, same prompt/answer lengths: TTFT and e2e p50 side by side (budget: within 5%),
   and the server's own view of each client's requests.
3. **Request functions** — what each client's clock holds: in one process, request by request,
   vLLM's request function with the session ``vllm bench serve`` makes (``trust_env=True``:
   aiohttp then looks up netrc and proxy settings in worker threads before every request), the
   same with ``trust_env=False``, and ours, each from its own start point.

``vllm bench serve`` needs a Hugging Face tokenizer for its random prompts: the reference
server's own tiny BPE tokenizer is saved to a temporary directory for it (nothing from a hub).

Run::

    PYTHONPATH=src python benchmarks/bench_load_client.py [--rates 25,50,100,200] [--duration 8]
        [--agreement-rate 2] [--agreement-requests 60] [--agreement-rounds 2] [--skip-agreement]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PY = sys.executable
VLLM = str(Path(sys.executable).with_name("vllm"))
SUSTAIN_SHARE = 0.95
SEND_LAG_BUDGET_S = 0.005
CHUNKS = 32
INPUT_TOKENS = 32
AGREEMENT_OUTPUT_TOKENS = 16

_NULL_SERVER = r'''
import sys
from aiohttp import web

CHUNK = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
MODELS = {"object": "list", "data": [{"id": "null", "object": "model"}]}


async def models(request):
    return web.json_response(MODELS)


async def completions(request):
    body = await request.json()
    n = int(body.get("max_tokens") or 32)
    words = len(str(body.get("prompt", "")).split())
    usage = {"prompt_tokens": words, "completion_tokens": n, "total_tokens": words + n}
    if not body.get("stream"):
        return web.json_response({"id": "c", "object": "text_completion", "model": "null",
                                  "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                                  "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(n):
        await response.write(CHUNK)
    await response.write(b"data: [DONE]\n\n")
    return response


app = web.Application()
app.router.add_get("/v1/models", models)
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def _tokenizer_dir(tmp: Path) -> str:
    from llmtrace.server.app import TOKENIZER_CACHE
    from llmtrace.server.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(cache_dir=TOKENIZER_CACHE)
    tokenizer.save_pretrained(str(tmp / "tokenizer"))
    return str(tmp / "tokenizer")


def _from_send(traces: Path) -> tuple[float, float]:
    """(TTFT p50, e2e p50) in ms counted from the actual send, where vLLM's client starts its
    clock: the CLIENT spans' ``llm.client.ttft_s``, and their durations less the send lag (a
    span starts at the intended send time, the zero of the report's figures)."""
    from llmtrace import semconv
    from llmtrace.analysis.sources import load_spans
    from llmtrace.analysis.stats import percentile

    spans = [s for s in load_spans(str(traces)).spans if s.kind.name == "CLIENT"]
    ttft = sorted(float(v) for s in spans if (v := s.attributes.get(semconv.LLM_CLIENT_TTFT_S)) is not None)
    e2e = sorted(s.duration_ns / 1e6 - float(s.attributes.get(semconv.LLM_LOAD_SEND_LAG_S, 0.0)) * 1e3 for s in spans)
    return percentile(ttft, 50, presorted=True) * 1000, percentile(e2e, 50, presorted=True)


def ours(url: str, rate: float, duration: float, out_tokens: int, tmp: Path, processes: int = 1,
         requests: int | None = None) -> dict[str, Any]:
    report = tmp / f"ours-{rate}-{processes}.json"
    traces = tmp / f"ours-traces-{time.monotonic_ns()}.jsonl"
    args = [PY, "-m", "llmtrace.cli", "load", url, "--qps", f"{rate:g}", "--input-tokens", str(INPUT_TOKENS),
            "--output-tokens", str(out_tokens), "--lengths", "fixed", "--ignore-eos", "--processes", str(processes),
            "--traces", str(traces), "--json", str(report), "-q"]
    args += ["--duration", f"{(requests / rate) if requests else duration:g}", "--arrival", "poisson"]
    subprocess.run(args, check=True, env={**os.environ, "LLMTRACE_QUIET": "1"}, timeout=900)
    summary = json.loads(report.read_text())
    o = summary["overall"]
    return {"offered": rate, "sent": o["requests"], "achieved": o["achieved_qps"], "ok": o["ok"],
            "send_lag_p99_ms": summary["self_check"]["send_lag_p99_s"] * 1000,
            "cpu_share": summary["self_check"]["cpu_share"],
            "ttft_p50_ms": (o["ttft_s"]["p50"] or 0) * 1000, "e2e_p50_ms": (o["e2e_s"]["p50"] or 0) * 1000,
            "send_lag_p50_ms": summary["self_check"]["send_lag_p50_s"] * 1000,
            **dict(zip(("ttft_send_p50_ms", "e2e_send_p50_ms"), _from_send(traces), strict=True))}


def vllm(url: str, rate: float, prompts: int, out_tokens: int, tokenizer: str, tmp: Path,
         model: str) -> dict[str, Any]:
    name = f"vllm-{rate}.json"
    subprocess.run([VLLM, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
                    "--model", model, "--tokenizer", tokenizer,
                    "--dataset-name", "random", "--random-input-len", str(INPUT_TOKENS),
                    "--random-output-len", str(out_tokens), "--num-prompts", str(prompts), "--request-rate",
                    f"{rate:g}", "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
                    "--save-result", "--result-dir", str(tmp), "--result-filename", name, "--seed", "0"],
                   check=True, capture_output=True, timeout=900)
    result = json.loads((tmp / name).read_text())
    return {"offered": rate, "sent": prompts, "achieved": result["completed"] / result["duration"],
            "ok": result["completed"], "ttft_p50_ms": result["median_ttft_ms"], "e2e_p50_ms": result["median_e2el_ms"]}


def _sustained(row: dict[str, Any], duration: float) -> bool:
    """Completed >= 95% of what was sent, at >= 95% of the rate it was sent at. Ours draws a
    Poisson *count* for a fixed duration, vLLM's a fixed count over a Poisson duration: each is
    judged against what it actually sent."""
    sent_rate = row["sent"] / duration if "send_lag_p99_ms" in row else row["offered"]
    return row["achieved"] >= SUSTAIN_SHARE * sent_rate and row["ok"] >= SUSTAIN_SHARE * row["sent"]


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_request(run: Any, big: int, small: int) -> float:
    """Client CPU ms per request: (CPU of a *big* run - CPU of a *small* one) / (big - small), so
    interpreter start and imports (vLLM's are heavy) cancel out."""
    before = _child_cpu()
    run(small)
    mid = _child_cpu()
    run(big)
    after = _child_cpu()
    return ((after - mid) - (mid - before)) / (big - small) * 1000


def part_rates(args: argparse.Namespace, tokenizer: str, tmp: Path) -> None:
    port = _port()
    server_file = tmp / "null_server.py"
    server_file.write_text(_NULL_SERVER)
    null = subprocess.Popen([PY, str(server_file), str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/v1/models")
        print(f"null streaming server ({CHUNKS} chunks per response) on {url}; {args.duration:g}s per run\n")
        print(f"{'client':<22}{'offered':>8}{'sent':>6}{'achieved':>9}{'ok':>6}{'lag p50 ms':>11}{'lag p99 ms':>11}"
              "  sustained")
        best = {"ours": 0.0, "vllm": 0.0}
        rates = [float(r) for r in args.rates.split(",")]
        for rate in rates:
            prompts = max(1, int(rate * args.duration))
            for arm in ("ours", "vllm"):
                row = (ours(url, rate, args.duration, CHUNKS, tmp) if arm == "ours"
                       else vllm(url, rate, prompts, CHUNKS, tokenizer, tmp, "null"))
                good = _sustained(row, args.duration)
                if good:
                    best[arm] = max(best[arm], rate)
                lags = (f"{row['send_lag_p50_ms']:>11.3f}{row['send_lag_p99_ms']:>11.2f}" if "send_lag_p99_ms" in row
                        else f"{'-':>11}{'-':>11}")
                label = "llmtrace load (traced)" if arm == "ours" else "vllm bench serve"
                print(f"{label:<22}{rate:>8g}{row['sent']:>6}{row['achieved']:>9.1f}{row['ok']:>6}{lags}  "
                      f"{'yes' if good else 'no'}", flush=True)
        for rate in rates[-2:]:
            row = ours(url, rate, args.duration, CHUNKS, tmp, processes=2)
            print(f"{'llmtrace --processes 2':<22}{rate:>8g}{row['sent']:>6}{row['achieved']:>9.1f}{row['ok']:>6}"
                  f"{row['send_lag_p50_ms']:>11.3f}{row['send_lag_p99_ms']:>11.2f}  "
                  f"{'yes' if _sustained(row, args.duration) else 'no'}", flush=True)
        print(f"\nhighest rate sustained: llmtrace load {best['ours']:g}/s, vllm bench serve {best['vllm']:g}/s")
        rate, big = rates[0], int(rates[0] * args.duration * 2)
        # vLLM's client is left out: its start-up (importing vllm, tens of CPU seconds) varies by
        # more than the whole load's CPU, so the subtraction measures noise.
        mine = cpu_per_request(lambda n: ours(url, rate, 0, CHUNKS, tmp, requests=n), big, 5)
        print(f"llmtrace load (traced) client CPU per request ({CHUNKS} chunks, {big} requests at {rate:g}/s): "
              f"{mine:.2f} ms -> one core drives ~{1000 / mine:.0f} req/s")
    finally:
        null.send_signal(signal.SIGINT)
        null.wait(10)


@contextlib.contextmanager
def _reference_server(exporter: str) -> Iterator[str]:
    """``python -m llmtrace.server`` on a free port, exporting its spans to *exporter*; its URL."""
    port = _port()
    env = {**os.environ, "LLMTRACE_QUIET": "1", "LLMTRACE_EXPORTER": exporter}
    server = subprocess.Popen([PY, "-m", "llmtrace.server", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/health")
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)


def part_agreement(args: argparse.Namespace, tokenizer: str, tmp: Path) -> None:
    with _reference_server(f"file:{tmp / 'server.jsonl'}") as url:
        rate, n, out = args.agreement_rate, args.agreement_requests, AGREEMENT_OUTPUT_TOKENS
        print(f"\nreference server, {rate:g} req/s Poisson, {n} requests, {INPUT_TOKENS} prompt / {out} answer tokens")
        rows = []
        for arm in ("ours", "vllm") * args.agreement_rounds:
            row = (ours(url, rate, 0, out, tmp, requests=n) if arm == "ours"
                   else vllm(url, rate, n, out, tokenizer, tmp, "llmtrace-tiny-gpt2"))
            rows.append((arm, row))
            extra = (f"   from the send: TTFT p50 {row['ttft_send_p50_ms']:7.2f} ms, e2e p50 "
                     f"{row['e2e_send_p50_ms']:7.2f} ms (send lag p50 {row['send_lag_p50_ms']:.3f} ms)"
                     if arm == "ours" else "")
            print(f"  {arm:<6} TTFT p50 {row['ttft_p50_ms']:7.2f} ms   e2e p50 {row['e2e_p50_ms']:7.2f} ms{extra}",
                  flush=True)
        vllm_rows = [r for a, r in rows if a == "vllm"]
        ours_rows = [r for a, r in rows if a == "ours"]
        for ours_key, vllm_key in (("ttft_p50_ms", "ttft_p50_ms"), ("e2e_p50_ms", "e2e_p50_ms"),
                                   ("ttft_send_p50_ms", "ttft_p50_ms"), ("e2e_send_p50_ms", "e2e_p50_ms")):
            mean_ours = sum(r[ours_key] for r in ours_rows) / len(ours_rows)
            mean_vllm = sum(r[vllm_key] for r in vllm_rows) / len(vllm_rows)
            print(f"  llmtrace {ours_key} {mean_ours:.2f} vs vllm {vllm_key} {mean_vllm:.2f}: "
                  f"ratio {mean_ours / mean_vllm:.3f}")
    _server_side(tmp / "server.jsonl")


def part_request_functions(args: argparse.Namespace) -> None:
    """Where the two clients' TTFT parts: in one process, against one reference server (no
    export), request by request in shuffled order: vLLM's own request function with the session
    ``vllm bench serve`` makes (``trust_env=True``), the same with ``trust_env=False``, and ours
    (untraced), each from its own start point, same prompts."""
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    from llmtrace.load.client import Client, Target
    from llmtrace.load.model import PlannedRequest
    from llmtrace.load.telemetry import ClientSpans
    from llmtrace.server.demo import _calibration

    def session(trust_env: bool) -> aiohttp.ClientSession:  # serve.py's make_session, trust_env aside
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, use_dns_cache=True,
                                         keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
        return aiohttp.ClientSession(connector=connector, trust_env=trust_env,
                                     timeout=aiohttp.ClientTimeout(total=600))

    async def run(url: str) -> dict[str, list[tuple[float, float]]]:
        from llmtrace.load.prompts import PromptMaker

        model, out = "llmtrace-tiny-gpt2", AGREEMENT_OUTPUT_TOKENS
        maker = PromptMaker(_calibration())
        rows: dict[str, list[tuple[float, float]]] = {"vllm, trust_env=True": [], "vllm, trust_env=False": [],
                                                      "llmtrace load": []}
        async with session(True) as trusting, session(False) as plain, \
                Client(Target(url, model=model, ignore_eos=True), maker, ClientSpans(False)) as mine:
            async def theirs(http: aiohttp.ClientSession, index: int) -> tuple[float, float]:
                o = await async_request_openai_completions(RequestFuncInput(
                    prompt=maker.prompt(index, INPUT_TOKENS), api_url=url + "/v1/completions",
                    prompt_len=INPUT_TOKENS, output_len=out, model=model, ignore_eos=True), http)
                return o.ttft * 1e3, o.latency * 1e3

            async def ours_(index: int) -> tuple[float, float]:
                r = await mine.send(index, PlannedRequest(0.0, INPUT_TOKENS, out), time.monotonic())
                return ((r.ttft_s or 0.0) - r.send_lag_s) * 1e3, ((r.e2e_s or 0.0) - r.send_lag_s) * 1e3

            rng = random.Random(0)
            for index in range(args.agreement_requests + 3):  # the first 3 warm every path up, not counted
                arms = [("vllm, trust_env=True", theirs(trusting, index)),
                        ("vllm, trust_env=False", theirs(plain, index)), ("llmtrace load", ours_(index))]
                rng.shuffle(arms)
                for name, request in arms:
                    row = await request
                    if index >= 3:
                        rows[name].append(row)
                    await asyncio.sleep(0.25)
        return rows

    with _reference_server("none") as url:
        rows = asyncio.run(run(url))
    print(f"\nrequest functions, one process, {args.agreement_requests} requests each, shuffled, from each one's start")
    for name, values in rows.items():
        ttft, e2e = sorted(v[0] for v in values), sorted(v[1] for v in values)
        print(f"  {name:<22} TTFT p50 {ttft[len(ttft) // 2]:6.2f} ms   e2e p50 {e2e[len(e2e) // 2]:6.2f} ms")


def _server_side(path: Path) -> None:
    """The server's own view of each client's requests: a SERVER span with a parent came from
    ours (its CLIENT span), one without from vLLM's client. Same server TTFT and prompt length
    mean the clients differ only in what they measure."""
    from llmtrace import semconv
    from llmtrace.analysis.sources import load_spans
    from llmtrace.analysis.stats import percentile

    spans = list(load_spans(str(path)).spans)
    parent_of = {s.span_id: s.parent_id for s in spans if s.kind.name == "SERVER"}
    groups: dict[str, list[Any]] = {"ours": [], "vllm": []}
    for s in spans:
        # Only the measured requests: not our preflight's 1-token probes (untraced, like vLLM's).
        if (s.name == semconv.SPAN_REQUEST and s.parent_id in parent_of
                and s.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS) == AGREEMENT_OUTPUT_TOKENS):
            groups["ours" if parent_of[s.parent_id] else "vllm"].append(s)
    for arm, requests in groups.items():
        ttft = sorted(float(v) for r in requests
                      if (v := r.attributes.get(semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)) is not None)
        tokens = sorted(int(v) for r in requests if (v := r.attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)))
        answers = sorted(int(v) for r in requests if (v := r.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)))
        e2e = sorted(r.duration_ns / 1e6 for r in requests)
        if ttft and tokens and answers:
            print(f"  server side, {arm:<5}: {len(requests)} requests, TTFT p50 "
                  f"{percentile(ttft, 50, presorted=True) * 1000:.2f} ms, e2e p50 "
                  f"{percentile(e2e, 50, presorted=True):.1f} ms, prompt tokens p50 "
                  f"{percentile(tokens, 50, presorted=True):.0f}, answer tokens p50 "
                  f"{percentile(answers, 50, presorted=True):.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="25,50,100,200")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--agreement-rate", type=float, default=2.0)
    parser.add_argument("--agreement-requests", type=int, default=60)
    parser.add_argument("--agreement-rounds", type=int, default=2, help="runs per client, interleaved")
    parser.add_argument("--skip-agreement", action="store_true")
    parser.add_argument("--skip-rates", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        tokenizer = _tokenizer_dir(tmp)
        if not args.skip_rates:
            part_rates(args, tokenizer, tmp)
        if not args.skip_agreement:
            part_agreement(args, tokenizer, tmp)
            part_request_functions(args)


if __name__ == "__main__":
    main()
