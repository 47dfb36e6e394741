//! Grouping the table into traces and engine views, exactly as `llmtrace.analysis.build`
//! groups Python spans, or declining when it cannot (see the module doc).

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::columns::{Data, Val, FORWARD, GC, NO_ID, POSTPROCESS, SAMPLE, SCHEDULE, STEP, WINDOW};
use super::steps::{number, Keys};
use super::{Built, EngineCols, EngineTable, Fx, StepRow, WindowRow};

/// What the engine-side spans of every trace add up to, by engine id, and the counts
/// `build.py` reports.
#[derive(Default)]
struct Grouped {
    steps: HashMap<String, Vec<StepRow>>,
    windows: HashMap<String, Vec<WindowRow>>,
    gcs: HashMap<String, Vec<u32>>,
    spans: u64,
    duplicates: u64,
    orphans: u64,
}

/// One trace's spans, de-duplicated by id and sorted as `Trace.build` sorts them, with its
/// parent-child links.
struct TraceSpans {
    kept: Vec<u32>,
    by_id: HashMap<u128, u32, Fx>,
    kids: HashMap<u128, Vec<u32>, Fx>,
}

impl EngineTable {
    /// [`EngineTable::build`].
    pub(super) fn group<'py>(
        &mut self,
        py: Python<'py>,
        python_traces: &Bound<'py, PyAny>,
        domains: Vec<u32>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.built = None;
        if domains.len() != self.data.resources.len() {
            return Err(PyValueError::new_err("one domain per resource"));
        }
        let keys = self.keys();
        let mut grouped = Grouped::default();
        let mut traces = Vec::new();
        for (trace, members) in trace_groups(&self.data) {
            if python_traces.contains(self.text(py, trace))? {
                return Ok(None); // the trace is partly Python spans
            }
            let Some(spans) = trace_spans(&self.data, members, &domains, &mut grouped) else {
                return Ok(None); // several processes: clock-skew repair is Python's
            };
            if !grouped.add_engine_spans(&self.data, &keys, &spans) {
                return Ok(None); // an engine id Python would format differently
            }
            traces.push((trace, spans.kept));
        }
        let counts = (grouped.spans, grouped.duplicates, grouped.orphans);
        let engines = grouped.into_engines(&self.data, &keys);
        self.built = Some(Built { engines, traces });
        self.built_to_py(py, counts).map(Some)
    }

    /// `(spans, traces, duplicates, orphans, engines)` of the built views.
    fn built_to_py<'py>(
        &mut self,
        py: Python<'py>,
        (spans, duplicates, orphans): (u64, u64, u64),
    ) -> PyResult<Bound<'py, PyTuple>> {
        let built = self.built()?;
        let trace_count = built.traces.len();
        let mut rows = Vec::with_capacity(built.engines.len());
        for e in &built.engines {
            let wins = e
                .windows
                .iter()
                .map(|&(i, lo, hi)| {
                    let s = &self.data.spans[i as usize];
                    (s.start, s.end, lo, hi, Self::id_text(py, s.id))
                })
                .collect::<Vec<_>>();
            rows.push((e.id.clone(), wins, e.gc.clone(), e.steps.len()));
        }
        let mut engines = Vec::with_capacity(rows.len());
        for (id, wins, gc, n) in rows {
            let gc = self.spans_tuple(py, &gc)?;
            engines.push((id, wins, gc, n).into_pyobject(py)?.into_any());
        }
        let list = PyList::new(py, engines)?;
        (spans, trace_count, duplicates, orphans, list).into_pyobject(py)
    }
}

/// The spans of each trace in first-seen order of the traces, in read order.
fn trace_groups(d: &Data) -> Vec<(u32, Vec<u32>)> {
    let mut slot: HashMap<u32, usize, Fx> = HashMap::default();
    let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
    for (i, s) in d.spans.iter().enumerate() {
        let g = *slot.entry(s.trace).or_insert_with(|| {
            groups.push((s.trace, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i as u32);
    }
    groups
}

/// One trace's spans (duplicates dropped and counted, sorted by start, orphans counted),
/// or `None` when its spans were timed by more than one clock (`domains` per resource).
fn trace_spans(
    d: &Data,
    members: Vec<u32>,
    domains: &[u32],
    counts: &mut Grouped,
) -> Option<TraceSpans> {
    let mut by_id: HashMap<u128, u32, Fx> = HashMap::default();
    let mut kept = Vec::with_capacity(members.len());
    for i in members {
        let s = &d.spans[i as usize];
        if let std::collections::hash_map::Entry::Vacant(slot) = by_id.entry(s.id) {
            slot.insert(i);
            kept.push(i);
        } else {
            counts.duplicates += 1;
        }
    }
    let domain = |i: u32| domains[d.spans[i as usize].resource as usize];
    let first = domain(kept[0]);
    if kept.iter().any(|&i| domain(i) != first) {
        return None;
    }
    kept.sort_by_key(|&i| d.spans[i as usize].start); // stable, as Trace.build
    counts.spans += kept.len() as u64;
    let mut kids: HashMap<u128, Vec<u32>, Fx> = HashMap::default();
    for &i in &kept {
        let s = &d.spans[i as usize];
        if s.parent != NO_ID && by_id.contains_key(&s.parent) && s.parent != s.id {
            kids.entry(s.parent).or_default().push(i);
        } else if s.parent != NO_ID {
            counts.orphans += 1;
        }
    }
    Some(TraceSpans { kept, by_id, kids })
}

/// An `Int` step id, as `build._int` reads it.
fn step_id(d: &Data, keys: &Keys, i: u32) -> Option<i64> {
    match d.attr(&d.spans[i as usize], keys.step_id) {
        Some(Val::Int(v)) => Some(v),
        _ => None,
    }
}

impl Grouped {
    /// Adds the trace's steps, windows and gc pauses to their engines (`build._views`);
    /// `false` when an engine id is one the table does not format as Python would.
    fn add_engine_spans(&mut self, d: &Data, keys: &Keys, t: &TraceSpans) -> bool {
        for &i in &t.kept {
            let s = &d.spans[i as usize];
            if !matches!(s.name, STEP | WINDOW | GC) {
                continue;
            }
            let Some(eid) = engine_of(d, keys, &t.by_id, i) else {
                return false;
            };
            let children = t.kids.get(&s.id).map(Vec::as_slice).unwrap_or_default();
            match s.name {
                STEP => {
                    let (mut fw, mut host) = (Vec::new(), Vec::new());
                    for &c in children {
                        match d.spans[c as usize].name {
                            FORWARD => fw.push(c),
                            SCHEDULE | SAMPLE | POSTPROCESS => host.push(c),
                            _ => {}
                        }
                    }
                    let row = (i, step_id(d, keys, i), fw, host);
                    self.steps.entry(eid).or_default().push(row);
                }
                WINDOW => {
                    // `build._window_view`: the first and last step id among its steps.
                    let ids: Vec<i64> = children
                        .iter()
                        .filter(|&&c| d.spans[c as usize].name == STEP)
                        .filter_map(|&c| step_id(d, keys, c))
                        .collect();
                    let (lo, hi) = (ids.iter().min().copied(), ids.iter().max().copied());
                    self.windows.entry(eid).or_default().push((i, lo, hi));
                }
                _ => self.gcs.entry(eid).or_default().push(i),
            }
        }
        true
    }

    /// Each engine's columns, by engine id; gc pauses of engines with no steps or windows
    /// are dropped, as in Python.
    fn into_engines(mut self, d: &Data, keys: &Keys) -> Vec<EngineCols> {
        let mut ids: Vec<String> = self
            .steps
            .keys()
            .chain(self.windows.keys())
            .cloned()
            .collect();
        ids.sort();
        ids.dedup();
        let by_start = |i: u32| d.spans[i as usize].start;
        let mut engines = Vec::with_capacity(ids.len());
        for id in ids {
            let mut steps = self.steps.remove(&id).unwrap_or_default();
            steps.sort_by_key(|x| by_start(x.0));
            let mut windows = self.windows.remove(&id).unwrap_or_default();
            windows.sort_by_key(|x| by_start(x.0));
            let mut gc = self.gcs.remove(&id).unwrap_or_default();
            gc.sort_by_key(|&i| by_start(i));
            engines.push(engine_columns(d, keys, id, steps, windows, gc));
        }
        engines
    }
}

/// One engine's columns from its sorted steps, windows and gc pauses.
fn engine_columns(
    d: &Data,
    keys: &Keys,
    id: String,
    steps: Vec<StepRow>,
    windows: Vec<WindowRow>,
    gc: Vec<u32>,
) -> EngineCols {
    let mut cols = EngineCols {
        id,
        steps: Vec::with_capacity(steps.len()),
        step_id: Vec::with_capacity(steps.len()),
        nums: Vec::with_capacity(steps.len()),
        fwd_off: vec![0],
        fwd: Vec::new(),
        host_off: vec![0],
        host: Vec::new(),
        windows,
        gc,
    };
    let n = keys.nums;
    for (i, sid, fw, host) in steps {
        let s = &d.spans[i as usize];
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
    cols
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
