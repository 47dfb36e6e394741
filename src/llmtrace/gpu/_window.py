"""Ring-buffered time series with O(1) window mean and max.

A span asks "mean and max of X between t0 and t1". Scanning the samples costs O(window)
per span, and a request span can cover hundreds of samples; the budget is ~3 µs per span.
So each series keeps, per sample index ``i`` (absolute, counting from the first pass):

* a running sum ``S[i]``, so ``mean(a..b) = (S[b] - S[a] + v[a]) / (b - a + 1)``;
* a sparse table ``M[k][i] = max(v[i - 2^k + 1 .. i])``, so
  ``max(a..b) = max(M[k][b], M[k][a + 2^k - 1])`` with ``2^k <= b - a + 1``.

Both are filled incrementally on append (``log2(capacity)`` operations, in the sampler
thread). Storage is ``array('d')`` rings of ``capacity`` entries, indexed ``i % capacity``:
an entry of ``M[k]`` only covers indices at or after its window start, which is still
retained whenever the query's ``a`` is, so ring reuse never corrupts a valid answer.

Timestamps live in a plain list (so :func:`bisect.bisect_left` runs in C) that is trimmed
by half whenever it reaches twice the capacity (amortised O(1)).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping

__all__ = ["Column", "Series", "Timeline"]


class Column:
    """One quantity: a mean column and a max column (equal for a single device)."""

    __slots__ = ("_cap", "_levels", "_max", "_mean", "_sum")

    def __init__(self, capacity: int) -> None:
        self._cap = capacity
        self._levels = max(1, capacity.bit_length())
        zeros = [0.0] * capacity
        self._mean = array("d", zeros)
        self._sum = array("d", zeros)
        self._max = [array("d", zeros) for _ in range(self._levels)]

    def append(self, index: int, mean_value: float, max_value: float) -> None:
        cap = self._cap
        slot = index % cap
        self._mean[slot] = mean_value
        self._sum[slot] = (self._sum[(index - 1) % cap] if index else 0.0) + mean_value
        levels = self._max
        levels[0][slot] = max_value
        span = 1
        for k in range(1, self._levels):
            if index - 2 * span + 1 < 0:
                break
            prev = levels[k - 1]
            left = prev[(index - span) % cap]
            right = prev[slot]
            levels[k][slot] = left if left > right else right
            span *= 2

    def mean(self, a: int, b: int) -> float:
        cap = self._cap
        return (self._sum[b % cap] - self._sum[a % cap] + self._mean[a % cap]) / (b - a + 1)

    def max(self, a: int, b: int) -> float:
        k = (b - a + 1).bit_length() - 1
        level = self._max[k]
        cap = self._cap
        left = level[(a + (1 << k) - 1) % cap]
        right = level[b % cap]
        return left if left > right else right

    def value(self, index: int) -> float:
        return self._mean[index % self._cap]

    def peak(self, index: int) -> float:
        return self._max[0][index % self._cap]


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
        return max(self._base, self.next_index - self._cap)

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
        a = self._base + bisect_left(ts, start_ns)
        b = self._base + bisect_right(ts, end_ns) - 1
        oldest = self.oldest
        return (a if a > oldest else oldest), b

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


class _Slot:
    """A column plus the absolute index of its first sample and its precomputed keys."""

    __slots__ = ("col", "first", "key", "max_key", "mean_key")

    def __init__(self, key: str, first: int, capacity: int) -> None:
        self.key = key
        self.mean_key = key + ".mean"
        self.max_key = key + ".max"
        self.first = first
        self.col = Column(capacity)


class Series:
    """Per-device (or per-device-group) history: one timeline, one column per span quantity,
    and the cumulative energy in joules for interpolation."""

    __slots__ = ("_cap", "_energy", "_energy_first", "_slots", "last_power_w", "limit", "timeline")

    def __init__(self, capacity: int) -> None:
        self._cap = capacity
        self.timeline = Timeline(capacity)
        self._slots: dict[str, _Slot] = {}
        self._energy = array("d", [0.0] * capacity)
        self._energy_first = -1
        self.limit: float | None = None
        self.last_power_w: float | None = None

    def append(
        self,
        t_ns: int,
        means: Mapping[str, float],
        maxes: Mapping[str, float],
        energy_j: float | None = None,
    ) -> None:
        index = self.timeline.append(t_ns)
        slots = self._slots
        for key, mean_value in means.items():
            slot = slots.get(key)
            if slot is None:
                slot = slots[key] = _Slot(key, index, self._cap)
            slot.col.append(index, mean_value, maxes.get(key, mean_value))
        if energy_j is not None:
            if self._energy_first < 0:
                self._energy_first = index
            self._energy[index % self._cap] = energy_j

    def slots(self) -> Iterable[_Slot]:
        return self._slots.values()

    def aggregate(self, a: int, b: int, out: dict[str, float | int | str]) -> None:
        """``<key>.mean`` / ``<key>.max`` over absolute indices ``a..b`` (both inside the ring)."""
        for slot in self._slots.values():
            lo = a if a >= slot.first else slot.first
            if lo <= b:
                out[slot.mean_key] = slot.col.mean(lo, b)
                out[slot.max_key] = slot.col.max(lo, b)

    def point(self, index: int, out: dict[str, float | int | str]) -> None:
        """Plain keys: the values of sample ``index`` (the across-device mean for a group)."""
        for slot in self._slots.values():
            if index >= slot.first:
                out[slot.key] = slot.col.value(index)

    def energy_at(self, t_ns: int, max_extrapolate_ns: int) -> float | None:
        """Cumulative energy (J) at ``t_ns``: interpolated between samples; extrapolated from
        the last power reading for at most ``max_extrapolate_ns`` past the newest sample."""
        tl = self.timeline
        if self._energy_first < 0 or len(tl) == 0:
            return None
        lo = max(tl.oldest, self._energy_first)
        last = tl.next_index - 1
        if lo > last or t_ns < tl.time(lo):
            return None
        cap = self._cap
        energy = self._energy
        i = tl.at_or_before(t_ns)
        if i >= last:
            over = t_ns - tl.time(last)
            if over > max_extrapolate_ns:
                return None
            power = self.last_power_w or 0.0
            return energy[last % cap] + power * over / 1e9
        t0, t1 = tl.time(i), tl.time(i + 1)
        e0, e1 = energy[i % cap], energy[(i + 1) % cap]
        return e0 + (e1 - e0) * (t_ns - t0) / (t1 - t0) if t1 > t0 else e1
