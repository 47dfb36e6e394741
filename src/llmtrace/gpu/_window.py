"""Ring-buffered per-device history with O(1) window mean and max for every quantity.

A span asks "mean and max of each GPU quantity between t0 and t1". Scanning the samples
costs O(window) per span (a request span covers hundreds), and the budget is ~3 µs per
span. So a series keeps, for each absolute sample index ``i`` and each quantity:

* running sums: ``S[i]`` (through ``i``) and ``X[i] = S[i] - v[i]`` (before ``i``), so
  ``mean(a..b) = (S[b] - X[a]) / (b - a + 1)``;
* a sparse table ``M[k][i] = max(v[i - 2^k + 1 .. i])``, so with ``2^k <= b - a + 1``:
  ``max(a..b) = max(M[k][b], M[k][a + 2^k - 1])``.

Both are filled on append (``log2(capacity)`` slice operations, in the sampler thread).
All quantities of one sample sit next to each other in ``array('d')`` rings
(``Q`` values per slot, slot ``i % capacity``), so a query is a handful of slices and
C-level ``map``/``zip`` calls whatever the number of quantities. An entry ``M[k][i]`` only
covers indices at or after its window start, which are retained whenever the query's
``a`` is, so ring reuse never corrupts a valid answer.

Timestamps live in a plain list (so :func:`bisect.bisect_left` runs in C) trimmed by
half whenever it reaches twice the capacity (amortised O(1)).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from itertools import repeat
from operator import add, sub, truediv

__all__ = ["Series", "Timeline"]


class Timeline:
    """Sample timestamps (monotonic ns) mapped to absolute sample indices."""

    __slots__ = ("_base", "_cap", "_ts")

    def __init__(self, capacity: int) -> None:
        self._cap = capacity
        self._ts: list[int] = []
        self._base = 0  # absolute index of self._ts[0]

    @property
    def next_index(self) -> int:
        return self._base + len(self._ts)

    @property
    def oldest(self) -> int:
        """Oldest absolute index still held by the rings."""
        return max(self._base, self._base + len(self._ts) - self._cap)

    def append(self, t_ns: int) -> int:
        ts = self._ts
        if len(ts) >= 2 * self._cap:
            drop = len(ts) - self._cap
            del ts[:drop]
            self._base += drop
        ts.append(t_ns)
        return self._base + len(ts) - 1

    def time(self, index: int) -> int:
        return self._ts[index - self._base]

    def window(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """Absolute indices ``(a, b)`` of the samples inside ``[start_ns, end_ns]``; ``b < a`` if none."""
        ts = self._ts
        base = self._base
        a = base + bisect_left(ts, start_ns)
        b = base + bisect_right(ts, end_ns) - 1
        oldest = base + len(ts) - self._cap
        return (a if a > oldest else max(oldest, base)), b

    def nearest(self, t_ns: int) -> int:
        """Absolute index of the retained sample closest to ``t_ns``; -1 when empty."""
        ts = self._ts
        if not ts:
            return -1
        pos = bisect_left(ts, t_ns)
        if pos >= len(ts):
            pos = len(ts) - 1
        elif pos > 0 and t_ns - ts[pos - 1] <= ts[pos] - t_ns:
            pos -= 1
        index = self._base + pos
        return index if index >= self.oldest else -1

    def at_or_before(self, t_ns: int) -> int:
        """Absolute index of the newest sample taken at or before ``t_ns`` (``base - 1`` if none)."""
        return self._base + bisect_right(self._ts, t_ns) - 1

    def __len__(self) -> int:
        return self.next_index - self.oldest


class Series:
    """History of one device (or one device group): a timeline, the windowed quantities
    (fixed by the first append; a new quantity later restarts the history), the latest
    memory limit and power, and the cumulative energy in joules for interpolation."""

    __slots__ = (
        "_cap", "_energy", "_energy_first", "_keys", "_last", "_levels", "_max", "_max_keys", "_mean_keys",
        "_q", "_sum", "_sumx", "_val", "last_power_w", "limit", "timeline",
    )  # fmt: skip

    def __init__(self, capacity: int) -> None:
        self._cap = capacity
        self._levels = max(1, capacity.bit_length())
        self.limit: float | None = None
        self.last_power_w: float | None = None
        self._reset(())

    def _reset(self, keys: tuple[str, ...]) -> None:
        cap, q = self._cap, len(keys)
        self.timeline = Timeline(cap)
        self._keys = keys
        self._mean_keys = tuple(k + ".mean" for k in keys)
        self._max_keys = tuple(k + ".max" for k in keys)
        self._q = q
        zeros = array("d", bytes(8 * cap * q))
        self._val = array("d", zeros)
        self._sum = array("d", zeros)
        self._sumx = array("d", zeros)
        self._max = [array("d", zeros) for _ in range(self._levels)] if q else []
        self._last: list[float] = [0.0] * q
        self._energy = array("d", bytes(8 * cap))
        self._energy_first = -1

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    def append(
        self,
        t_ns: int,
        means: Mapping[str, float],
        maxes: Mapping[str, float] | None = None,
        energy_j: float | None = None,
    ) -> None:
        """One sample. A quantity missing from ``means`` repeats its last value."""
        if any(k not in self._keys for k in means):
            self._reset(self._keys + tuple(k for k in means if k not in self._keys))
        keys, last = self._keys, self._last
        row = [means.get(k, last[i]) for i, k in enumerate(keys)]
        self._last = row
        index = self.timeline.append(t_ns)
        if energy_j is not None:
            if self._energy_first < 0:
                self._energy_first = index
            self._energy[index % self._cap] = energy_j
        if keys:
            peaks = row if maxes is None else [maxes.get(k, v) for k, v in zip(keys, row, strict=True)]
            self._store(index, row, peaks)

    def _store(self, index: int, row: list[float], peaks: list[float]) -> None:
        cap, q = self._cap, self._q
        base = (index % cap) * q
        end = base + q
        values = array("d", row)
        self._val[base:end] = values
        if index:
            prev = ((index - 1) % cap) * q
            self._sumx[base:end] = self._sum[prev : prev + q]
            self._sum[base:end] = array("d", map(add, self._sum[prev : prev + q], values))
        else:
            self._sumx[base:end] = array("d", bytes(8 * q))
            self._sum[base:end] = values
        levels = self._max
        levels[0][base:end] = array("d", peaks)
        span = 1
        for k in range(1, self._levels):
            if index - 2 * span + 1 < 0:
                break
            below = levels[k - 1]
            left = ((index - span) % cap) * q
            levels[k][base:end] = array("d", map(max, below[left : left + q], below[base:end]))
            span *= 2

    def aggregate(self, a: int, b: int, out: dict[str, float | int | str]) -> None:
        """``<key>.mean`` / ``<key>.max`` over absolute indices ``a..b`` (both retained)."""
        q, cap = self._q, self._cap
        if not q:
            return
        n = b - a + 1
        k = n.bit_length() - 1
        level = self._max[k]
        i = ((a + (1 << k) - 1) % cap) * q
        j = (b % cap) * q
        ia = (a % cap) * q
        out.update(zip(self._max_keys, map(max, level[i : i + q], level[j : j + q]), strict=True))
        sums = map(sub, self._sum[j : j + q], self._sumx[ia : ia + q])
        out.update(zip(self._mean_keys, map(truediv, sums, repeat(n)), strict=False))  # repeat() is endless

    def point(self, index: int, out: dict[str, float | int | str]) -> None:
        """Plain keys: the values of sample ``index`` (the across-device mean for a group)."""
        q = self._q
        base = (index % self._cap) * q
        out.update(zip(self._keys, self._val[base : base + q], strict=True))

    def energy_at(self, t_ns: int, max_extrapolate_ns: int) -> float | None:
        """Cumulative energy (J) at ``t_ns``: interpolated between samples; extrapolated from
        the last power reading for at most ``max_extrapolate_ns`` past the newest sample."""
        first = self._energy_first
        if first < 0:
            return None
        tl = self.timeline
        ts, base, cap = tl._ts, tl._base, self._cap
        lo = max(first, base, base + len(ts) - cap) - base  # oldest position holding energy
        if lo >= len(ts) or t_ns < ts[lo]:
            return None
        energy = self._energy
        pos = bisect_right(ts, t_ns) - 1
        if pos >= len(ts) - 1:
            over = t_ns - ts[-1]
            if over > max_extrapolate_ns:
                return None
            return energy[(base + len(ts) - 1) % cap] + (self.last_power_w or 0.0) * over / 1e9
        t0, t1 = ts[pos], ts[pos + 1]
        e0, e1 = energy[(base + pos) % cap], energy[(base + pos + 1) % cap]
        return e0 + (e1 - e0) * (t_ns - t0) / (t1 - t0) if t1 > t0 else e1
