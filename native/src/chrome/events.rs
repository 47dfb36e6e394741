//! The events of one span once it is placed: its slice, a step's counters and flows, GPU
//! counters (`perfetto.ChromeTraceWriter._slice`, `_step_extras`, `_gpu_counter`).

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::py::{get, push_escaped_code_points, push_str_escaped, Json};
use super::text::{push_i128, push_msgspec_f64, push_repr_f64, push_us};
use super::{
    string, ChromeTraceEvents, GIB, K_ENGINE_ID, K_GPU_ID, K_GPU_MEMORY, K_GPU_POWER, K_GPU_UTIL,
    K_KV, K_RUNNING, K_WAITING, REQUESTS_PID, S,
};

impl ChromeTraceEvents {
    /// Nanoseconds from the origin, fixed by the first time asked for.
    pub(super) fn rel(&mut self, ns: i128) -> i128 {
        let origin = *self.origin.get_or_insert_with(|| {
            (ns.div_euclid(1_000_000_000) - self.origin_lead_s) * 1_000_000_000
        });
        ns - origin
    }

    pub(super) fn slice(&mut self, s: &S<'_, '_>, pid: i64, tid: i64) -> PyResult<()> {
        let d = self.rel(s.start);
        let dur = (s.end - s.start).max(0);
        let o = &mut self.out;
        o.extend_from_slice(b",\n{\"ph\":\"X\",\"name\":\"");
        push_escaped_code_points(o, s.name_obj, usize::MAX);
        o.extend_from_slice(b"\",\"cat\":\"llmtrace\",\"ts\":");
        push_us(o, d);
        o.extend_from_slice(b",\"dur\":");
        push_us(o, dur);
        push_pid_tid(o, pid, tid);
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

    pub(super) fn step_extras(&mut self, s: &S<'_, '_>, pid: i64, tid: i64) -> PyResult<()> {
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
            push_flow_event(o, b's', fid, start, REQUESTS_PID, rtid);
            push_flow_event(o, b'f', fid, end, pid, tid);
        }
        self.flows = fid;
        Ok(())
    }

    pub(super) fn gpu_counter(&mut self, s: &S<'_, '_>, pid: i64) -> PyResult<()> {
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

/// One end of a flow: `s` (its start) or `f` (its end, bound to the next slice).
fn push_flow_event(o: &mut Vec<u8>, ph: u8, fid: u64, ts: i128, pid: i64, tid: i64) {
    o.extend_from_slice(b",\n{\"ph\":\"");
    o.push(ph);
    o.extend_from_slice(b"\",\"name\":\"batch\",\"cat\":\"llmtrace\",\"id\":");
    push_i128(o, i128::from(fid));
    o.extend_from_slice(b",\"ts\":");
    push_us(o, ts);
    push_pid_tid(o, pid, tid);
    o.push(b'}');
}

/// `,"pid":P,"tid":T`: where an event is drawn.
pub(super) fn push_pid_tid(o: &mut Vec<u8>, pid: i64, tid: i64) {
    o.extend_from_slice(b",\"pid\":");
    push_i128(o, i128::from(pid));
    o.extend_from_slice(b",\"tid\":");
    push_i128(o, i128::from(tid));
}
