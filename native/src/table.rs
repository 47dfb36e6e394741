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

use std::collections::{HashMap, HashSet};

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::gpu_idle::{self, Interval, Painted};
use crate::{named_tuple, Decoder};

type Fx = rustc_hash::FxBuildHasher;

/// How many span names the table takes (`Decoder::engine_spans`); a span's index in them
/// is its `name` code: engine window, step, schedule, forward, sample, postprocess, gc.
pub(crate) const ENGINE_SPANS: usize = 7;
/// How many step attributes the views read (`Decoder::step_keys`), in this order: engine
/// id, step id, batch size, queue waiting, queue running, kv-cache usage, preempted, batch
/// request ids.
pub(crate) const STEP_KEYS: usize = 8;
const WINDOW: u8 = 0;
const STEP: u8 = 1;
const FORWARD: u8 = 3;
const GC: u8 = 6;

/// `Span.parent_id is None`: no id of ASCII characters packs to this.
pub(crate) const NO_ID: u128 = u128::MAX;

/// A 16-character ASCII id, packed.
pub(crate) fn pack_id(s: &str) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(s.as_bytes());
    u128::from_be_bytes(b)
}

fn unpack_id(id: u128) -> [u8; 16] {
    id.to_be_bytes()
}

/// An attribute value or array element as the Python paths make it.
#[derive(Clone, Copy)]
pub(crate) enum Val {
    /// An array element with no value (`None`).
    Nothing,
    Str(u32),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// `elems[start..start + len]`, a tuple.
    Array(u32, u32),
}

pub(crate) struct TSpan {
    pub(crate) id: u128,
    pub(crate) parent: u128,
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// Python spans read before this one (its place in the unified read order).
    pub(crate) before: u64,
    pub(crate) trace: u32,
    pub(crate) resource: u32,
    pub(crate) attrs: u32,
    pub(crate) links: u32,
    pub(crate) n_attrs: u16,
    pub(crate) n_links: u16,
    pub(crate) name: u8,
    pub(crate) kind: u8,
    pub(crate) status: u8,
}

#[derive(Default)]
pub(crate) struct Strings {
    map: HashMap<Box<str>, u32, Fx>,
    list: Vec<Box<str>>,
}

impl Strings {
    pub(crate) fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.map.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.into());
        self.map.insert(s.into(), i);
        i
    }
    fn find(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }
    fn text(&self, i: u32) -> &str {
        &self.list[i as usize]
    }
}

pub(crate) struct Resource {
    service: Py<PyAny>,
    resource: Py<PyAny>,
    service_text: String,
}

/// The table's columns; the decoder appends to them (lib.rs, `Ctx::table_span`).
#[derive(Default)]
pub(crate) struct Data {
    pub(crate) spans: Vec<TSpan>,
    pub(crate) attrs: Vec<(u32, Val)>,
    pub(crate) elems: Vec<Val>,
    pub(crate) links: Vec<(u32, u128)>,
    pub(crate) strings: Strings,
    resources: Vec<Resource>,
    pub(crate) python_seen: u64,
}

/// Lengths to roll back to when a line is declined half-way.
pub(crate) struct Mark([usize; 5]);

impl Data {
    pub(crate) fn mark(&self) -> Mark {
        Mark([
            self.spans.len(),
            self.attrs.len(),
            self.elems.len(),
            self.links.len(),
            self.resources.len(),
        ])
    }
    pub(crate) fn rollback(&mut self, m: &Mark) {
        self.spans.truncate(m.0[0]);
        self.attrs.truncate(m.0[1]);
        self.elems.truncate(m.0[2]);
        self.links.truncate(m.0[3]);
        self.resources.truncate(m.0[4]);
    }
    pub(crate) fn add_resource(
        &mut self,
        service: Py<PyAny>,
        resource: Py<PyAny>,
        service_text: String,
    ) -> u32 {
        self.resources.push(Resource {
            service,
            resource,
            service_text,
        });
        (self.resources.len() - 1) as u32
    }
    /// The value of attribute `key` (the last one when repeated: a dict keeps the last).
    fn attr(&self, s: &TSpan, key: Option<u32>) -> Option<Val> {
        let key = key?;
        let a = &self.attrs[s.attrs as usize..s.attrs as usize + usize::from(s.n_attrs)];
        a.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// The attribute keys the views read, looked up once.
struct Keys {
    engine_id: Option<u32>,
    step_id: Option<u32>,
    nums: [Option<u32>; 5],
    request_ids: Option<u32>,
}

/// `model.FINITE_LIMIT`.
const FINITE_LIMIT: f64 = 1e300;

/// `StepView`'s numbers: `float(v)` for a finite int or float, else the default.
fn number(v: Option<Val>, default: f64) -> f64 {
    match v {
        Some(Val::Int(i)) => i as f64,
        Some(Val::Float(x)) if -FINITE_LIMIT < x && x < FINITE_LIMIT => x,
        _ => default,
    }
}

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

/// Where a step's batch ids come from (`gpu_idle._batch_ids`), compared as Python compares
/// the values: an int equals the float of the same value and `True` equals 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Nothing,
    Int(i64),
    FloatBits(u64),
    Text(u32),
    /// A 16-character ASCII string (a link's span id or a string of that shape).
    Id(u128),
}

#[pyclass(module = "llmtrace_native")]
pub struct EngineTable {
    pub(crate) data: Data,
    decoder: Py<Decoder>,
    text_cache: Vec<Option<Py<PyAny>>>,
    built: Option<Built>,
}

impl EngineTable {
    fn text<'py>(&mut self, py: Python<'py>, i: u32) -> Bound<'py, PyAny> {
        let i = i as usize;
        if self.text_cache.len() <= i {
            self.text_cache.resize_with(i + 1, || None);
        }
        if let Some(s) = &self.text_cache[i] {
            return s.bind(py).clone();
        }
        let s = PyString::new(py, self.data.strings.text(i as u32)).into_any();
        self.text_cache[i] = Some(s.clone().unbind());
        s
    }

    fn id_text<'py>(py: Python<'py>, id: u128) -> Bound<'py, PyAny> {
        let b = unpack_id(id);
        // Packed from ASCII: valid UTF-8.
        PyString::new(py, std::str::from_utf8(&b).unwrap_or_default()).into_any()
    }

    fn value<'py>(&mut self, py: Python<'py>, v: Val) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            Val::Nothing => py.None().into_bound(py),
            Val::Str(i) => self.text(py, i),
            Val::Int(i) => i.into_pyobject(py)?.into_any(),
            Val::Float(x) => x.into_pyobject(py)?.into_any(),
            Val::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
            Val::Array(start, len) => {
                let items: Vec<Val> =
                    self.data.elems[start as usize..(start + len) as usize].to_vec();
                let objs = items
                    .into_iter()
                    .map(|e| self.value(py, e))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, objs)?.into_any()
            }
        })
    }

    /// Span `i` as the `Span` tuple the decoder would have made.
    fn span_obj<'py>(&mut self, py: Python<'py>, i: u32) -> PyResult<Bound<'py, PyAny>> {
        let decoder = self.decoder.clone_ref(py);
        let dec = decoder.get();
        let s = &self.data.spans[i as usize];
        let (trace, id, parent, name, start, end) =
            (s.trace, s.id, s.parent, s.name, s.start, s.end);
        let (kind, status, res) = (s.kind, s.status, s.resource as usize);
        let (a0, na, l0, nl) = (
            s.attrs as usize,
            usize::from(s.n_attrs),
            s.links as usize,
            usize::from(s.n_links),
        );
        let attrs = if na == 0 {
            dec.empty_attrs.bind(py).clone()
        } else {
            let d = pyo3::types::PyDict::new(py);
            for k in a0..a0 + na {
                let (key, v) = self.data.attrs[k];
                let key = self.text(py, key);
                d.set_item(key, self.value(py, v)?)?;
            }
            if d.is_empty() {
                dec.empty_attrs.bind(py).clone()
            } else {
                d.into_any()
            }
        };
        let mut links = Vec::with_capacity(nl);
        for k in l0..l0 + nl {
            let (lt, ls) = self.data.links[k];
            let fields = [self.text(py, lt), Self::id_text(py, ls)];
            links.push(named_tuple::new(
                py,
                dec.link_type.as_ptr(),
                fields.into_iter().map(Bound::into_ptr),
            )?);
        }
        let r = &self.data.resources[res];
        let (service, resource) = (r.service.bind(py).clone(), r.resource.bind(py).clone());
        let fields = [
            self.text(py, trace),
            Self::id_text(py, id),
            if parent == NO_ID {
                py.None().into_bound(py)
            } else {
                Self::id_text(py, parent)
            },
            dec.engine_span_objects[usize::from(name)].bind(py).clone(),
            start.into_pyobject(py)?.into_any(),
            end.into_pyobject(py)?.into_any(),
            dec.kinds[usize::from(kind)].bind(py).clone(),
            dec.statuses[usize::from(status)].bind(py).clone(),
            attrs,
            PyTuple::new(py, links)?.into_any(),
            service,
            resource,
        ];
        named_tuple::new(
            py,
            dec.span_type.as_ptr(),
            fields.into_iter().map(Bound::into_ptr),
        )
    }

    fn spans_tuple<'py>(&mut self, py: Python<'py>, idx: &[u32]) -> PyResult<Bound<'py, PyTuple>> {
        let objs = idx
            .iter()
            .map(|&i| self.span_obj(py, i))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, objs)
    }

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

    fn keys(&self) -> Keys {
        let st = &self.data.strings;
        let names = &self.decoder.get().step_keys;
        let find = |k: usize| st.find(&names[k]);
        Keys {
            engine_id: find(0),
            step_id: find(1),
            nums: [find(2), find(3), find(4), find(5), find(6)],
            request_ids: find(7),
        }
    }

    /// `_batch_ids`: the request-id attribute when it is a non-empty array, else the link
    /// span ids, else `None`.
    fn batch_ids(&self, keys: &Keys, i: u32) -> Option<Vec<Key>> {
        let d = &self.data;
        let s = &d.spans[i as usize];
        if let Some(Val::Array(start, len)) = d.attr(s, keys.request_ids) {
            if len > 0 {
                let elems = &d.elems[start as usize..(start + len) as usize];
                return Some(elems.iter().map(|e| self.key(*e)).collect());
            }
        }
        if s.n_links > 0 {
            let l0 = s.links as usize;
            let links = &d.links[l0..l0 + usize::from(s.n_links)];
            return Some(links.iter().map(|&(_, id)| Key::Id(id)).collect());
        }
        None
    }

    fn key(&self, v: Val) -> Key {
        match v {
            Val::Nothing | Val::Array(..) => Key::Nothing,
            Val::Int(i) => Key::Int(i),
            Val::Bool(b) => Key::Int(i64::from(b)),
            Val::Float(x) => {
                // An integral float equals the int of the same value.
                if x.fract() == 0.0 && (-9.2e18..9.2e18).contains(&x) {
                    Key::Int(x as i64)
                } else {
                    Key::FloatBits(x.to_bits())
                }
            }
            Val::Str(t) => {
                let text = self.data.strings.text(t);
                if text.len() == 16 && text.is_ascii() {
                    Key::Id(pack_id(text))
                } else {
                    Key::Text(t)
                }
            }
        }
    }
}

/// `gpu_idle._continued`: whether a request of batch `a` is also in batch `b`.
fn continued(a: &Option<Vec<Key>>, b: &Option<Vec<Key>>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    if a == b {
        return true;
    }
    let set: HashSet<Key, Fx> = a.iter().copied().collect();
    b.iter().any(|k| set.contains(k)) || (a.len() >= 64 && b.len() >= 64)
}

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

/// `stats.percentile` over sorted values.
fn percentile_sorted(xs: &[f64], q: f64) -> f64 {
    if xs.len() == 1 {
        return xs[0];
    }
    let pos = (xs.len() - 1) as f64 * q / 100.0;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(xs.len() - 1);
    xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
}

/// Python's `sum()` of floats on CPython 3.11: left to right from 0.
fn py_sum(xs: impl Iterator<Item = f64>) -> f64 {
    xs.fold(0.0, |acc, x| acc + x)
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
        let n = self.data.spans.len();
        let mut out = Vec::with_capacity(n.saturating_sub(start));
        for i in start..n {
            let before = self.data.spans[i].before.into_pyobject(py)?.into_any();
            out.push(PyTuple::new(py, [before, self.span_obj(py, i as u32)?])?);
        }
        if truncate && start < n {
            let s = &self.data.spans[start];
            let m = Mark([
                start,
                s.attrs as usize,
                self.data.elems.len(),
                s.links as usize,
                self.data.resources.len(),
            ]);
            self.data.rollback(&m);
            self.built = None;
        }
        PyList::new(py, out)
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
        self.built = None;
        if domains.len() != self.data.resources.len() {
            return Err(PyValueError::new_err("one domain per resource"));
        }
        let d = &self.data;
        // Traces in first-seen order, their spans in read order, duplicates dropped.
        let mut slot: HashMap<u32, usize, Fx> = HashMap::default();
        let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
        for (i, s) in d.spans.iter().enumerate() {
            let g = *slot.entry(s.trace).or_insert_with(|| {
                groups.push((s.trace, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i as u32);
        }
        let mut dupes = 0u64;
        let mut orphans = 0u64;
        let mut span_count = 0u64;
        let keys = self.keys();
        let mut steps: HashMap<String, Vec<StepRow>> = HashMap::new();
        let mut windows: HashMap<String, Vec<WindowRow>> = HashMap::new();
        let mut gcs: HashMap<String, Vec<u32>> = HashMap::new();
        let mut traces = Vec::with_capacity(groups.len());
        for (trace, members) in groups {
            let tid = self.text(py, trace);
            if python_traces.contains(tid)? {
                return Ok(None); // the trace is partly Python spans
            }
            let d = &self.data;
            let mut by_id: HashMap<u128, u32, Fx> = HashMap::default();
            let mut kept = Vec::with_capacity(members.len());
            for i in members {
                let s = &d.spans[i as usize];
                if let std::collections::hash_map::Entry::Vacant(slot) = by_id.entry(s.id) {
                    slot.insert(i);
                    kept.push(i);
                } else {
                    dupes += 1;
                }
            }
            let dom = domains[d.spans[kept[0] as usize].resource as usize];
            if kept
                .iter()
                .any(|&i| domains[d.spans[i as usize].resource as usize] != dom)
            {
                return Ok(None); // several processes: clock-skew repair is Python's
            }
            kept.sort_by_key(|&i| d.spans[i as usize].start); // stable, as Trace.build
            span_count += kept.len() as u64;
            let mut kids: HashMap<u128, Vec<u32>, Fx> = HashMap::default();
            for &i in &kept {
                let s = &d.spans[i as usize];
                if s.parent != NO_ID && by_id.contains_key(&s.parent) && s.parent != s.id {
                    kids.entry(s.parent).or_default().push(i);
                } else if s.parent != NO_ID {
                    orphans += 1;
                }
            }
            for &i in &kept {
                let s = &d.spans[i as usize];
                if !matches!(s.name, STEP | WINDOW | GC) {
                    continue;
                }
                let Some(eid) = engine_of(d, &keys, &by_id, i) else {
                    return Ok(None); // an engine id Python would format differently
                };
                let children = kids.get(&s.id).map(Vec::as_slice).unwrap_or_default();
                match s.name {
                    STEP => {
                        let sid = match d.attr(s, keys.step_id) {
                            Some(Val::Int(v)) => Some(v),
                            _ => None,
                        };
                        let (mut fw, mut host) = (Vec::new(), Vec::new());
                        for &c in children {
                            match d.spans[c as usize].name {
                                FORWARD => fw.push(c),
                                2 | 4 | 5 => host.push(c),
                                _ => {}
                            }
                        }
                        steps.entry(eid).or_default().push((i, sid, fw, host));
                    }
                    WINDOW => {
                        let ids: Vec<i64> = children
                            .iter()
                            .filter(|&&c| d.spans[c as usize].name == STEP)
                            .filter_map(|&c| match d.attr(&d.spans[c as usize], keys.step_id) {
                                Some(Val::Int(v)) => Some(v),
                                _ => None,
                            })
                            .collect();
                        let (lo, hi) = (ids.iter().min().copied(), ids.iter().max().copied());
                        windows.entry(eid).or_default().push((i, lo, hi));
                    }
                    _ => gcs.entry(eid).or_default().push(i),
                }
            }
            traces.push((trace, kept));
        }
        let d = &self.data;
        let mut ids: Vec<String> = steps.keys().chain(windows.keys()).cloned().collect();
        ids.sort();
        ids.dedup();
        let mut engines = Vec::with_capacity(ids.len());
        for id in ids {
            let mut st = steps.remove(&id).unwrap_or_default();
            st.sort_by_key(|x| d.spans[x.0 as usize].start);
            let mut win = windows.remove(&id).unwrap_or_default();
            win.sort_by_key(|x| d.spans[x.0 as usize].start);
            let mut gc = gcs.remove(&id).unwrap_or_default();
            gc.sort_by_key(|&i| d.spans[i as usize].start);
            let mut cols = EngineCols {
                id,
                steps: Vec::with_capacity(st.len()),
                step_id: Vec::with_capacity(st.len()),
                nums: Vec::with_capacity(st.len()),
                fwd_off: vec![0],
                fwd: Vec::new(),
                host_off: vec![0],
                host: Vec::new(),
                windows: win,
                gc,
            };
            for (i, sid, fw, host) in st {
                let s = &d.spans[i as usize];
                let n = keys.nums;
                cols.steps.push(i);
                cols.step_id.push(sid);
                cols.nums.push([
                    number(d.attr(s, n[0]), 0.0),
                    number(d.attr(s, n[1]), 0.0),
                    number(d.attr(s, n[2]), 0.0),
                    number(d.attr(s, n[3]), -1.0),
                    number(d.attr(s, n[4]), 0.0),
                ]);
                cols.fwd.extend(fw);
                cols.fwd_off.push(cols.fwd.len() as u32);
                cols.host.extend(host);
                cols.host_off.push(cols.host.len() as u32);
            }
            engines.push(cols);
        }
        // gcs left over belong to engines with no steps or windows: Python drops them too.
        let built = Built { engines, traces };
        let mut out = Vec::with_capacity(built.engines.len());
        for e in &built.engines {
            let wins = e
                .windows
                .iter()
                .map(|&(i, lo, hi)| {
                    let s = &self.data.spans[i as usize];
                    (s.start, s.end, lo, hi, Self::id_text(py, s.id))
                })
                .collect::<Vec<_>>();
            out.push((e.id.clone(), wins, e.gc.clone(), e.steps.len()));
        }
        let trace_count = built.traces.len();
        self.built = Some(built);
        let mut engines_py = Vec::with_capacity(out.len());
        for (id, wins, gc, n) in out {
            let gc = self.spans_tuple(py, &gc)?;
            engines_py.push((id, wins, gc, n).into_pyobject(py)?.into_any());
        }
        let result = (
            span_count,
            trace_count,
            dupes,
            orphans,
            PyList::new(py, engines_py)?,
        );
        Ok(Some(result.into_pyobject(py)?))
    }

    /// The built traces as `(trace_id, spans sorted by start)` pairs, in first-seen order.
    fn traces<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let traces: Vec<(u32, Vec<u32>)> = self
            .built()?
            .traces
            .iter()
            .map(|(t, s)| (*t, s.clone()))
            .collect();
        let mut out = Vec::with_capacity(traces.len());
        for (t, spans) in traces {
            let tid = self.text(py, t);
            let spans = self.spans_tuple(py, &spans)?;
            out.push(PyTuple::new(py, [tid, spans.into_any()])?);
        }
        PyList::new(py, out)
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
        let cols = self.engine(e)?;
        let hi = hi.min(cols.steps.len());
        let rows: Vec<(StepRow, [f64; 5])> = (lo.min(hi)..hi)
            .map(|k| {
                let (f0, f1) = (cols.fwd_off[k] as usize, cols.fwd_off[k + 1] as usize);
                let (h0, h1) = (cols.host_off[k] as usize, cols.host_off[k + 1] as usize);
                (
                    (
                        cols.steps[k],
                        cols.step_id[k],
                        cols.fwd[f0..f1].to_vec(),
                        cols.host[h0..h1].to_vec(),
                    ),
                    cols.nums[k],
                )
            })
            .collect();
        let eid = PyString::new(py, &cols.id).into_any();
        let mut out = Vec::with_capacity(rows.len());
        for ((i, sid, fw, host), n) in rows {
            let fields = [
                self.span_obj(py, i)?,
                eid.clone(),
                sid.into_pyobject(py)?.into_any(),
                self.spans_tuple(py, &fw)?.into_any(),
                self.spans_tuple(py, &host)?.into_any(),
                n[0].into_pyobject(py)?.into_any(),
                n[1].into_pyobject(py)?.into_any(),
                n[2].into_pyobject(py)?.into_any(),
                n[3].into_pyobject(py)?.into_any(),
                n[4].into_pyobject(py)?.into_any(),
            ];
            out.push(PyTuple::new(py, fields)?);
        }
        PyList::new(py, out)
    }

    /// `gpu_idle._step_runs(engine.steps)`.
    fn step_runs(&self, e: usize) -> PyResult<Vec<Interval>> {
        let cols = self.engine(e)?;
        let keys = self.keys();
        let spans = &self.data.spans;
        let mut out: Vec<Interval> = Vec::new();
        let (mut lo, mut hi, mut joining) = (0i64, 0i64, false);
        let mut push = |s: i64, e: i64| {
            if e <= s {
                return;
            }
            if joining && s <= hi && e >= lo {
                lo = lo.min(s);
                hi = hi.max(e);
            } else {
                if joining {
                    out.push((lo, hi));
                }
                (lo, hi, joining) = (s, e, true);
            }
        };
        // `_step_evidence`, reading batch ids only where needed and then once per step.
        let mut prev: Option<usize> = None;
        let mut prev_ids: Option<Option<Vec<Key>>> = None;
        for k in 0..cols.steps.len() {
            let st = &spans[cols.steps[k] as usize];
            let mut ids: Option<Option<Vec<Key>>> = None;
            if let Some(p) = prev {
                let pn = cols.nums[p];
                let mut held = pn[1] > 0.0;
                if !held && pn[2] > 0.0 && cols.nums[k][2] > 0.0 {
                    let mine = self.batch_ids(&keys, cols.steps[k]);
                    let theirs = match prev_ids.take() {
                        Some(v) => v,
                        None => self.batch_ids(&keys, cols.steps[p]),
                    };
                    held = continued(&theirs, &mine);
                    ids = Some(mine);
                }
                if held {
                    push(spans[cols.steps[p] as usize].end, st.start);
                }
            }
            if cols.nums[k][0] > 0.0 {
                push(st.start, st.end);
            }
            prev = Some(k);
            prev_ids = ids;
        }
        if joining {
            out.push((lo, hi));
        }
        Ok(out)
    }

    /// The step runs `gpu_idle.segments` joins when an engine has no windows (unmerged).
    fn step_segments(&self, e: usize) -> PyResult<Vec<Interval>> {
        let cols = self.engine(e)?;
        let spans = &self.data.spans;
        let mut out: Vec<Interval> = Vec::new();
        for k in 0..cols.steps.len() {
            let s = &spans[cols.steps[k] as usize];
            let contiguous = k > 0
                && match (cols.step_id[k], cols.step_id[k - 1]) {
                    (Some(a), Some(b)) => b.checked_add(1) == Some(a),
                    _ => true,
                };
            match out.last_mut() {
                Some(last) if contiguous => last.1 = last.1.max(s.end),
                _ => out.push((s.start, s.end)),
            }
        }
        Ok(out)
    }

    /// `gpu_idle.engine_idle` for engine `e` after its Python preparation: the gap sweeps
    /// of `iter_gaps` (`host_cause[name code - 2]` is the cause index of `llm.schedule`,
    /// `llm.forward` (unused), `llm.sample`, `llm.postprocess`), then what `gap_totals` and
    /// `window_idle` compute from the gaps. `work` and `engine_work` are merged. Returns
    /// `(gaps, per-cause ns, with_work, engine_side, idle, p50, p99, top gap indexes, the
    /// timeline's gap index (most work waiting, then longest; -1 when none), [(idle,
    /// with_work, [(cause index, ns)]) per window])`, the gaps as a [`GapSet`].
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
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
    ) -> PyResult<(
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
    )> {
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
            hosts.causes.push(host_cause[usize::from(s.name - 2)]);
        }
        let ncauses = causes.len();
        let recs = gpu_idle::classify_raw(&segs, fw, hosts, extras, &work, ncauses)?;
        let mut by_cause = vec![0i64; ncauses];
        let mut with_work = 0i64;
        for g in &recs {
            with_work += g.waiting;
            for (total, ns) in by_cause.iter_mut().zip(&g.per) {
                *total += ns;
            }
        }
        // `_overlap` of the gaps with work waiting and the engine's own work.
        let (mut engine_side, mut i) = (0i64, 0usize);
        for g in recs.iter().filter(|g| g.waiting != 0) {
            while i < engine_work.len() && engine_work[i].1 <= g.start {
                i += 1;
            }
            engine_side += gpu_idle::covered(g.start, g.end, &engine_work, i);
        }
        let mut durations: Vec<i64> = recs.iter().map(|g| g.end - g.start).collect();
        let idle: i64 = durations.iter().sum();
        let mut top: Vec<usize> = (0..recs.len()).collect();
        top.sort_by_key(|&k| (-(recs[k].end - recs[k].start), recs[k].start));
        top.truncate(TOP_GAPS);
        durations.sort_unstable();
        let (p50, p99) = if durations.is_empty() {
            (0.0, 0.0)
        } else {
            (
                percentile_ints(&durations, 50.0),
                percentile_ints(&durations, 99.0),
            )
        };
        let per_window = windows
            .iter()
            .map(|&w| window_idle(&recs, w, ncauses))
            .collect();
        // `summary._timeline`'s pick: the first gap with the most work waiting, then longest.
        let mut worst: i64 = -1;
        let mut best = (i64::MIN, i64::MIN);
        for (k, g) in recs.iter().enumerate() {
            let key = (g.waiting, g.end - g.start);
            if key > best {
                best = key;
                worst = k as i64;
            }
        }
        Ok((
            GapSet { recs },
            by_cause,
            with_work,
            engine_side,
            idle,
            p50,
            p99,
            top,
            worst,
            per_window,
        ))
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
        let mut picked: Vec<(&EngineCols, usize, usize)> = Vec::with_capacity(engines.len());
        for &e in &engines {
            let c = self.engine(e)?;
            let n = c.steps.len();
            picked.push(if engines.len() == 1 {
                let hi = hi.min(n);
                (c, lo.min(hi), hi)
            } else {
                (c, 0, n)
            });
        }
        let rows = || {
            picked
                .iter()
                .flat_map(|&(c, a, b)| (a..b).map(move |k| (c, k)))
        };
        let spans = &self.data.spans;
        let n = rows().count();
        let batch = py_sum(rows().map(|(c, k)| c.nums[k][0]));
        let waiting = py_sum(rows().map(|(c, k)| c.nums[k][1]));
        let preempted = py_sum(rows().map(|(c, k)| c.nums[k][4]));
        let linked = if preempted != 0.0 {
            let mut ids: HashSet<u128, Fx> = HashSet::default();
            for (c, k) in rows() {
                let s = &spans[c.steps[k] as usize];
                let l0 = s.links as usize;
                ids.extend(
                    self.data.links[l0..l0 + usize::from(s.n_links)]
                        .iter()
                        .map(|l| l.1),
                );
            }
            ids.len()
        } else {
            0
        };
        let mut kv: Vec<f64> = rows()
            .map(|(c, k)| c.nums[k][3])
            .filter(|&v| v >= 0.0)
            .collect();
        kv.sort_by(f64::total_cmp);
        let kv_p90 = if kv.is_empty() {
            0.0
        } else {
            percentile_sorted(&kv, 90.0)
        };
        let growth = if n < 3 {
            0.0
        } else {
            let xs: Vec<f64> = rows()
                .map(|(c, k)| spans[c.steps[k] as usize].start as f64 / 1e9)
                .collect();
            let ys: Vec<f64> = rows().map(|(c, k)| c.nums[k][1]).collect();
            let mx = py_sum(xs.iter().copied()) / n as f64;
            let my = py_sum(ys.iter().copied()) / n as f64;
            let var = py_sum(xs.iter().map(|x| (x - mx) * (x - mx)));
            let cov = py_sum(xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)));
            if var != 0.0 {
                cov / var
            } else {
                0.0
            }
        };
        Ok((n, batch, waiting, preempted, linked, kv_p90, growth))
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

/// `build._engine_of`: the span's `llm.engine.id`, else its nearest ancestor's (8 levels),
/// else its service, else "engine". `None` when the id is of a type Python would format
/// in a way this does not (a float, an array).
fn engine_of(d: &Data, keys: &Keys, by_id: &HashMap<u128, u32, Fx>, i: u32) -> Option<String> {
    let span = &d.spans[i as usize];
    let mut eid = d.attr(span, keys.engine_id);
    let mut cur = Some(span);
    let mut seen = 0;
    while eid.is_none() && seen < 8 {
        let Some(c) = cur else { break };
        if c.parent == NO_ID {
            break;
        }
        cur = by_id.get(&c.parent).map(|&p| &d.spans[p as usize]);
        eid = cur.and_then(|c| d.attr(c, keys.engine_id));
        seen += 1;
    }
    match eid {
        None => {
            let service = &d.resources[span.resource as usize].service_text;
            Some(if service.is_empty() {
                "engine".to_owned()
            } else {
                service.clone()
            })
        }
        Some(Val::Str(t)) => Some(d.strings.text(t).to_owned()),
        Some(Val::Int(v)) => Some(v.to_string()),
        Some(Val::Bool(b)) => Some(if b { "True" } else { "False" }.to_owned()),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pack_and_unpack_losslessly() {
        for id in [
            "0123456789abcdef",
            "ffffffffffffffff",
            "0000000000000000",
            "ABCDEFabcdef0123",
        ] {
            let packed = pack_id(id);
            assert_ne!(packed, NO_ID);
            assert_eq!(&unpack_id(packed), id.as_bytes());
        }
    }

    #[test]
    fn packing_keeps_ids_apart_and_in_order() {
        let (a, b) = (pack_id("0000000000000001"), pack_id("0000000000000010"));
        assert_ne!(a, b);
        assert!(a < b); // big-endian: byte order is text order
        assert!(pack_id("~~~~~~~~~~~~~~~~") < NO_ID); // the largest ASCII id is not "no parent"
    }

    #[test]
    fn batch_ids_continue_when_a_request_is_in_both_or_either_is_unknown() {
        let ids = |xs: &[i64]| Some(xs.iter().map(|&x| Key::Int(x)).collect::<Vec<_>>());
        assert!(continued(&ids(&[1, 2]), &ids(&[2, 3])));
        assert!(!continued(&ids(&[1, 2]), &ids(&[3, 4])));
        assert!(continued(&None, &ids(&[3])));
        let capped: Vec<i64> = (0..64).collect();
        let other: Vec<i64> = (100..164).collect();
        assert!(continued(&ids(&capped), &ids(&other))); // both capped: may have continued
    }

    #[test]
    fn percentiles_interpolate_as_python_does() {
        assert_eq!(percentile_ints(&[10], 99.0), 10.0);
        assert_eq!(percentile_ints(&[0, 10], 50.0), 5.0);
        assert_eq!(percentile_sorted(&[1.0, 2.0, 3.0, 4.0, 5.0], 90.0), 4.6);
    }
}
