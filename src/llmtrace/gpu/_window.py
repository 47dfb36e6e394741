"""Per-device history with O(1) window mean and max, read without a lock.

A span asks "mean and max of each GPU quantity between t0 and t1", and the budget is
~3 µs per span whatever its length (a request span covers hundreds of samples). So for
each sample position ``i`` a series keeps, as tuples with one float per quantity:

* prefix sums ``P[i]`` of the samples before ``i`` (``P`` has one entry more than the
  samples), so ``mean(a..b) = (P[b + 1] - P[a]) / (b - a + 1)``;
* a sparse table ``M[k][i] = max(v[i - 2^k + 1 .. i])``, so with ``2^k <= b - a + 1``:
  ``max(a..b) = max(M[k][b], M[k][a + 2^k - 1])``.

A window is then at most two bisections, four tuple lookups and one call of a function
compiled for the series' quantities (see :func:`_kernels`). Appending costs
``log2(capacity)`` tuple maxima, in the sampler thread.

Concurrency: the sampler thread appends while span builders read, and readers take no
lock (CPython's GIL makes each list append atomic and keeps them in order). Every list
of a :class:`_History` only grows, and ``ts`` is appended last, so any position a reader
finds by bisecting ``ts`` already has its sums, maxima, values and energy. Nothing is
ever overwritten: when the lists reach ``capacity + capacity // 4`` the writer copies
the newest ``capacity`` samples into a new :class:`_History` and swaps it in with one
attribute store; a reader that still holds the old one keeps a consistent (if one
sample older) view. Only the newest ``capacity`` samples are used, so answers do not
depend on when the copy happens. An entry ``M[k][i]`` covers indices from
``i - 2^k + 1``, which a query only uses when they are inside its window.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from functools import lru_cache
from math import isfinite
from typing import NamedTuple

from llmtrace.semconv import HW_GPU_ID, HW_GPU_MEMORY_LIMIT

__all__ = ["Series"]

Row = tuple[float, ...]
Attrs = dict[str, float | int | str]
#: How far past ``capacity`` the lists grow before the newest ``capacity`` samples are
#: copied into a fresh history: copying a quarter as often costs O(1) amortised per
#: append and bounds memory at 1.25 x capacity.
_GROWTH_DIVISOR = 4


class _Kernels(NamedTuple):
    """Functions specialised to one tuple of quantities (see :func:`_kernels`)."""

    aggregate: Callable[[Row, Row, Row, Row, int, float | None, str], Attrs]
    point: Callable[[Row, float | None, str], Attrs]
    peak: Callable[[Row, Row], Row]
    add: Callable[[Row, Row], Row]
    grow: Callable[[list[list[Row]], int], None]


@lru_cache(maxsize=64)
def _kernels(keys: tuple[str, ...], levels: int) -> _Kernels:
    """Compile the per-window arithmetic for ``keys`` (and ``levels`` sparse-table levels).

    Why generated code: a dict display with constant keys is built by one bytecode, and
    the 3.11 interpreter specialises float subtraction, division and comparison; for six
    quantities this is ~3x cheaper than ``dict(zip(keys, map(max, ...)))`` pipelines
    (C-level ``max`` pays argument-tuple overhead per element). ``grow`` appends one
    sample's entry to every level above 0, unrolled (half the sampler's append cost of a
    loop calling ``peak``). The keys are ``repr``-ed into the source, so any string is
    safe; ``grow`` only appends to the lists it is given, the other functions are pure.
    """
    q = len(keys)

    def unpack(row: str, prefix: str) -> str:
        if not q:
            return ""
        names = ", ".join(f"{prefix}{i}" for i in range(q))
        return f"    {names}{',' if q == 1 else ''} = {row}\n"

    def row(items: list[str]) -> str:
        return "(" + ", ".join(items) + ",)" if items else "()"

    bigger = [f"a{i} if a{i} >= b{i} else b{i}" for i in range(q)]  # == max(a, b): rows hold no NaN
    means = [f"{k + '.mean'!r}: (h{i} - l{i}) / n" for i, k in enumerate(keys)]
    maxes = [f"{k + '.max'!r}: {bigger[i]}" for i, k in enumerate(keys)]
    plain = [f"{k!r}: v{i}" for i, k in enumerate(keys)]
    tail = [f"{HW_GPU_MEMORY_LIMIT!r}: limit", f"{HW_GPU_ID!r}: ids"]
    source = (
        "def aggregate(hi, lo, m1, m2, n, limit, ids):\n"
        + unpack("hi", "h") + unpack("lo", "l") + unpack("m1", "a") + unpack("m2", "b")
        + "    return {" + ", ".join(means + maxes + tail) + "}\n"
        "def point(values, limit, ids):\n"
        + unpack("values", "v")
        + "    return {" + ", ".join(plain + tail) + "}\n"
        "def peak(x, y):\n"
        + unpack("x", "a") + unpack("y", "b")
        + "    return " + row(bigger) + "\n"
        "def add(x, y):\n"
        + unpack("x", "a") + unpack("y", "b")
        + "    return " + row([f"a{i} + b{i}" for i in range(q)]) + "\n"
        "def grow(levels, pos):\n"
        + unpack("levels[0][pos]", "b")
        + "".join(unpack(f"levels[{k - 1}][pos - {1 << (k - 1)}]", "a")
                  + "".join(f"    b{i} = {bigger[i]}\n" for i in range(q))
                  + f"    levels[{k}].append({row([f'b{i}' for i in range(q)])})\n"
                  for k in range(1, levels))
        + "    return None\n"
    )  # fmt: skip
    namespace: dict[str, object] = {}
    exec(compile(source, f"<llmtrace.gpu window kernels {keys!r}>", "exec"), namespace)
    names = ("aggregate", "point", "peak", "add", "grow")
    return _Kernels(*(namespace[name] for name in names))  # type: ignore[arg-type]


def _by_length(levels: list[list[Row]]) -> list[tuple[list[Row], int]]:
    """For each window length ``n`` (index), the sparse-table level ``k`` with
    ``2^k <= n < 2^(k+1)`` and ``2^k - 1``: a list index instead of ``n.bit_length()``
    and a shift per span. Long enough for any window a history can hold (< 2^levels)."""
    table: list[tuple[list[Row], int]] = [(levels[0], 0)]  # n = 0 is never asked
    for k, level in enumerate(levels):
        table.extend([(level, (1 << k) - 1)] * (1 << k))
    return table


class _History:
    """One generation of a series' samples: parallel lists that only grow (``ts`` last)."""

    __slots__ = (
        "aggregate", "base", "by_length", "energy", "energy_first", "kernels", "keys", "levels", "point", "prefix",
        "ts", "vals",
    )  # fmt: skip

    def __init__(self, keys: tuple[str, ...], levels: int) -> None:
        self.keys = keys
        self.kernels = _kernels(keys, levels)
        self.aggregate, self.point = self.kernels.aggregate, self.kernels.point  # one attribute hop per span
        self.base = 0  # absolute sample index of position 0
        self.ts: list[int] = []
        self.vals: list[Row] = []  # the values (for a group: the per-pass means)
        self.prefix: list[Row] = [(0.0,) * len(keys)]
        self.levels: list[list[Row]] = [[] for _ in range(levels)]
        self.by_length = _by_length(self.levels)
        self.energy: list[float] = []  # cumulative joules; 0.0 before energy_first
        self.energy_first = -1  # position of the first sample with energy, -1 if none yet

    def newest(self, keep: int) -> _History:
        """A copy holding the newest ``keep`` samples."""
        drop = len(self.ts) - keep
        new = _History.__new__(_History)
        new.keys, new.kernels, new.base = self.keys, self.kernels, self.base + drop
        new.aggregate, new.point = self.aggregate, self.point
        new.ts, new.vals, new.prefix = self.ts[drop:], self.vals[drop:], self.prefix[drop:]
        new.levels = [level[drop:] for level in self.levels]
        new.by_length = _by_length(new.levels)
        new.energy = self.energy[drop:]
        new.energy_first = max(0, self.energy_first - drop) if self.energy_first >= 0 else -1
        return new


class Series:
    """History of one device (or one device group): the windowed quantities (fixed by
    the first append; a new quantity later restarts the history), the latest memory
    limit and power, and the cumulative energy in joules for interpolation."""

    __slots__ = ("_cap", "_grow_from", "_h", "_last", "_levels", "last_power_w", "limit")

    def __init__(self, capacity: int) -> None:
        self._cap = max(1, capacity)
        self._levels = self._cap.bit_length()  # 2^(levels-1) <= capacity: every window length
        self._grow_from = 1 << (self._levels - 2) if self._levels > 1 else 0  # from here every level has a left half
        self.limit: float | None = None
        self.last_power_w: float | None = None
        self._h = _History((), self._levels)
        self._last: Row = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return self._h.keys

    # ------------------------------------------------------------------ writer
    def append(
        self,
        t_ns: int,
        means: Mapping[str, float],
        maxes: Mapping[str, float] | None = None,
        energy_j: float | None = None,
    ) -> None:
        """One sample. A quantity missing from ``means`` (or not finite: a NaN would
        poison every later running sum) repeats its last value."""
        h = self._h
        keys = h.keys
        fresh = [k for k, v in means.items() if k not in keys and isfinite(v)]
        if fresh:
            # No window may mix samples with and without a quantity: start over, keeping
            # the last values so that a quantity absent from this pass still repeats.
            old = dict(zip(keys, self._last, strict=True))
            h = self._h = _History(keys + tuple(fresh), self._levels)
            keys = h.keys
            self._last = tuple(old.get(k, 0.0) for k in keys)
        row = tuple(v if (v := means.get(k)) is not None and isfinite(v) else last
                    for k, last in zip(keys, self._last, strict=True))  # fmt: skip
        self._last = row
        peaks = row
        if maxes is not None:
            peaks = tuple(m if (m := maxes.get(k)) is not None and isfinite(m) else v
                          for k, v in zip(keys, row, strict=True))  # fmt: skip
        self._push(h, t_ns, row, peaks, energy_j)
        if len(h.ts) >= self._cap + max(1, self._cap // _GROWTH_DIVISOR):
            self._h = h.newest(self._cap)

    def _push(self, h: _History, t_ns: int, row: Row, peaks: Row, energy_j: float | None) -> None:
        pos = len(h.ts)
        kernels = h.kernels
        h.vals.append(row)
        h.prefix.append(kernels.add(h.prefix[pos], row))
        levels = h.levels
        levels[0].append(peaks)
        if pos >= self._grow_from:
            kernels.grow(levels, pos)
        else:
            half = 1
            for k in range(1, len(levels)):
                below = levels[k - 1]
                left = pos - half
                # left < 0 only in the first history: that entry is never used by a query.
                levels[k].append(below[pos] if left < 0 else kernels.peak(below[left], below[pos]))
                half *= 2
        if energy_j is None or not isfinite(energy_j):
            energy_j = h.energy[-1] if h.energy_first >= 0 else 0.0
        elif h.energy_first < 0:
            h.energy_first = pos
        h.energy.append(energy_j)
        h.ts.append(t_ns)  # last: publishes the sample to readers

    # ------------------------------------------------------------------ readers
    def attributes(self, start: int, end: int, period: int, stale: int, ids: str) -> Attrs | None:
        """Span attributes over ``[start, end]``: ``<key>.mean``/``<key>.max`` over the
        samples inside when the span is longer than ``period``; otherwise, or when none
        fall inside, the plain ``<key>`` values of the sample nearest the midpoint unless
        that is further than half the span plus ``stale`` from it. Plus the memory limit
        and ``hw.gpu.id`` = ``ids``. ``None`` when there is nothing trustworthy."""
        h = self._h
        ts = h.ts
        count = len(ts)  # positions below stay valid whatever the writer appends meanwhile
        if not count:
            return None
        oldest = count - self._cap
        if end - start > period:
            a = bisect_left(ts, start)
            if a < oldest:  # noqa: PLR1730 - a max() call costs ~10 compares on this per-span path
                a = oldest
            # A span is mostly annotated as it ends, after the newest sample: no bisection then.
            b = count - 1 if end >= ts[count - 1] else bisect_right(ts, end, 0, count) - 1
            if b >= a:
                n = b - a + 1
                level, shift = h.by_length[n]
                prefix = h.prefix
                limit = self.limit
                out = h.aggregate(prefix[b + 1], prefix[a], level[b], level[a + shift], n, limit, ids)
                if limit is None:  # memory query unsupported: no limit attribute
                    del out[HW_GPU_MEMORY_LIMIT]
                return out
        mid = (start + end) // 2
        pos = _nearest(ts, mid, oldest)
        if pos < 0 or abs(ts[pos] - mid) > (end - start) // 2 + stale:
            return None
        limit = self.limit
        out = h.point(h.vals[pos], limit, ids)
        if limit is None:
            del out[HW_GPU_MEMORY_LIMIT]
        return out

    def energy_between(self, start: int, end: int, max_extrapolate_ns: int) -> float | None:
        """Joules between two instants (see :meth:`energy_at`); never negative."""
        h = self._h
        first = h.energy_first
        ts = h.ts
        count = len(ts)
        lo = count - self._cap
        if lo < first:  # noqa: PLR1730 - cheaper than max() on this per-step path
            lo = first
        if first < 0 or lo >= count or start < ts[lo] or end < ts[lo]:
            return None
        energy, last, power_w = h.energy, count - 1, self.last_power_w or 0.0
        t_last = ts[last]
        # The two usual steps take one bisection at most; the arithmetic is _cumulative's.
        if start >= t_last and end >= start:  # after the newest sample: both extrapolated
            if end - t_last > max_extrapolate_ns:
                return None
            e_last = energy[last]
            joules = (e_last + power_w * (end - t_last) / 1e9) - (e_last + power_w * (start - t_last) / 1e9)
        elif start <= end < ts[pos := bisect_right(ts, start, 0, last)]:  # both between two samples
            t0, t1, e0 = ts[pos - 1], ts[pos], energy[pos - 1]
            de, dt = energy[pos] - e0, t1 - t0
            joules = (e0 + de * (end - t0) / dt) - (e0 + de * (start - t0) / dt)
        else:
            at_start = _cumulative(ts, energy, last, start, max_extrapolate_ns, power_w)
            at_end = _cumulative(ts, energy, last, end, max_extrapolate_ns, power_w)
            if at_start is None or at_end is None:
                return None
            joules = at_end - at_start
        return joules if joules > 0.0 else 0.0  # == max(0.0, joules), without a builtin call

    def energy_at(self, t_ns: int, max_extrapolate_ns: int) -> float | None:
        """Cumulative energy (J) at ``t_ns``: interpolated between samples; extrapolated from
        the last power reading for at most ``max_extrapolate_ns`` past the newest sample."""
        return _energy_at(self._h, self._cap, t_ns, max_extrapolate_ns, self.last_power_w)

    # ------------------------------------------------------------------ by sample index
    # Absolute sample indices (0 = the first sample of this history): for tests and tools.
    @property
    def oldest(self) -> int:
        """Absolute index of the oldest sample still used."""
        h = self._h
        return h.base + max(0, len(h.ts) - self._cap)

    def window(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """Absolute indices ``(a, b)`` of the samples inside ``[start_ns, end_ns]``; ``b < a`` if none."""
        h = self._h
        a = max(bisect_left(h.ts, start_ns), len(h.ts) - self._cap)
        return h.base + a, h.base + bisect_right(h.ts, end_ns) - 1

    def nearest(self, t_ns: int) -> int:
        """Absolute index of the retained sample closest to ``t_ns``; -1 when there is none."""
        h = self._h
        pos = _nearest(h.ts, t_ns, len(h.ts) - self._cap)
        return -1 if pos < 0 else h.base + pos

    def aggregate(self, a: int, b: int) -> Attrs:
        """``<key>.mean`` / ``<key>.max`` over absolute indices ``a..b`` (both retained)."""
        h = self._h
        a, b = a - h.base, b - h.base
        n = b - a + 1
        k = n.bit_length() - 1
        level = h.levels[k]
        out = h.kernels.aggregate(h.prefix[b + 1], h.prefix[a], level[b], level[a + (1 << k) - 1], n, None, "")
        del out[HW_GPU_MEMORY_LIMIT], out[HW_GPU_ID]
        return out

    def point(self, index: int) -> Attrs:
        """Plain keys: the values of sample ``index`` (the across-device mean for a group)."""
        h = self._h
        out = h.kernels.point(h.vals[index - h.base], None, "")
        del out[HW_GPU_MEMORY_LIMIT], out[HW_GPU_ID]
        return out


def _nearest(ts: list[int], t_ns: int, oldest: int) -> int:
    """Position closest to ``t_ns`` among ``ts[oldest:]`` (the earlier one on a tie); -1 when empty."""
    count = len(ts)
    if not count:
        return -1
    pos = bisect_left(ts, t_ns)
    if pos >= count:
        return count - 1
    if oldest < 0:  # noqa: PLR1730 - as above, a compare is cheaper than max()
        oldest = 0
    if pos <= oldest:
        return oldest
    if t_ns - ts[pos - 1] <= ts[pos] - t_ns:
        return pos - 1
    return pos


def _energy_at(h: _History, cap: int, t_ns: int, max_extrapolate_ns: int, power_w: float | None) -> float | None:
    first = h.energy_first
    ts = h.ts
    count = len(ts)  # read once: the writer may append meanwhile, and positions below stay valid
    lo = max(first, count - cap)  # oldest position holding energy
    if first < 0 or lo >= count or t_ns < ts[lo]:
        return None
    return _cumulative(ts, h.energy, count - 1, t_ns, max_extrapolate_ns, power_w or 0.0)


def _cumulative(ts: list[int], energy: list[float], last: int, t_ns: int, slack: int, power_w: float) -> float | None:
    """Energy at ``t_ns`` (not before the oldest usable sample), ``last`` the newest position."""
    t_last = ts[last]
    if t_ns >= t_last:
        over = t_ns - t_last
        return None if over > slack else energy[last] + power_w * over / 1e9
    pos = bisect_right(ts, t_ns, 0, last) - 1
    t0, t1 = ts[pos], ts[pos + 1]
    e0, e1 = energy[pos], energy[pos + 1]
    return e0 + (e1 - e0) * (t_ns - t0) / (t1 - t0) if t1 > t0 else e1
