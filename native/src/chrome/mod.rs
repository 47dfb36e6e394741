//! Spans to Chrome Trace Event JSON: the compiled twin of `llmtrace.analysis.perfetto.
//! ChromeTraceWriter` (the reference, read it first). The same tracks, flows, counters and
//! bounded state, decided in the same order, so that the text is the same byte for byte;
//! `tests/analysis/test_perfetto_native.py` exports the same spans through both.
//!
//! Python keeps the names: span names come in as role flags (`perfetto._ROLES`) and
//! attribute keys as a list (`perfetto._NATIVE_KEYS`), so no `llmtrace.semconv` name is
//! written here. What this module does not know how to write the same way (an attribute
//! value of another type, a hand-made id that is not hex) it hands to the Python function
//! the reference uses.

mod py;
mod text;

use std::collections::{BTreeMap, VecDeque};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rustc_hash::{FxHashMap, FxHashSet};

use py::{code_points, contains, get, push_format_escaped, push_str_escaped, str_of, Json};
use text::{
    push_ascii_escaped, push_ascii_escaped_code_points, push_i128, push_msgspec_f64, push_repr_f64,
    push_us,
};

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

/// A time in nanoseconds (an int; the sources keep them within ±2**64).
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
    o.extract::<i128>()
        .map_err(|_| PyValueError::new_err(format!("a span's time {o} is not a 64-bit integer")))
}

/// The ids a span's key and its pending children's are compared by.
fn id_text(s: &Bound<'_, PyString>) -> String {
    s.to_string_lossy().into_owned()
}

/// An insertion-ordered map whose oldest entries go first (`OrderedDict.popitem(last=False)`),
/// with removal anywhere (`OrderedDict.pop`).
#[derive(Default)]
struct Pending {
    by_parent: FxHashMap<String, (u64, Vec<Py<PyAny>>)>,
    order: BTreeMap<u64, String>,
    next: u64,
    count: usize,
}

impl Pending {
    fn push(&mut self, parent: String, span: Py<PyAny>) {
        self.count += 1;
        if let Some((_, list)) = self.by_parent.get_mut(&parent) {
            list.push(span);
            return;
        }
        self.order.insert(self.next, parent.clone());
        self.by_parent.insert(parent, (self.next, vec![span]));
        self.next += 1;
    }

    fn take(&mut self, parent: &str) -> Option<Vec<Py<PyAny>>> {
        let (seq, list) = self.by_parent.remove(parent)?;
        self.order.remove(&seq);
        self.count -= list.len();
        Some(list)
    }

    fn pop_oldest(&mut self) -> Option<Vec<Py<PyAny>>> {
        let (_, parent) = self.order.pop_first()?;
        let (_, list) = self.by_parent.remove(&parent)?;
        self.count -= list.len();
        Some(list)
    }
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

    /// Nanoseconds from the origin, fixed by the first time asked for.
    fn rel(&mut self, ns: i128) -> i128 {
        let origin = *self.origin.get_or_insert_with(|| {
            (ns.div_euclid(1_000_000_000) - self.origin_lead_s) * 1_000_000_000
        });
        ns - origin
    }

    fn slice(&mut self, s: &S<'_, '_>, pid: i64, tid: i64) -> PyResult<()> {
        let d = self.rel(s.start);
        let dur = (s.end - s.start).max(0);
        let o = &mut self.out;
        o.extend_from_slice(b",\n{\"ph\":\"X\",\"name\":\"");
        push_ascii_escaped_code_points(o, code_points(s.name_obj, usize::MAX));
        o.extend_from_slice(b"\",\"cat\":\"llmtrace\",\"ts\":");
        push_us(o, d);
        o.extend_from_slice(b",\"dur\":");
        push_us(o, dur);
        o.extend_from_slice(b",\"pid\":");
        push_i128(o, i128::from(pid));
        o.extend_from_slice(b",\"tid\":");
        push_i128(o, i128::from(tid));
        o.extend_from_slice(b",\"args\":{\"span_id\":\"");
        o.extend_from_slice(s.id.to_str()?.as_bytes());
        o.push(b'"');
        if !self.args {
            o.extend_from_slice(b"}}");
            return Ok(());
        }
        o.extend_from_slice(b",\"trace_id\":\"");
        o.extend_from_slice(s.trace.to_str()?.as_bytes());
        o.push(b'"');
        if s.attrs.is_truthy()? {
            o.push(b',');
            let encode = self.encode.bind(s.obj.py());
            Json { encode }.members(o, &s.attrs)?;
            o.push(b'}');
        } else {
            o.extend_from_slice(b"}}");
        }
        Ok(())
    }

    fn process(&mut self, s: &S<'_, '_>) -> PyResult<i64> {
        let py = s.obj.py();
        if let Some(last) = &self.last_resource {
            if last.as_ptr() == s.resource.as_ptr() && s.resource.is_truthy()? {
                return Ok(self.last_pid);
            }
        }
        let proc = not_none(get(s.resource, self.key(py, K_PID))?);
        let host = match get(s.resource, self.key(py, K_HOST))? {
            Some(h) => str_of(&h)?.into_owned(),
            None => String::new(),
        };
        let key = (
            str_of(s.service)?.into_owned(),
            match &proc {
                Some(p) => str_of(p)?.into_owned(),
                None => String::new(),
            },
            host,
        );
        let pid = match self.processes.get(&key) {
            Some(&pid) => pid,
            None => {
                let pid = REQUESTS_PID + 1 + self.processes.len() as i64;
                self.processes.insert(key, pid);
                let mut label = Vec::new();
                if s.service.is_truthy()? {
                    push_format_escaped(&mut label, s.service)?;
                } else {
                    label.extend_from_slice(b"unknown service");
                }
                if let Some(role) = get(s.resource, self.key(py, K_ROLE))? {
                    if role.is_truthy()? {
                        label.extend_from_slice(b" [");
                        push_format_escaped(&mut label, &role)?;
                        label.push(b']');
                    }
                }
                if let Some(p) = &proc {
                    label.extend_from_slice(b" (pid ");
                    push_format_escaped(&mut label, p)?;
                    label.push(b')');
                }
                let o = &mut self.out;
                o.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
                push_i128(o, i128::from(pid));
                o.extend_from_slice(b",\"tid\":0,\"args\":{\"name\":\"");
                o.extend_from_slice(&label);
                o.extend_from_slice(b"\"}}");
                pid
            }
        };
        self.last_resource = Some(s.resource.clone().unbind());
        self.last_pid = pid;
        Ok(pid)
    }

    fn engine_track(&mut self, pid: i64, engine: &str, windows: bool) -> i64 {
        let key = (pid, engine.to_owned(), windows);
        if let Some(&tid) = self.engines.get(&key) {
            return tid;
        }
        let tid = 1 + self.engines.len() as i64;
        self.engines.insert(key, tid);
        let mut label = b"engine ".to_vec();
        push_ascii_escaped(&mut label, engine);
        if windows {
            label.extend_from_slice(b" windows");
        }
        self.name_track_escaped(pid, tid, &label, Some(2 * tid + i64::from(windows)));
        tid
    }

    fn trace_track(&mut self, s: &S<'_, '_>) -> PyResult<Track> {
        let pid = self.process(s)?;
        let tid = self.track_of(s.trace)?;
        let mut label = b"trace ".to_vec();
        push_ascii_escaped_code_points(&mut label, code_points(s.trace, 8));
        self.name_track_escaped(pid, tid, &label, Some(100_000));
        Ok((pid, tid))
    }

    /// A thread's name (already escaped), once per track while it is remembered.
    fn name_track_escaped(&mut self, pid: i64, tid: i64, label: &[u8], sort_index: Option<i64>) {
        if !self.named.insert((pid, tid)) {
            return;
        }
        self.named_order.push_back((pid, tid));
        if self.named.len() > self.track_cache {
            if let Some(oldest) = self.named_order.pop_front() {
                self.named.remove(&oldest);
            }
        }
        let o = &mut self.out;
        o.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
        push_i128(o, i128::from(pid));
        o.extend_from_slice(b",\"tid\":");
        push_i128(o, i128::from(tid));
        o.extend_from_slice(b",\"args\":{\"name\":\"");
        o.extend_from_slice(label);
        o.extend_from_slice(b"\"}}");
        if let Some(index) = sort_index {
            o.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":");
            push_i128(o, i128::from(pid));
            o.extend_from_slice(b",\"tid\":");
            push_i128(o, i128::from(tid));
            o.extend_from_slice(b",\"args\":{\"sort_index\":");
            push_i128(o, i128::from(index));
            o.extend_from_slice(b"}}");
        }
    }

    /// `perfetto.track_id`: the last 8 hex digits, 31 bits, above 1024; anything but plain
    /// hex digits is left to the Python function.
    fn track_of(&self, id: &Bound<'_, PyString>) -> PyResult<i64> {
        if let Ok(text) = id.to_str() {
            let tail = &text.as_bytes()[text.len().saturating_sub(8)..];
            if !tail.is_empty() && text.is_ascii() && tail.iter().all(u8::is_ascii_hexdigit) {
                let v = tail.iter().fold(0u32, |acc, &b| {
                    (acc << 4) | (b as char).to_digit(16).unwrap_or(0)
                });
                let v = i64::from(v & 0x7FFF_FFFF);
                return Ok(if v > 1024 { v } else { v + 1024 });
            }
        }
        self.track_id.bind(id.py()).call1((id,))?.extract()
    }

    /// `perfetto.finite_number(value)`: exact floats and ints read here, the rest by it.
    fn finite(&self, v: Option<Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
        let Some(v) = v else { return Ok(None) };
        let p = v.as_ptr();
        // SAFETY: `p` is live; the checks read its type only.
        if unsafe { ffi::PyFloat_CheckExact(p) } != 0 {
            // SAFETY: `p` is an exact float.
            let x = unsafe { ffi::PyFloat_AS_DOUBLE(p) };
            return Ok((-1e300 < x && x < 1e300).then_some(x));
        }
        // SAFETY: as above.
        if unsafe { ffi::PyLong_CheckExact(p) } != 0 {
            let mut overflow = 0;
            // SAFETY: `p` is an exact int; overflow is reported, not raised.
            let n = unsafe { ffi::PyLong_AsLongLongAndOverflow(p, &mut overflow) };
            if overflow == 0 {
                return Ok(Some(n as f64)); // as float(n): round half to even
            }
        }
        self.finite.bind(v.py()).call1((v,))?.extract()
    }

    fn step_extras(&mut self, s: &S<'_, '_>, pid: i64, tid: i64) -> PyResult<()> {
        let py = s.obj.py();
        let ts = self.rel(s.start);
        if !self.engine_names.contains_key(&tid) {
            let mut name = Vec::new();
            match get(&s.attrs, self.key(py, K_ENGINE_ID))? {
                Some(e) => push_str_escaped(&mut name, &e, usize::MAX)?,
                None => push_i128(&mut name, i128::from(tid)),
            }
            self.engine_names.insert(tid, name);
        }
        let running = self.finite(get(&s.attrs, self.key(py, K_RUNNING))?)?;
        let waiting = self.finite(get(&s.attrs, self.key(py, K_WAITING))?)?;
        let kv = self.finite(get(&s.attrs, self.key(py, K_KV))?)?;
        let engine = &self.engine_names[&tid];
        let o = &mut self.out;
        let counter_head = |o: &mut Vec<u8>, what: &[u8]| {
            o.extend_from_slice(b",\n{\"ph\":\"C\",\"name\":\"");
            o.extend_from_slice(engine);
            o.extend_from_slice(what);
            o.extend_from_slice(b"\",\"ts\":");
            push_us(o, ts);
            o.extend_from_slice(b",\"pid\":");
            push_i128(o, i128::from(pid));
            o.extend_from_slice(b",\"args\":{");
        };
        match (running, waiting) {
            (Some(r), Some(w)) => {
                counter_head(o, b" queue");
                o.extend_from_slice(b"\"running\":");
                push_repr_f64(o, r);
                o.extend_from_slice(b",\"waiting\":");
                push_repr_f64(o, w);
                o.extend_from_slice(b"}}");
                self.counters += 1;
            }
            (Some(v), None) | (None, Some(v)) => {
                counter_head(o, b" queue");
                o.extend_from_slice(if running.is_some() {
                    b"\"running\":"
                } else {
                    b"\"waiting\":"
                });
                push_msgspec_f64(o, v);
                o.extend_from_slice(b"}}");
                self.counters += 1;
            }
            (None, None) => {}
        }
        if let Some(kv) = kv {
            counter_head(o, b" kv cache");
            o.extend_from_slice(b"\"usage\":");
            push_repr_f64(o, kv);
            o.extend_from_slice(b"}}");
            self.counters += 1;
        }
        self.flows_of(s, pid, tid)
    }

    /// A flow from each request the step served to the step (see the reference's comment
    /// on how Perfetto binds them: the times are chosen).
    fn flows_of(&mut self, s: &S<'_, '_>, pid: i64, tid: i64) -> PyResult<()> {
        if !s.links.is_truthy()? {
            return Ok(());
        }
        let start = self.rel(s.start - 2);
        let end = self.rel(s.start - 1);
        let mut fid = self.flows;
        for link in s.links.try_iter()? {
            let link = link?;
            let lt = link
                .cast::<PyTuple>()
                .map_err(|_| PyTypeError::new_err("links must be Link named tuples"))?;
            let rtid = self.track_of(string(&lt.get_item(1)?, "link span_id")?)?;
            fid += 1;
            let o = &mut self.out;
            o.extend_from_slice(
                b",\n{\"ph\":\"s\",\"name\":\"batch\",\"cat\":\"llmtrace\",\"id\":",
            );
            push_i128(o, i128::from(fid));
            o.extend_from_slice(b",\"ts\":");
            push_us(o, start);
            o.extend_from_slice(b",\"pid\":1,\"tid\":");
            push_i128(o, i128::from(rtid));
            o.extend_from_slice(
                b"},\n{\"ph\":\"f\",\"name\":\"batch\",\"cat\":\"llmtrace\",\"id\":",
            );
            push_i128(o, i128::from(fid));
            o.extend_from_slice(b",\"ts\":");
            push_us(o, end);
            o.extend_from_slice(b",\"pid\":");
            push_i128(o, i128::from(pid));
            o.extend_from_slice(b",\"tid\":");
            push_i128(o, i128::from(tid));
            o.push(b'}');
        }
        self.flows = fid;
        Ok(())
    }

    fn gpu_counter(&mut self, s: &S<'_, '_>, pid: i64) -> PyResult<()> {
        let py = s.obj.py();
        let util = self.finite(get(&s.attrs, self.key(py, K_GPU_UTIL))?)?;
        let mem = self.finite(get(&s.attrs, self.key(py, K_GPU_MEMORY))?)?;
        let power = self.finite(get(&s.attrs, self.key(py, K_GPU_POWER))?)?;
        if util.is_none() && mem.is_none() && power.is_none() {
            return Ok(());
        }
        let mut name = b"gpu ".to_vec();
        if let Some(device) = get(&s.attrs, self.key(py, K_GPU_ID))? {
            push_str_escaped(&mut name, &device, usize::MAX)?;
        }
        while name.last() == Some(&b' ') {
            name.pop(); // `.rstrip()`: only a space survives json.dumps unescaped
        }
        let ts = self.rel(s.start);
        self.counters += 1;
        let o = &mut self.out;
        o.extend_from_slice(b",\n{\"ph\":\"C\",\"name\":\"");
        o.extend_from_slice(&name);
        o.extend_from_slice(b"\",\"ts\":");
        push_us(o, ts);
        o.extend_from_slice(b",\"pid\":");
        push_i128(o, i128::from(pid));
        o.extend_from_slice(b",\"args\":{");
        let mut sep = false;
        for (label, value) in [
            (&b"\"utilization %\":"[..], util.map(|u| u * 100.0)),
            (&b"\"memory GiB\":"[..], mem.map(|m| m / GIB)),
            (&b"\"power W\":"[..], power),
        ] {
            if let Some(v) = value {
                if sep {
                    o.push(b',');
                }
                sep = true;
                o.extend_from_slice(label);
                push_msgspec_f64(o, v);
            }
        }
        o.extend_from_slice(b"}}");
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
