//! The interval sweeps of `llmtrace.analysis.gpu_idle.iter_gaps`, compiled.
//!
//! A line-for-line port of the Python functions named in each doc comment (`_busy`,
//! `_segment_gaps`, `paint_host` with `_paint_around` and `_sweep`, `_classify_all`): the
//! same gaps, cause splits and work-waiting times, as `Gap` named tuples. The Python code
//! stays the reference and the fallback; `tests/analysis/test_gpu_idle_native.py` checks
//! that both give equal results on simulated and hand-built engines.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::named_tuple;

pub(crate) type Interval = (i64, i64);

/// Start and end of a `Span` named tuple (fields 4 and 5).
fn span_times(span: &Bound<'_, PyAny>) -> PyResult<Interval> {
    let t = span.cast::<PyTuple>()?;
    Ok((t.get_item(4)?.extract()?, t.get_item(5)?.extract()?))
}

/// `intervals.merge`: the union as sorted, disjoint, non-touching intervals.
fn merge(intervals: &[Interval]) -> Vec<Interval> {
    let mut sorted = intervals.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<Interval> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        if e <= s {
            continue;
        }
        match out.last_mut() {
            Some(last) if s <= last.1 => {
                if e > last.1 {
                    last.1 = e;
                }
            }
            _ => out.push((s, e)),
        }
    }
    out
}

/// `_busy`: forwards that are sorted, disjoint and non-empty are their own union.
fn busy(forwards: Vec<Interval>) -> Vec<Interval> {
    let ordered =
        forwards.iter().all(|&(s, e)| s < e) && forwards.windows(2).all(|w| w[0].1 <= w[1].0);
    if ordered {
        forwards
    } else {
        merge(&forwards)
    }
}

/// `_segment_gaps`: the gaps of every segment in the merged `busy` list.
fn segment_gaps(segs: &[Interval], busy: &[Interval]) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(a, b) in segs {
        while j < busy.len() && busy[j].1 <= a {
            j += 1;
        }
        let mut k = j;
        let mut cur = a;
        while k < busy.len() && busy[k].0 < b {
            let (s, e) = busy[k];
            if s > cur {
                out.push((cur, s));
            }
            cur = cur.max(e);
            k += 1;
        }
        if cur < b {
            out.push((cur, b));
        }
    }
    out
}

/// Disjoint host segments, sorted: starts, ends, cause indexes.
#[derive(Default)]
pub(crate) struct Painted {
    pub(crate) starts: Vec<i64>,
    pub(crate) ends: Vec<i64>,
    pub(crate) causes: Vec<u8>,
}

impl Painted {
    fn extend_from(&mut self, other: &Painted, from: usize, to: usize) {
        self.starts.extend_from_slice(&other.starts[from..to]);
        self.ends.extend_from_slice(&other.ends[from..to]);
        self.causes.extend_from_slice(&other.causes[from..to]);
    }
}

/// `paint_host`: host spans as they are when sorted and disjoint, gc/tokenize painted in.
fn paint_host(hosts: Painted, extras: &mut [(i64, i64, u8)]) -> Painted {
    let ok = hosts.starts.iter().zip(&hosts.ends).all(|(s, e)| s <= e)
        && hosts
            .ends
            .iter()
            .zip(hosts.starts.iter().skip(1))
            .all(|(e, s)| e <= s);
    if !ok {
        let mut all: Vec<(i64, i64, u8)> = (0..hosts.starts.len())
            .map(|i| (hosts.starts[i], hosts.ends[i], hosts.causes[i]))
            .collect();
        all.extend_from_slice(extras);
        return sweep(&all);
    }
    if extras.is_empty() {
        return hosts;
    }
    extras.sort_unstable();
    paint_around(&hosts, extras)
}

/// `_paint_around`: host segments no extra touches are copied; each cluster of extras is
/// swept with the host segments under it.
fn paint_around(host: &Painted, extras: &[(i64, i64, u8)]) -> Painted {
    let mut out = Painted::default();
    let (starts, ends) = (&host.starts, &host.ends);
    let mut done = 0;
    let mut i = 0;
    let n = extras.len();
    while i < n {
        let (lo, mut hi, _) = extras[i];
        let first = done + ends[done..].partition_point(|&x| x <= lo); // bisect_right
        let mut cluster = vec![extras[i]];
        i += 1;
        let last = loop {
            let last = first + starts[first..].partition_point(|&x| x < hi); // bisect_left
            if last > first && ends[last - 1] > hi {
                hi = ends[last - 1];
            }
            if i < n && extras[i].0 < hi {
                cluster.push(extras[i]);
                hi = hi.max(extras[i].1);
                i += 1;
                continue;
            }
            break last;
        };
        out.extend_from(host, done, first);
        let mut under: Vec<(i64, i64, u8)> = (first..last)
            .map(|k| (starts[k], ends[k], host.causes[k]))
            .collect();
        under.extend_from_slice(&cluster);
        let swept = sweep(&under);
        out.extend_from(&swept, 0, swept.starts.len());
        done = last;
    }
    out.extend_from(host, done, starts.len());
    out
}

/// `_sweep`: priority painting of overlapping (start, end, cause) intervals; where causes
/// overlap the lowest index wins. Events sort as the Python ints `pos << 4 | start << 3 |
/// cause` do: by position, ends before starts, then by cause.
fn sweep(intervals: &[(i64, i64, u8)]) -> Painted {
    let mut events: Vec<(i64, u8, u8)> = Vec::with_capacity(intervals.len() * 2);
    events.extend(intervals.iter().map(|&(s, _, c)| (s, 1, c)));
    events.extend(intervals.iter().map(|&(_, e, c)| (e, 0, c)));
    events.sort_unstable();
    let mut counts = [0i64; 8];
    let mut mask: u32 = 0;
    let mut out = Painted::default();
    let mut prev = events.first().map_or(0, |ev| ev.0);
    for (pos, is_start, ci) in events {
        if pos > prev && mask != 0 {
            let active = mask.trailing_zeros() as u8;
            if out.causes.last() == Some(&active) && out.ends.last() == Some(&prev) {
                *out.ends.last_mut().expect("non-empty") = pos;
            } else {
                out.starts.push(prev);
                out.ends.push(pos);
                out.causes.push(active);
            }
        }
        let ci = usize::from(ci & 7);
        counts[ci] += if is_start == 1 { 1 } else { -1 };
        if counts[ci] > 0 {
            mask |= 1 << ci;
        } else {
            mask &= !(1 << ci);
        }
        prev = pos;
    }
    out
}

/// `_covered`: how much of [a, b) the sorted, disjoint intervals cover, from index k on.
pub(crate) fn covered(a: i64, b: i64, intervals: &[Interval], mut k: usize) -> i64 {
    let mut total = 0;
    while k < intervals.len() && intervals[k].0 < b {
        let (s, e) = intervals[k];
        let ov = e.min(b) - s.max(a);
        if ov > 0 {
            total += ov;
        }
        k += 1;
    }
    total
}

/// `iter_gaps` after its Python preparation: the classified gaps of one engine, as a list
/// of `gap_type` tuples `(engine_id, start, end, ((cause, ns), ...), work_waiting_ns)`.
///
/// `forwards` and `hosts` are `Span` tuples (hosts in step order), `host_cause` maps a host
/// span name to its cause index, `extras` are `(start, end, cause)` gc and tokenize
/// intervals, `work` is merged, `causes` is `gpu_idle.CAUSES`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn classify_gaps<'py>(
    py: Python<'py>,
    engine_id: Bound<'py, PyAny>,
    segs: Vec<Interval>,
    forwards: &Bound<'py, PyList>,
    hosts: &Bound<'py, PyList>,
    host_cause: &Bound<'py, PyDict>,
    extras: Vec<(i64, i64, u8)>,
    work: Vec<Interval>,
    gap_type: &Bound<'py, PyAny>,
    causes: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyList>> {
    let fw: Vec<Interval> = forwards
        .iter()
        .map(|f| span_times(&f))
        .collect::<PyResult<_>>()?;
    let mut painted_in = Painted::default();
    for h in hosts.iter() {
        let (s, e) = span_times(&h)?;
        let name = h.cast::<PyTuple>()?.get_item(3)?;
        let cause: u8 = host_cause
            .get_item(name)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err("host span name"))?
            .extract()?;
        painted_in.starts.push(s);
        painted_in.ends.push(e);
        painted_in.causes.push(cause);
    }
    classify(
        py, &engine_id, &segs, fw, painted_in, extras, &work, gap_type, causes,
    )
}

/// One classified gap: its bounds, time per cause index (`per[other]` is what no host span
/// explains) and its work-waiting time.
#[derive(Clone, Copy)]
pub(crate) struct GapRec {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) per: [i64; 8],
    pub(crate) waiting: i64,
}

/// The sweeps of `iter_gaps` over plain intervals: forwards `fw` and step host segments
/// `hosts` (in step order), shared by [`classify_gaps`] and the compiled engine table.
#[allow(clippy::too_many_arguments)]
pub(crate) fn classify<'py>(
    py: Python<'py>,
    engine_id: &Bound<'py, PyAny>,
    segs: &[Interval],
    fw: Vec<Interval>,
    painted_in: Painted,
    extras: Vec<(i64, i64, u8)>,
    work: &[Interval],
    gap_type: &Bound<'py, PyAny>,
    causes: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyList>> {
    let recs = classify_raw(segs, fw, painted_in, extras, work, causes.len())?;
    gaps_to_py(py, engine_id, &recs, gap_type, causes)
}

/// `_classify_all` after `_busy`, `_segment_gaps` and `paint_host`, as plain records.
pub(crate) fn classify_raw(
    segs: &[Interval],
    fw: Vec<Interval>,
    painted_in: Painted,
    mut extras: Vec<(i64, i64, u8)>,
    work: &[Interval],
    ncauses: usize,
) -> PyResult<Vec<GapRec>> {
    if ncauses == 0 || ncauses > 8 || extras.iter().any(|x| usize::from(x.2) >= ncauses) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "cause indexes out of range",
        ));
    }
    let raw = segment_gaps(segs, &busy(fw));
    let painted = paint_host(painted_in, &mut extras);
    let other = ncauses - 1;
    let (starts, ends, cause_of) = (&painted.starts, &painted.ends, &painted.causes);
    let n = starts.len();
    let mut out = Vec::with_capacity(raw.len());
    let (mut j, mut w) = (0usize, 0usize);
    for (a, b) in raw {
        while j < n && ends[j] <= a {
            j += 1;
        }
        let mut k = j;
        let mut per = [0i64; 8];
        if k < n && starts[k] < b {
            let mut unexplained = b - a;
            while k < n && starts[k] < b {
                let ov = ends[k].min(b) - starts[k].max(a);
                if ov > 0 {
                    per[usize::from(cause_of[k])] += ov;
                    unexplained -= ov;
                }
                k += 1;
            }
            per[other] = unexplained;
        } else {
            per[other] = b - a;
        }
        while w < work.len() && work[w].1 <= a {
            w += 1;
        }
        let waiting = if w < work.len() && work[w].0 <= a && work[w].1 >= b {
            b - a
        } else {
            covered(a, b, work, w)
        };
        out.push(GapRec {
            start: a,
            end: b,
            per,
            waiting,
        });
    }
    Ok(out)
}

/// The records as `gap_type` tuples `(engine_id, start, end, ((cause, ns), ...), waiting)`
/// with only the non-zero causes, in `causes` order.
pub(crate) fn gaps_to_py<'py>(
    py: Python<'py>,
    engine_id: &Bound<'py, PyAny>,
    recs: &[GapRec],
    gap_type: &Bound<'py, PyAny>,
    causes: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyList>> {
    if !named_tuple::is_tuple_class(gap_type) {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "gap_type must be a named tuple class",
        ));
    }
    let names: Vec<Bound<'py, PyAny>> = causes.iter().collect();
    let out = PyList::empty(py);
    for g in recs {
        let items: Vec<Bound<'py, PyTuple>> = g.per[..names.len()]
            .iter()
            .enumerate()
            .filter(|(_, ns)| **ns != 0)
            .map(|(i, ns)| PyTuple::new(py, [names[i].clone(), ns.into_pyobject(py)?.into_any()]))
            .collect::<PyResult<_>>()?;
        let fields = [
            engine_id.clone(),
            g.start.into_pyobject(py)?.into_any(),
            g.end.into_pyobject(py)?.into_any(),
            PyTuple::new(py, items)?.into_any(),
            g.waiting.into_pyobject(py)?.into_any(),
        ];
        let gap = named_tuple::new(
            py,
            gap_type.as_ptr(),
            fields.into_iter().map(Bound::into_ptr),
        )?;
        out.append(gap)?;
    }
    Ok(out)
}
