//! The engine table: the engine-side spans of a read kept as columns instead of Python
//! objects, and the engine views and step measures computed over them.
//!
//! An inference server's traces are mostly its scheduler timeline: `llm.engine` windows,
//! one `llm.step` per iteration and four children per step. As `Span` tuples with their
//! attribute dicts and link tuples they cost more than the whole analysis budget
//! (docs/analysis.md, "Fourth pass"). With a table handed to the decoder, spans with those
//! names go here instead: ids, times, attributes and links as plain Rust values, nothing
//! lost, so any of them can still be made into the same `Span` tuple on demand.
//!
//! [`EngineTable::build`] groups them into traces and engine views as
//! `llmtrace.analysis.build` does, and answers for the analyzers what they read from the
//! steps: evidence of work (`gpu_idle._step_runs`), step segments, the gap sweeps, step
//! statistics (`bottleneck.step_stats`). It declines (returns `None`) whenever its traces
//! are not exactly what those Python functions would see — a trace that also holds spans
//! read as Python objects, a trace of several processes (clock-skew repair), an engine id
//! that is not a string or an integer — and the caller then makes every span a Python
//! object and takes the Python path. `tests/analysis/test_engine_table.py` compares both.
//!
//! By job: `columns` (what the decoder appends), `objects` (rows made into Python
//! objects), `build` (traces and engine views), `steps` (step measures), `idle` (GPU idle).

mod build;
mod columns;
mod idle;
mod objects;
mod steps;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

pub(crate) use columns::{pack_id, Data, TSpan, Val, ENGINE_SPANS, NO_ID, STEP_KEYS};
pub use idle::GapSet;

use crate::gpu_idle::Interval;
use crate::Decoder;

type Fx = rustc_hash::FxBuildHasher;

/// One engine's steps (sorted by start, as `EngineView.steps`), windows and gc pauses.
struct EngineCols {
    id: String,
    steps: Vec<u32>,
    step_id: Vec<Option<i64>>,
    /// batch size, waiting, running, kv usage, preempted.
    nums: Vec<[f64; 5]>,
    fwd_off: Vec<u32>,
    fwd: Vec<u32>,
    host_off: Vec<u32>,
    host: Vec<u32>,
    windows: Vec<WindowRow>,
    gc: Vec<u32>,
}

/// A step as the build finds it: span, step id, forward children, host children.
type StepRow = (u32, Option<i64>, Vec<u32>, Vec<u32>);
/// A window: span, first and last step id.
type WindowRow = (u32, Option<i64>, Option<i64>);

struct Built {
    engines: Vec<EngineCols>,
    /// Each trace's spans, de-duplicated and sorted as `Trace.build` sorts them.
    traces: Vec<(u32, Vec<u32>)>,
}
#[pyclass(module = "llmtrace_native")]
pub struct EngineTable {
    pub(crate) data: Data,
    decoder: Py<Decoder>,
    text_cache: Vec<Option<Py<PyAny>>>,
    built: Option<Built>,
}
impl EngineTable {
    fn built(&self) -> PyResult<&Built> {
        self.built
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("the engine table is not built"))
    }

    fn engine(&self, e: usize) -> PyResult<&EngineCols> {
        self.built()?
            .engines
            .get(e)
            .ok_or_else(|| PyIndexError::new_err("no such engine"))
    }
}

#[pymethods]
impl EngineTable {
    #[new]
    fn new(decoder: Py<Decoder>) -> Self {
        EngineTable {
            data: Data::default(),
            decoder,
            text_cache: Vec::new(),
            built: None,
        }
    }

    fn __len__(&self) -> usize {
        self.data.spans.len()
    }

    /// Bytes the table holds outside Python's allocator (which `tracemalloc` cannot see):
    /// columns, arenas, strings and the built views, by capacity.
    fn nbytes(&self) -> usize {
        use std::mem::size_of;
        let d = &self.data;
        let strings: usize = d
            .strings
            .list
            .iter()
            .map(|s| 2 * s.len() + 2 * 16 + 8)
            .sum();
        let mut n = d.spans.capacity() * size_of::<TSpan>()
            + d.attrs.capacity() * size_of::<(u32, Val)>()
            + d.elems.capacity() * size_of::<Val>()
            + d.links.capacity() * size_of::<(u32, u128)>()
            + strings
            + self.text_cache.capacity() * 8;
        if let Some(b) = &self.built {
            for e in &b.engines {
                n += e.steps.capacity() * 4
                    + e.step_id.capacity() * size_of::<Option<i64>>()
                    + e.nums.capacity() * 40
                    + (e.fwd_off.capacity()
                        + e.fwd.capacity()
                        + e.host_off.capacity()
                        + e.host.capacity())
                        * 4
                    + e.windows.capacity() * size_of::<WindowRow>()
                    + e.gc.capacity() * 4;
            }
            n += b
                .traces
                .iter()
                .map(|t| t.1.capacity() * 4 + 32)
                .sum::<usize>();
        }
        n
    }

    /// Python spans read so far (the loader adds each batch it keeps): a table span's place
    /// in the read order is "after this many Python spans".
    #[getter]
    fn get_python_seen(&self) -> u64 {
        self.data.python_seen
    }

    #[setter]
    fn set_python_seen(&mut self, n: u64) {
        self.data.python_seen = n;
    }

    /// The `(service, resource)` of every resource the table's spans refer to, by index.
    fn resources<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .data
            .resources
            .iter()
            .map(|r| PyTuple::new(py, [r.service.bind(py), r.resource.bind(py)]))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The spans from index `start` on as `(python spans before it, Span)` pairs, in read
    /// order; with `truncate`, they leave the table (a filtered read takes them back).
    #[pyo3(signature = (start=0, truncate=false))]
    fn materialize<'py>(
        &mut self,
        py: Python<'py>,
        start: usize,
        truncate: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        self.placed_spans(py, start, truncate)
    }

    /// Group the table into traces and engine views (see the module doc). `python_traces`
    /// holds the trace ids read as Python spans, `domains[r]` the clock of resource `r`
    /// (service, host). Returns `(spans, traces, duplicates, orphans, engines)` with
    /// `engines` a list of `(engine_id, windows, gc spans, step count)` sorted by id and
    /// each window `(start, end, first step id, last step id, span id)`; or `None` when
    /// the Python path must build these traces.
    fn build<'py>(
        &mut self,
        py: Python<'py>,
        python_traces: &Bound<'py, PyAny>,
        domains: Vec<u32>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.group(py, python_traces, domains)
    }

    /// The built traces as `(trace_id, spans sorted by start)` pairs, in first-seen order.
    fn traces<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.trace_rows(py)
    }

    /// Steps `lo..hi` of engine `e` as `StepView` fields: `(step, engine_id, step_id,
    /// forwards, host, batch_size, waiting, running, kv_usage, preempted)`.
    fn steps<'py>(
        &mut self,
        py: Python<'py>,
        e: usize,
        lo: usize,
        hi: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        self.step_rows(py, e, lo, hi)
    }

    /// `gpu_idle._step_runs(engine.steps)`.
    fn step_runs(&self, e: usize) -> PyResult<Vec<Interval>> {
        self.runs(e)
    }

    /// The step runs `gpu_idle.segments` joins when an engine has no windows (unmerged).
    fn step_segments(&self, e: usize) -> PyResult<Vec<Interval>> {
        self.segments(e)
    }

    /// `gpu_idle.engine_idle` for engine `e` after its Python preparation: the gap sweeps
    /// of `iter_gaps` (`host_cause[name code - 2]` is the cause index of `llm.schedule`,
    /// `llm.forward` (unused), `llm.sample`, `llm.postprocess`), then what `gap_totals` and
    /// `window_idle` compute from the gaps. `work` and `engine_work` are merged. Returns
    /// `(gaps, per-cause ns, with_work, engine_side, idle, p50, p99, top gap indexes, the
    /// timeline's gap index (most work waiting, then longest; -1 when none), [(idle,
    /// with_work, [(cause index, ns)]) per window])`, the gaps as a [`GapSet`].
    #[allow(clippy::too_many_arguments)]
    fn idle<'py>(
        &self,
        e: usize,
        segs: Vec<Interval>,
        host_cause: [u8; 4],
        extras: Vec<(i64, i64, u8)>,
        work: Vec<Interval>,
        engine_work: Vec<Interval>,
        windows: Vec<Interval>,
        causes: &Bound<'py, PyTuple>,
    ) -> PyResult<idle::Idle> {
        self.idle_of(
            e,
            segs,
            host_cause,
            extras,
            work,
            engine_work,
            windows,
            causes,
        )
    }

    /// `bottleneck.step_stats` of the steps of `engines`, one engine after another (of
    /// steps `lo..hi` when there is one engine): `(count, batch sum, waiting sum,
    /// preempted sum, distinct linked span ids, kv-usage p90, queue growth)`.
    #[pyo3(signature = (engines, lo=0, hi=usize::MAX))]
    #[allow(clippy::type_complexity)]
    fn step_stats(
        &self,
        engines: Vec<usize>,
        lo: usize,
        hi: usize,
    ) -> PyResult<(usize, f64, f64, f64, usize, f64, f64)> {
        self.stats(&engines, lo, hi)
    }

    /// Step start times of engine `e` (for the bisections of the per-window verdicts).
    fn step_starts(&self, e: usize) -> PyResult<Vec<i64>> {
        let cols = self.engine(e)?;
        Ok(cols
            .steps
            .iter()
            .map(|&i| self.data.spans[i as usize].start)
            .collect())
    }
}
