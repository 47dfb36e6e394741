"""The spill: spans the OTLP endpoint could not take, on local disk, bounded in bytes.

A directory of OTLP-JSON-lines segments (one export batch per line, the file exporter's
format, so ``llmtrace analyze DIR/*.jsonl`` reads them in place)::

    spill-<service>-<pid>-<token>.lock           held (flock) by the writing process while it lives
    spill-<service>-<pid>-<token>-000001.jsonl   its segments, oldest first

Each process writes only its own segments (an API server and its engine process may share
the directory). A segment is sealed at :attr:`SpillStore.segment_bytes`; when the directory
would exceed ``max_bytes`` the oldest segment is deleted and the spans in it that were not
re-sent yet are counted as dropped (reason ``spill_full``). The segments of a process that
died (its lock is free) are adopted by the next process using the directory and re-sent
by it. Re-sending is at least once: a process that dies halfway through a segment sends
that segment's first lines again next time (the analyzer drops duplicate spans).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from llmtrace._otel.gil import GilYield
from llmtrace._otel.otlp_json import encode_spans
from llmtrace._otel.otlp_json_read import MALFORMED, decode_spans
from llmtrace._safety import warn_once

log = logging.getLogger("llmtrace")

#: A directory holds this many segments at most (the newest is the one being written), so a
#: full spill frees an eighth of its bound at a time rather than one line at a time.
SEGMENTS_PER_SPILL = 8
MIN_SEGMENT_BYTES = 64 * 1024
_SEGMENT = re.compile(r"^(spill-.+)-(\d{6})\.jsonl$")


def default_directory() -> str:
    """``$XDG_STATE_HOME/llmtrace/spill``, else ``~/.local/state/llmtrace/spill`` (the XDG state
    directory: data that should outlive a restart but is not worth backing up)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "llmtrace", "spill")


@dataclass
class Segment:
    path: str
    spans: int = 0  #: spans written and not re-sent yet
    bytes: int = 0
    lines_sent: int = 0  #: lines already re-sent (a segment is re-sent line by line)
    evicted: bool = False
    sending: bool = False  #: being re-sent: kept out of eviction, so no span is counted twice
    owner_lock: int = -1  #: an adopted segment: the dead owner's lock, held until its segments are gone


@dataclass
class _Adopted:
    lock_path: str
    fd: int
    segments: list[str] = field(default_factory=list)


def _count_spans(path: str) -> tuple[int, int]:
    """(spans, bytes) of a segment written by another process; a torn last line counts nothing."""
    spans = 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            with contextlib.suppress(*MALFORMED):
                spans += len(decode_spans(line))
    return spans, os.path.getsize(path)


class SpillStore:
    """This process's segments (and those it adopted), bounded by *max_bytes* on disk.

    Thread-safe: the export thread and the spill thread write; the spill thread re-sends.
    *on_drop(count)* is told about spans deleted unsent to keep the bound.
    """

    def __init__(self, directory: str, max_bytes: int, service: str, on_drop: Callable[[int], None]) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = max(MIN_SEGMENT_BYTES, max_bytes // SEGMENTS_PER_SPILL)
        self._service = re.sub(r"[^A-Za-z0-9_.]+", "_", service)[:40] or "service"
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._total = 0
        self._fd = -1  # the segment being written: self._segments[-1] when >= 0
        self._prefix = ""
        self._lock_fd = -1
        self._seq = 0
        self._closed = False

    # ------------------------------------------------------------------ writing

    def write(self, spans: Sequence[ReadableSpan]) -> bool:
        """Append *spans* as one line; False (nothing written) when the disk refuses it."""
        data = (encode_spans(spans, GilYield().maybe) + "\n").encode()
        with self._lock:
            if self._closed:
                return False
            if len(data) > self.max_bytes:
                self._on_drop(len(spans))
                return True  # accounted for: dropped, not lost
            try:
                self._make_room(len(data))
                if self._fd < 0 or self._segments[-1].bytes + len(data) > self.segment_bytes:
                    self._open_segment()
                os.write(self._fd, data)
            except OSError as exc:
                warn_once(f"spill-write:{self.directory}", "llmtrace: cannot write the spill in %s: %s",
                          self.directory, exc)
                return False
            segment = self._segments[-1]
            segment.spans += len(spans)
            segment.bytes += len(data)
            self._total += len(data)
        return True

    def _make_room(self, size: int) -> None:
        while self._total + size > self.max_bytes:
            oldest = next((s for s in self._segments if not s.sending), None)
            if oldest is None:
                return
            if oldest is self._segments[-1] and self._fd >= 0:
                self._close_active()
            self._forget(oldest)
            oldest.evicted = True
            if oldest.spans:
                self._on_drop(oldest.spans)
                warn_once("spill-full", "llmtrace: the spill in %s is full (%d bytes); deleting its oldest "
                          "spans and counting them as dropped", self.directory, self.max_bytes)

    def _open_segment(self) -> None:
        if self._lock_fd < 0:
            os.makedirs(self.directory, exist_ok=True)
            self._prefix = f"spill-{self._service}-{os.getpid()}-{secrets.token_hex(3)}"
            self._lock_fd = os.open(os.path.join(self.directory, self._prefix + ".lock"),
                                    os.O_WRONLY | os.O_CREAT, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            warn_once(f"spill-dir:{self.directory}", "llmtrace: the OTLP endpoint is failing; spilling spans "
                      "to %s (re-sent when it is back; `llmtrace analyze %s/*.jsonl` reads them)",
                      self.directory, self.directory)
        self._close_active()
        self._seq += 1
        path = os.path.join(self.directory, f"{self._prefix}-{self._seq:06d}.jsonl")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segments.append(Segment(path))

    def _close_active(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _forget(self, segment: Segment) -> None:
        """Delete *segment* (sent or evicted); an adopted owner's lock goes with its last segment."""
        self._segments.remove(segment)
        self._total -= segment.bytes
        with contextlib.suppress(OSError):
            os.unlink(segment.path)
        if segment.owner_lock >= 0 and not any(s.owner_lock == segment.owner_lock for s in self._segments):
            lock_path = _SEGMENT.sub(r"\1.lock", os.path.basename(segment.path))
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, lock_path))
            os.close(segment.owner_lock)

    # ------------------------------------------------------------------ re-sending

    @property
    def pending(self) -> bool:
        """Whether any segment holds spans not re-sent yet."""
        return any(segment.spans for segment in self._segments)

    @property
    def spans_on_disk(self) -> int:
        with self._lock:
            return sum(segment.spans for segment in self._segments)

    def oldest_lines(self) -> Generator[tuple[Segment, list[ReadableSpan]], None, None]:
        """The oldest segment's unsent lines, decoded; the segment being written is sealed first.

        Call :meth:`sent` after each line is delivered; stop iterating to pause."""
        with self._lock:
            if not self._segments:
                return
            segment = self._segments[0]
            if segment is self._segments[-1]:
                self._close_active()  # new spans go to a new segment
            segment.sending = True
        try:
            with open(segment.path, encoding="utf-8", errors="replace") as lines:
                for number, line in enumerate(lines):
                    if number < segment.lines_sent:
                        continue
                    try:
                        spans = decode_spans(line, GilYield().maybe)
                    except MALFORMED:  # a line torn by a crash: skip it
                        spans = []
                    yield segment, spans
        except FileNotFoundError:  # deleted under us: what it held is gone
            self._on_drop(segment.spans)
        finally:
            segment.sending = False
        with self._lock:
            if segment in self._segments:
                self._forget(segment)

    def sent(self, segment: Segment, spans: int) -> None:
        with self._lock:
            segment.lines_sent += 1
            segment.spans = max(0, segment.spans - spans)

    def has_orphans(self) -> bool:
        """Whether another process's lock file is in the directory (alive or not: a cheap look)."""
        try:
            return any(name.endswith(".lock") for name in os.listdir(self.directory))
        except OSError:
            return False

    def adopt_orphans(self) -> int:
        """Take over the segments of processes that died with spans unsent (an earlier run, a
        restarted engine process, a forked child that exited); the number of spans. Owners already
        adopted are skipped: their lock is held here."""
        try:
            found = self._orphans()
        except OSError:
            return 0
        adopted = 0
        for owner in found:
            for path in owner.segments:
                try:
                    spans, size = _count_spans(path)
                except OSError:
                    continue
                with self._lock:
                    self._segments.insert(len([s for s in self._segments if s.owner_lock >= 0]),
                                          Segment(path, spans, size, owner_lock=owner.fd))
                    self._total += size
                adopted += spans
            if not owner.segments:
                with contextlib.suppress(OSError):
                    os.unlink(owner.lock_path)
                os.close(owner.fd)
        if adopted:
            log.warning("llmtrace: found %d spans spilled by an earlier process in %s; re-sending them",
                        adopted, self.directory)
        return adopted

    def _orphans(self) -> list[_Adopted]:
        if not os.path.isdir(self.directory):
            return []
        names = sorted(os.listdir(self.directory))
        owners: list[_Adopted] = []
        for name in names:
            if not name.endswith(".lock") or name.startswith(self._prefix or "\0"):
                continue
            lock_path = os.path.join(self.directory, name)
            fd = os.open(lock_path, os.O_WRONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its owner is alive
                os.close(fd)
                continue
            stem = name[: -len(".lock")]
            segments = [os.path.join(self.directory, n) for n in names
                        if (m := _SEGMENT.match(n)) is not None and m.group(1) == stem]
            owners.append(_Adopted(lock_path, fd, segments))
        return owners

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop writing; unsent segments stay for the next process or for ``llmtrace analyze``."""
        with self._lock:
            self._closed = True
            self._close_active()
            for segment in [s for s in self._segments if not s.spans]:  # all re-sent
                self._forget(segment)
            if self._lock_fd >= 0:
                if not any(s.owner_lock < 0 for s in self._segments):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.directory, self._prefix + ".lock"))
                os.close(self._lock_fd)
            for fd in {s.owner_lock for s in self._segments if s.owner_lock >= 0}:
                os.close(fd)
            self._segments = []
            self._lock_fd = -1

    def after_fork_in_child(self) -> None:
        """The parent's segments and locks are the parent's: close the inherited descriptors (which
        leaves the parent's flock held by the parent) and start afresh."""
        fds = {self._fd, self._lock_fd, *(s.owner_lock for s in self._segments)}
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock = threading.Lock()
        self._segments, self._total, self._fd, self._lock_fd, self._seq = [], 0, -1, -1, 0
        self._prefix = ""


def usable_directory(configured: str | None) -> str | None:
    """The spill directory: *configured*, else the default state directory, else a temporary
    one; None (no spill, a warning) when none of them can be created."""
    candidates = [configured] if configured else [default_directory(),
                                                  os.path.join(tempfile.gettempdir(), f"llmtrace-spill-{os.getuid()}")]
    for candidate in candidates:
        try:
            Path(candidate).mkdir(parents=True, exist_ok=True)
            if os.access(candidate, os.W_OK | os.X_OK):
                return candidate
        except OSError:
            continue
    log.warning("llmtrace: no writable spill directory (%s); spans the endpoint refuses are dropped and counted",
                ", ".join(c for c in candidates if c))
    return None
