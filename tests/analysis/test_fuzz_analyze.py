"""`llmtrace analyze` on randomly damaged traces never ends in an internal error.

Seeded mutations of a small simulated run, each file analysed end to end (JSON and, for
some, the HTML report): attribute values of every OTLP type and edge value (NaN, infinity,
negative, empty arrays, kvlists), renamed spans (a step named like a request), re-parented
spans (cycles included), spans moved to other traces, shifted times, other kinds, links.
A run may report a SourceError (exit 2); it must never raise or print "internal error".
The same fuzz, run longer (tens of thousands of files), found the bugs these seeds guard.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from llmtrace.analysis.synthetic import SimConfig, write_jsonl
from llmtrace.cli import main

_NAMES = ["llm.request", "llm.step", "llm.engine", "llm.forward", "llm.schedule", "llm.postprocess", "llm.queue",
          "llm.prefill", "llm.decode", "llm.tokenize", "llm.gc", "llm_request", ""]  # fmt: skip
_VALUES: list[Any] = [
    {"stringValue": "x"}, {"intValue": "-5"}, {"intValue": "99999999999"}, {"doubleValue": -1.5},
    {"doubleValue": "NaN"}, {"doubleValue": "Infinity"}, {"boolValue": True}, {"arrayValue": {"values": []}},
    {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}},
    {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "1"}}]}}, {},
]  # fmt: skip
_KEYS = ["llm.engine.id", "llm.step.id", "llm.batch.size", "llm.batch.request_ids", "gen_ai.usage.input_tokens",
         "llm.queue.waiting", "llm.kv_cache.usage", "gen_ai.latency.time_to_first_token",
         "llm.step.first_id"]  # fmt: skip


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    path = tmp_path_factory.mktemp("fuzz") / "sim.jsonl"
    write_jsonl(str(path), SimConfig(duration_s=2, arrival_rate=10, seed=3))
    return [json.loads(line) for line in path.read_text().splitlines()]


def _damage(docs: list[Any], rng: random.Random) -> list[Any]:
    docs = json.loads(json.dumps(docs))
    spans = [sp for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]
    # Request-side spans are few among the engine's: half of the damage goes to them.
    requests = [sp for sp in spans if sp["name"] == "llm.request" or sp.get("kind") == 2]
    by_trace: dict[str, list[Any]] = {}
    for sp in spans:
        by_trace.setdefault(sp["traceId"], []).append(sp)
    for _ in range(rng.randint(1, 40)):
        sp = rng.choice(requests if rng.random() < 0.5 else spans)
        op = rng.random()
        if op < 0.4 and sp.get("attributes"):
            rng.choice(sp["attributes"])["value"] = rng.choice(_VALUES)
        elif op < 0.5:
            sp["name"] = rng.choice(_NAMES)
        elif op < 0.6:  # mostly within the trace: cycles become possible
            sp["parentSpanId"] = rng.choice(by_trace[sp["traceId"]] if rng.random() < 0.7 else spans)["spanId"]
        elif op < 0.7:
            sp["traceId"] = rng.choice(spans)["traceId"]
        elif op < 0.8:
            start = int(sp["startTimeUnixNano"]) + rng.randint(-(10**10), 10**10)
            sp["startTimeUnixNano"], sp["endTimeUnixNano"] = str(start), str(start + rng.choice([0, 1, 10**12]))
        elif op < 0.87:
            sp["kind"] = rng.randint(0, 5)
        elif op < 0.94:
            other = rng.choice(spans)
            sp["links"] = [{"traceId": other["traceId"], "spanId": other["spanId"]}] * rng.randint(0, 3)
        else:
            sp.setdefault("attributes", []).append({"key": rng.choice(_KEYS), "value": rng.choice(_VALUES)})
    return docs


@pytest.mark.parametrize("seed", range(60))
def test_damaged_traces_never_end_in_an_internal_error(
    seed: int, documents: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in _damage(documents, random.Random(seed))))
    args = ["analyze", str(path), "--json", str(tmp_path / "s.json"), "-q"]
    if seed % 5 == 0:
        args += ["--html", str(tmp_path / "r.html")]
    assert main(args) in (0, 2)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
