//! GPU idle of one engine over the table's columns: the gap sweeps of `gpu_idle.iter_gaps`
//! and what `gap_totals` and `window_idle` compute from the gaps, in one call.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::columns::SCHEDULE;
use super::EngineTable;
use crate::gpu_idle::{self, Interval, Painted};

/// One engine's classified gaps, kept in Rust; made into `Gap` tuples when read.
#[pyclass(module = "llmtrace_native", frozen)]
pub struct GapSet {
    recs: Vec<gpu_idle::GapRec>,
}

#[pymethods]
impl GapSet {
    fn __len__(&self) -> usize {
        self.recs.len()
    }

    /// Gaps `lo..hi` as `gap_type` tuples `(engine_id, start, end, causes, waiting)`.
    fn rows<'py>(
        &self,
        py: Python<'py>,
        lo: usize,
        hi: usize,
        engine_id: Bound<'py, PyAny>,
        gap_type: &Bound<'py, PyAny>,
        causes: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyList>> {
        let hi = hi.min(self.recs.len());
        gpu_idle::gaps_to_py(py, &engine_id, &self.recs[lo.min(hi)..hi], gap_type, causes)
    }
}
/// `gpu_idle.TOP_GAPS`.
const TOP_GAPS: usize = 20;

/// Idle time, work-waiting time and `(cause index, ns)` in first-seen order, of one window.
type WindowIdle = (i64, i64, Vec<(usize, i64)>);

/// `gpu_idle.window_idle`: the gaps' time inside window `(ws, we)`; a gap cut by the
/// window counts its work-waiting and cause times in proportion, truncated.
fn window_idle(recs: &[gpu_idle::GapRec], (ws, we): Interval, ncauses: usize) -> WindowIdle {
    let lo = recs.partition_point(|g| g.start < ws).saturating_sub(1); // bisect_left - 1
    let hi = recs.partition_point(|g| g.start <= we); // bisect_right
    let (mut idle, mut work) = (0i64, 0i64);
    let mut causes: Vec<(usize, i64)> = Vec::new();
    let mut add = |c: usize, ns: i64| match causes.iter_mut().find(|x| x.0 == c) {
        Some(x) => x.1 += ns,
        None => causes.push((c, ns)),
    };
    for g in &recs[lo..hi.max(lo)] {
        let (gs, ge) = (g.start, g.end);
        let split = g.per[..ncauses]
            .iter()
            .enumerate()
            .filter(|(_, ns)| **ns != 0);
        if gs >= ws && ge <= we {
            idle += ge - gs;
            work += g.waiting;
            split.for_each(|(c, ns)| add(c, *ns));
            continue;
        }
        let ov = ge.min(we) - gs.max(ws);
        if ov <= 0 {
            continue;
        }
        let frac = ov as f64 / (ge - gs) as f64;
        idle += ov;
        work += (g.waiting as f64 * frac) as i64;
        split.for_each(|(c, ns)| add(c, (*ns as f64 * frac) as i64));
    }
    (idle, work, causes)
}
/// `stats.percentile` over sorted integers (the result a float, as in Python).
fn percentile_ints(xs: &[i64], q: f64) -> f64 {
    if xs.len() == 1 {
        return xs[0] as f64;
    }
    let pos = (xs.len() - 1) as f64 * q / 100.0;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(xs.len() - 1);
    xs[lo] as f64 + (xs[hi] - xs[lo]) as f64 * (pos - lo as f64)
}

/// `(gaps, per-cause ns, with_work, engine_side, idle, p50, p99, top gap indexes, the
/// timeline's gap index or -1, per-window idle)`: see [`EngineTable::idle`].
pub(super) type Idle = (
    GapSet,
    Vec<i64>,
    i64,
    i64,
    i64,
    f64,
    f64,
    Vec<usize>,
    i64,
    Vec<WindowIdle>,
);

impl EngineTable {
    /// [`EngineTable::idle`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn idle_of(
        &self,
        e: usize,
        segs: Vec<Interval>,
        host_cause: [u8; 4],
        extras: Vec<(i64, i64, u8)>,
        work: Vec<Interval>,
        engine_work: Vec<Interval>,
        windows: Vec<Interval>,
        causes: &Bound<'_, PyTuple>,
    ) -> PyResult<Idle> {
        let ncauses = causes.len();
        let recs = self.classify(e, &segs, host_cause, extras, &work, ncauses)?;
        let mut by_cause = vec![0i64; ncauses];
        let mut with_work = 0i64;
        for g in &recs {
            with_work += g.waiting;
            for (total, ns) in by_cause.iter_mut().zip(&g.per) {
                *total += ns;
            }
        }
        let (idle, p50, p99) = durations(&recs);
        let per_window = windows
            .iter()
            .map(|&w| window_idle(&recs, w, ncauses))
            .collect();
        let side = engine_side(&recs, &engine_work);
        let (top, worst) = (top_gaps(&recs), worst(&recs));
        Ok((
            GapSet { recs },
            by_cause,
            with_work,
            side,
            idle,
            p50,
            p99,
            top,
            worst,
            per_window,
        ))
    }

    /// The sweeps of `iter_gaps` over engine `e`'s forwards and host spans
    /// (`host_cause[name code - 2]` is the cause index of schedule, forward (unused),
    /// sample, postprocess).
    fn classify(
        &self,
        e: usize,
        segs: &[Interval],
        host_cause: [u8; 4],
        extras: Vec<(i64, i64, u8)>,
        work: &[Interval],
        ncauses: usize,
    ) -> PyResult<Vec<gpu_idle::GapRec>> {
        let cols = self.engine(e)?;
        let spans = &self.data.spans;
        let fw: Vec<Interval> = cols
            .fwd
            .iter()
            .map(|&i| (spans[i as usize].start, spans[i as usize].end))
            .collect();
        let mut hosts = Painted::default();
        for &i in &cols.host {
            let s = &spans[i as usize];
            hosts.starts.push(s.start);
            hosts.ends.push(s.end);
            hosts
                .causes
                .push(host_cause[usize::from(s.name - SCHEDULE)]);
        }
        gpu_idle::classify_raw(segs, fw, hosts, extras, work, ncauses)
    }
}

/// `gpu_idle._overlap` of the gaps with work waiting and the engine's own work.
fn engine_side(recs: &[gpu_idle::GapRec], engine_work: &[Interval]) -> i64 {
    let (mut side, mut i) = (0i64, 0usize);
    for g in recs.iter().filter(|g| g.waiting != 0) {
        while i < engine_work.len() && engine_work[i].1 <= g.start {
            i += 1;
        }
        side += gpu_idle::covered(g.start, g.end, engine_work, i);
    }
    side
}

/// The total idle time and the p50 and p99 gap durations.
fn durations(recs: &[gpu_idle::GapRec]) -> (i64, f64, f64) {
    let mut durations: Vec<i64> = recs.iter().map(|g| g.end - g.start).collect();
    let idle: i64 = durations.iter().sum();
    if durations.is_empty() {
        return (idle, 0.0, 0.0);
    }
    durations.sort_unstable();
    (
        idle,
        percentile_ints(&durations, 50.0),
        percentile_ints(&durations, 99.0),
    )
}

/// The indexes of the `TOP_GAPS` longest gaps, ties by start.
fn top_gaps(recs: &[gpu_idle::GapRec]) -> Vec<usize> {
    let mut top: Vec<usize> = (0..recs.len()).collect();
    top.sort_by_key(|&k| (-(recs[k].end - recs[k].start), recs[k].start));
    top.truncate(TOP_GAPS);
    top
}

/// `summary._timeline`'s pick: the first gap with the most work waiting, then the longest
/// (-1 when there is none).
fn worst(recs: &[gpu_idle::GapRec]) -> i64 {
    let mut worst: i64 = -1;
    let mut best = (i64::MIN, i64::MIN);
    for (k, g) in recs.iter().enumerate() {
        let key = (g.waiting, g.end - g.start);
        if key > best {
            best = key;
            worst = k as i64;
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_python_does() {
        assert_eq!(percentile_ints(&[10], 99.0), 10.0);
        assert_eq!(percentile_ints(&[0, 10], 50.0), 5.0);
        // Bit for bit what `stats.pcts([0, 10, 20, 30], (99,))` gives.
        assert_eq!(percentile_ints(&[0, 10, 20, 30], 99.0), 29.700000000000003);
    }
}
