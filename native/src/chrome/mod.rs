//! Spans to Chrome Trace Event JSON: the compiled twin of `llmtrace.analysis.perfetto.
//! ChromeTraceWriter` (the reference, read it first). The same tracks, flows, counters and
//! bounded state, decided in the same order, so that the text is the same byte for byte;
//! `tests/analysis/test_perfetto_native.py` exports the same spans through both.
//!
//! Python keeps the names: span names come in as role bits (`_perfetto_native.ROLES`) and
//! attribute keys as a list (`_perfetto_native.KEYS`), so no `llmtrace.semconv` name is
//! written here. What this module does not know how to write the same way (an attribute
//! value of another type, a hand-made id that is not hex) it hands to the Python function
//! the reference uses.

mod events;
pub(crate) mod py;
pub(crate) mod text;
mod tracks;

use std::collections::VecDeque;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rustc_hash::{FxHashMap, FxHashSet};

use py::{code_points, contains, get, push_format_escaped, str_of};
use text::push_ascii_escaped_code_points;
use tracks::Pending;

// Span roles: bits of the flags Python hands in per span name.
const REQUEST: u8 = 1;
const PHASE: u8 = 2;
const PARENT: u8 = 4;
const GPU: u8 = 8;
const WAITER: u8 = 16;
const ENGINE: u8 = 32;
const STEP: u8 = 64;

// Attribute keys, by their index in the list Python hands in (`perfetto._NATIVE_KEYS`).
const K_REQUEST_ID: usize = 0;
const K_VLLM_REQUEST_ID: usize = 1;
const K_ENGINE_ID: usize = 2;
const K_STEP_ID: usize = 3;
const K_RUNNING: usize = 4;
const K_WAITING: usize = 5;
const K_KV: usize = 6;
const K_GPU_UTIL: usize = 7;
const K_GPU_MEMORY: usize = 8;
const K_GPU_POWER: usize = 9;
const K_GPU_ID: usize = 10;
const K_ROLE: usize = 11;
const K_PID: usize = 12;
const K_HOST: usize = 13;
const K_CLIPPED: usize = 14;
const K_EXTENDED: usize = 15;
const KEYS: usize = 16;

/// The process that holds one track per request (`perfetto.REQUESTS_PID`).
const REQUESTS_PID: i64 = 1;
const GIB: f64 = 1_073_741_824.0;

type Track = (i64, i64);

/// One span's fields, read from its named tuple (`llmtrace.analysis.model.Span`).
struct S<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    trace: &'a Bound<'py, PyString>,
    id: &'a Bound<'py, PyString>,
    parent: Option<&'a Bound<'py, PyString>>,
    name_obj: &'a Bound<'py, PyString>,
    role: u8,
    start: i128,
    end: i128,
    attrs: Bound<'py, PyAny>,
    links: &'a Bound<'py, PyAny>,
    service: &'a Bound<'py, PyAny>,
    resource: &'a Bound<'py, PyAny>,
}

fn string<'a, 'py>(o: &'a Bound<'py, PyAny>, what: &str) -> PyResult<&'a Bound<'py, PyString>> {
    o.cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("a span's {what} must be a str")))
}

/// A time in nanoseconds: an int (the sources keep them within ±2**64, which `i128` holds
/// with the differences between them).
fn time(o: &Bound<'_, PyAny>) -> PyResult<i128> {
    let mut overflow = 0;
    // SAFETY: `o` is live; on an int the call reports overflow instead of raising.
    if unsafe { ffi::PyLong_CheckExact(o.as_ptr()) } != 0 {
        // SAFETY: as above.
        let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(o.as_ptr(), &mut overflow) };
        if overflow == 0 {
            return Ok(i128::from(v));
        }
    }
    const LIMIT: i128 = 1 << 126; // differences of two times stay within i128
    match o.extract::<i128>() {
        Ok(v) if -LIMIT < v && v < LIMIT => Ok(v),
        _ => Err(PyValueError::new_err(format!(
            "a span's time {o} is not an integer within ±2**126 ns"
        ))),
    }
}

/// The ids a span's key and its pending children's are compared by.
fn id_text(s: &Bound<'_, PyString>) -> String {
    s.to_string_lossy().into_owned()
}

/// The compiled Chrome trace writer (`llmtrace_native.ChromeTraceEvents`).
#[pyclass(module = "llmtrace_native")]
pub struct ChromeTraceEvents {
    roles: FxHashMap<String, u8>,
    keys: Vec<Py<PyString>>,
    args: bool,
    recent_limit: usize,
    pending_limit: usize,
    track_cache: usize,
    origin_lead_s: i128,
    encode: Py<PyAny>,
    finite: Py<PyAny>,
    track_id: Py<PyAny>,
    processes: FxHashMap<(String, String, String), i64>,
    engines: FxHashMap<(i64, String, bool), i64>,
    named: FxHashSet<Track>,
    named_order: VecDeque<Track>,
    recent: FxHashMap<String, Track>,
    recent_order: VecDeque<String>,
    pending: Pending,
    last_resource: Option<Py<PyAny>>,
    last_pid: i64,
    origin: Option<i128>,
    engine_names: FxHashMap<i64, Vec<u8>>,
    request_ends: FxHashMap<String, i128>,
    phase_ends: FxHashMap<String, i128>,
    spans: u64,
    flows: u64,
    counters: u64,
    unparented: u64,
    adjusted: u64,
    out: Vec<u8>,
}

#[pymethods]
impl ChromeTraceEvents {
    /// `ChromeTraceEvents(roles, keys, limits, args, encode, finite, track_id)`: `roles`
    /// maps a span name to its role bits, `keys` are the attribute keys in the order this
    /// module reads them, `limits` is `(RECENT_PARENTS, PENDING_LIMIT, TRACK_CACHE,
    /// ORIGIN_LEAD_S)`; `encode`, `finite` and `track_id` are the reference's own helpers.
    #[new]
    fn new(
        roles: FxHashMap<String, u8>,
        keys: Vec<Bound<'_, PyString>>,
        limits: (usize, usize, usize, i64),
        args: bool,
        encode: Py<PyAny>,
        finite: Py<PyAny>,
        track_id: Py<PyAny>,
    ) -> PyResult<Self> {
        if keys.len() != KEYS {
            return Err(PyTypeError::new_err(format!("need {KEYS} attribute keys")));
        }
        let (recent_limit, pending_limit, track_cache, origin_lead_s) = limits;
        Ok(ChromeTraceEvents {
            roles,
            keys: keys.into_iter().map(Bound::unbind).collect(),
            args,
            recent_limit,
            pending_limit,
            track_cache,
            origin_lead_s: i128::from(origin_lead_s),
            encode,
            finite,
            track_id,
            processes: FxHashMap::default(),
            engines: FxHashMap::default(),
            named: FxHashSet::default(),
            named_order: VecDeque::new(),
            recent: FxHashMap::default(),
            recent_order: VecDeque::new(),
            pending: Pending::default(),
            last_resource: None,
            last_pid: 0,
            origin: None,
            engine_names: FxHashMap::default(),
            request_ends: FxHashMap::default(),
            phase_ends: FxHashMap::default(),
            spans: 0,
            flows: 0,
            counters: 0,
            unparented: 0,
            adjusted: 0,
            out: Vec::new(),
        })
    }

    /// The events of `spans` (a list of `Span` tuples, any order), as one `str`.
    fn add<'py>(&mut self, spans: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyString>> {
        for span in spans.iter() {
            self.spans += 1;
            self.add_span(&span)?;
        }
        self.take_text(spans.py())
    }

    /// The events of the children whose parent never came (on their trace's track).
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        while let Some(waiting) = self.pending.pop_oldest() {
            self.orphans(py, waiting)?;
        }
        self.take_text(py)
    }

    /// `(spans, flows, counters, processes, engines, unparented, adjusted, origin_ns)`.
    fn stats(&self) -> (u64, u64, u64, usize, usize, u64, u64, Option<i128>) {
        let engines = self
            .engines
            .keys()
            .filter(|(_, _, windows)| !windows)
            .count();
        (
            self.spans,
            self.flows,
            self.counters,
            self.processes.len() + 1,
            engines,
            self.unparented,
            self.adjusted,
            self.origin,
        )
    }

    /// Bytes held between batches, roughly: the bounded state (the pending spans'
    /// Python objects not counted, only their handles).
    fn nbytes(&self) -> usize {
        let strings = |n: usize| n * 48;
        strings(self.recent.len() * 2 + self.request_ends.len() + self.phase_ends.len())
            + strings(self.pending.by_parent.len() * 2)
            + self.pending.count * 8
            + self.named.len() * 32
            + self.out.capacity()
    }
}

impl ChromeTraceEvents {
    fn take_text<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        let text = std::str::from_utf8(&self.out)
            .map_err(|_| PyValueError::new_err("the writer made invalid UTF-8"))?;
        let s = PyString::new(py, text);
        self.out.clear();
        if self.out.capacity() > 1 << 24 {
            self.out.shrink_to(1 << 20); // one huge batch does not keep its buffer
        }
        Ok(s)
    }

    fn key<'py>(&self, py: Python<'py>, k: usize) -> &Bound<'py, PyString> {
        self.keys[k].bind(py)
    }

    fn view<'a, 'py>(&self, obj: &'a Bound<'py, PyAny>) -> PyResult<S<'a, 'py>> {
        let t = obj
            .cast::<PyTuple>()
            .map_err(|_| PyTypeError::new_err("spans must be Span named tuples"))?;
        let f = t.as_slice();
        if f.len() < 12 {
            return Err(PyTypeError::new_err("spans must be Span named tuples"));
        }
        let name_obj = string(&f[3], "name")?;
        let name = name_obj.to_str().unwrap_or("");
        Ok(S {
            obj,
            trace: string(&f[0], "trace_id")?,
            id: string(&f[1], "span_id")?,
            parent: if f[2].is_none() {
                None
            } else {
                Some(string(&f[2], "parent_id")?)
            },
            name_obj,
            role: self.roles.get(name).copied().unwrap_or(0),
            start: time(&f[4])?,
            end: time(&f[5])?,
            attrs: f[8].clone(),
            links: &f[9],
            service: &f[10],
            resource: &f[11],
        })
    }

    fn add_span(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = obj.py();
        let mut s = self.view(obj)?;
        if s.role & REQUEST != 0 {
            let tid = self.track_of(s.id)?;
            let mut label = b"req ".to_vec();
            let rid = match truthy(get(&s.attrs, self.key(py, K_REQUEST_ID))?)? {
                Some(v) => Some(v),
                None => truthy(get(&s.attrs, self.key(py, K_VLLM_REQUEST_ID))?)?,
            };
            match rid {
                Some(v) => push_format_escaped(&mut label, &v)?,
                None => push_ascii_escaped_code_points(&mut label, code_points(s.id, 8)),
            }
            self.name_track_escaped(REQUESTS_PID, tid, &label, None);
            let id = id_text(s.id);
            if let Some(later) = self.phase_ends.remove(&id) {
                if later > s.end {
                    self.adjust(&mut s, later, K_EXTENDED)?;
                }
            }
            if self.request_ends.len() >= self.track_cache {
                self.request_ends.clear();
            }
            self.request_ends.insert(id, s.end);
            return self.slice(&s, REQUESTS_PID, tid);
        }
        if s.role & PHASE != 0 {
            if let Some(parent) = s.parent {
                self.phase_within(&mut s, parent)?;
                let tid = self.track_of(parent)?;
                return self.slice(&s, REQUESTS_PID, tid);
            }
        }
        if let Some(engine_id) = not_none(get(&s.attrs, self.key(py, K_ENGINE_ID))?) {
            let engine = str_of(&engine_id)?.into_owned();
            let pid = self.process(&s)?;
            let track = (pid, self.engine_track(pid, &engine, false));
            if s.role & ENGINE != 0 {
                self.remember(py, id_text(s.id), track)?;
                let windows = (pid, self.engine_track(pid, &engine, true));
                return self.place_on(&s, windows);
            }
            if s.role & PARENT != 0 {
                self.remember(py, id_text(s.id), track)?;
            }
            return self.place_on(&s, track);
        }
        if let Some(parent) = s.parent {
            let parent = id_text(parent);
            if let Some(&known) = self.recent.get(&parent) {
                return self.place_known(&s, known);
            }
            if s.role & WAITER != 0 || contains(&s.attrs, self.key(py, K_STEP_ID))? {
                return self.wait_for(py, parent, s.obj.clone().unbind());
            }
        }
        let track = self.trace_track(&s)?;
        self.place_on(&s, track)
    }

    fn phase_within(
        &mut self,
        phase: &mut S<'_, '_>,
        parent: &Bound<'_, PyString>,
    ) -> PyResult<()> {
        let parent = id_text(parent);
        if let Some(&end) = self.request_ends.get(&parent) {
            if phase.end > end {
                self.adjust(phase, end, K_CLIPPED)?;
            }
            return Ok(());
        }
        if phase.end > self.phase_ends.get(&parent).copied().unwrap_or(0) {
            if self.phase_ends.len() >= self.track_cache {
                self.phase_ends.clear();
            }
            self.phase_ends.insert(parent, phase.end);
        }
        Ok(())
    }

    /// `span._replace(end_ns=end, attributes={**attributes, arg: abs(...)})`.
    fn adjust(&mut self, s: &mut S<'_, '_>, end: i128, arg: usize) -> PyResult<()> {
        let py = s.obj.py();
        self.adjusted += 1;
        let attrs = PyDict::new(py);
        attrs.update(s.attrs.cast::<pyo3::types::PyMapping>()?)?;
        attrs.set_item(self.key(py, arg), (s.end - end).unsigned_abs())?;
        s.attrs = attrs.into_any();
        s.end = end;
        Ok(())
    }

    fn wait_for(&mut self, py: Python<'_>, parent: String, span: Py<PyAny>) -> PyResult<()> {
        self.pending.push(parent, span);
        while self.pending.count > self.pending_limit {
            match self.pending.pop_oldest() {
                Some(oldest) => self.orphans(py, oldest)?,
                None => break,
            }
        }
        Ok(())
    }

    fn orphans(&mut self, py: Python<'_>, spans: Vec<Py<PyAny>>) -> PyResult<()> {
        for child in spans {
            self.unparented += 1;
            let child = child.into_bound(py);
            let s = self.view(&child)?;
            let track = self.trace_track(&s)?;
            self.place_on(&s, track)?;
        }
        Ok(())
    }

    fn remember(&mut self, py: Python<'_>, id: String, track: Track) -> PyResult<()> {
        match self.recent.get_mut(&id) {
            Some(t) => *t = track, // an OrderedDict keeps a key's place when it is set again
            None => {
                self.recent.insert(id.clone(), track);
                self.recent_order.push_back(id.clone());
                if self.recent.len() > self.recent_limit {
                    if let Some(oldest) = self.recent_order.pop_front() {
                        self.recent.remove(&oldest);
                    }
                }
            }
        }
        if let Some(waiting) = self.pending.take(&id) {
            for child in waiting {
                let child = child.into_bound(py);
                let s = self.view(&child)?;
                self.place_known(&s, track)?;
            }
        }
        Ok(())
    }

    fn place_known(&mut self, s: &S<'_, '_>, track: Track) -> PyResult<()> {
        self.place_on(s, track)?;
        if s.role & PARENT != 0 {
            self.remember(s.obj.py(), id_text(s.id), track)?;
        }
        Ok(())
    }

    fn place_on(&mut self, s: &S<'_, '_>, (pid, tid): Track) -> PyResult<()> {
        self.slice(s, pid, tid)?;
        if s.role & GPU == 0 {
            return Ok(());
        }
        if s.role & STEP != 0 {
            self.step_extras(s, pid, tid)?;
        }
        let py = s.obj.py();
        if contains(&s.attrs, self.key(py, K_GPU_UTIL))?
            || contains(&s.attrs, self.key(py, K_GPU_POWER))?
            || contains(&s.attrs, self.key(py, K_GPU_MEMORY))?
        {
            self.gpu_counter(s, pid)?;
        }
        Ok(())
    }
}

/// `attrs.get(...)` as Python reads it where `None` means absent.
fn not_none(v: Option<Bound<'_, PyAny>>) -> Option<Bound<'_, PyAny>> {
    v.filter(|v| !v.is_none())
}

/// `value or None` on an `attrs.get(...)` result.
fn truthy(v: Option<Bound<'_, PyAny>>) -> PyResult<Option<Bound<'_, PyAny>>> {
    match v {
        Some(v) if v.is_truthy()? => Ok(Some(v)),
        _ => Ok(None),
    }
}
