//! Which track a span goes on: processes, engine tracks, trace tracks, request track ids,
//! and the children waiting for a parent (`perfetto.ChromeTraceWriter._process`,
//! `_engine_track`, `_trace_track`, `_name_track`, `track_id`, `_pending`).

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::PyString;
use rustc_hash::FxHashMap;

use super::events::push_pid_tid;
use super::py::{code_points, get, push_format_escaped, str_of};
use super::text::{push_ascii_escaped, push_ascii_escaped_code_points, push_i128};
use super::{not_none, ChromeTraceEvents, Track, K_HOST, K_PID, K_ROLE, REQUESTS_PID, S};

/// An insertion-ordered map whose oldest entries go first (`OrderedDict.popitem(last=False)`),
/// with removal anywhere (`OrderedDict.pop`).
#[derive(Default)]
pub(super) struct Pending {
    pub(super) by_parent: FxHashMap<String, (u64, Vec<Py<PyAny>>)>,
    order: BTreeMap<u64, String>,
    next: u64,
    pub(super) count: usize,
}

impl Pending {
    pub(super) fn push(&mut self, parent: String, span: Py<PyAny>) {
        self.count += 1;
        if let Some((_, list)) = self.by_parent.get_mut(&parent) {
            list.push(span);
            return;
        }
        self.order.insert(self.next, parent.clone());
        self.by_parent.insert(parent, (self.next, vec![span]));
        self.next += 1;
    }

    pub(super) fn take(&mut self, parent: &str) -> Option<Vec<Py<PyAny>>> {
        let (seq, list) = self.by_parent.remove(parent)?;
        self.order.remove(&seq);
        self.count -= list.len();
        Some(list)
    }

    pub(super) fn pop_oldest(&mut self) -> Option<Vec<Py<PyAny>>> {
        let (_, parent) = self.order.pop_first()?;
        let (_, list) = self.by_parent.remove(&parent)?;
        self.count -= list.len();
        Some(list)
    }
}

impl ChromeTraceEvents {
    pub(super) fn process(&mut self, s: &S<'_, '_>) -> PyResult<i64> {
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

    pub(super) fn engine_track(&mut self, pid: i64, engine: &str, windows: bool) -> i64 {
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

    pub(super) fn trace_track(&mut self, s: &S<'_, '_>) -> PyResult<Track> {
        let pid = self.process(s)?;
        let tid = self.track_of(s.trace)?;
        let mut label = b"trace ".to_vec();
        push_ascii_escaped_code_points(&mut label, code_points(s.trace, 8));
        self.name_track_escaped(pid, tid, &label, Some(100_000));
        Ok((pid, tid))
    }

    /// A thread's name (already escaped), once per track while it is remembered.
    pub(super) fn name_track_escaped(
        &mut self,
        pid: i64,
        tid: i64,
        label: &[u8],
        sort_index: Option<i64>,
    ) {
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
        o.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_name\"");
        push_pid_tid(o, pid, tid);
        o.extend_from_slice(b",\"args\":{\"name\":\"");
        o.extend_from_slice(label);
        o.extend_from_slice(b"\"}}");
        if let Some(index) = sort_index {
            o.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\"");
            push_pid_tid(o, pid, tid);
            o.extend_from_slice(b",\"args\":{\"sort_index\":");
            push_i128(o, i128::from(index));
            o.extend_from_slice(b"}}");
        }
    }

    /// `perfetto.track_id`: the last 8 hex digits, 31 bits, above 1024; anything but plain
    /// hex digits is left to the Python function.
    pub(super) fn track_of(&self, id: &Bound<'_, PyString>) -> PyResult<i64> {
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
}
