//! `llmtrace.analysis.critical_path.critical_path`, compiled: the same walk over the same
//! `Trace.children` dict and `Span` tuples, returning the same `Section` objects (made by
//! the Python constructor it is given). The Python function stays the reference;
//! `tests/analysis/test_critical_path.py` runs both on random trees.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::named_tuple;

/// A child clipped to its parent: start, end, the span.
type Clipped<'py> = (i128, i128, Bound<'py, PyTuple>);

struct Frame<'py> {
    span: Bound<'py, PyTuple>,
    lo: i128,
    kids: Vec<Clipped<'py>>,
    cursor: usize,
    stack: Bound<'py, PyTuple>,
}

fn times(span: &Bound<'_, PyTuple>) -> PyResult<(i128, i128)> {
    Ok((
        i128::from(span.get_item(4)?.extract::<i64>()?),
        i128::from(span.get_item(5)?.extract::<i64>()?),
    ))
}

fn span_id(span: &Bound<'_, PyTuple>) -> PyResult<String> {
    Ok(span.get_item(1)?.cast::<PyString>()?.to_str()?.to_owned())
}

/// `_clipped_children`: children clipped to `[lo, hi]`, latest end first (then latest
/// start; equal keys keep their order, as Python's stable reverse sort does).
fn clipped<'py>(
    children: &Bound<'py, PyDict>,
    span: &Bound<'py, PyTuple>,
    lo: i128,
    hi: i128,
) -> PyResult<Vec<Clipped<'py>>> {
    let mut out = Vec::new();
    if let Some(kids) = children.get_item(span.get_item(1)?)? {
        for c in kids.cast::<PyTuple>()?.iter() {
            let c = c.cast_into::<PyTuple>()?;
            let (cs, ce) = times(&c)?;
            let (s, e) = (cs.max(lo), ce.min(hi));
            if s < e || (s == e && lo <= cs && cs <= hi) {
                out.push((s, e, c));
            }
        }
    }
    out.sort_by_key(|k| std::cmp::Reverse((k.1, k.0)));
    Ok(out)
}

/// `critical_path(trace, root, overlap_allowance_ns=...)` given `trace.children` (a dict)
/// and the `Section` named-tuple class.
#[pyfunction]
pub fn critical_path<'py>(
    py: Python<'py>,
    children: &Bound<'py, PyAny>,
    root: &Bound<'py, PyAny>,
    overlap_allowance_ns: i64,
    section_type: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    if !named_tuple::is_tuple_class(section_type) {
        return Err(PyTypeError::new_err("Section must be a named tuple class"));
    }
    let children = as_children(children)?;
    let sections = PyList::empty(py);
    walk(
        py,
        children,
        root.cast::<PyTuple>()?,
        i128::from(overlap_allowance_ns),
        |span, lo, hi, stack| {
            let fields = [
                span.clone().into_any(),
                (lo as i64).into_pyobject(py)?.into_any(),
                (hi as i64).into_pyobject(py)?.into_any(),
                stack.clone().into_any(),
            ];
            let section = named_tuple::new(
                py,
                section_type.as_ptr(),
                fields.into_iter().map(Bound::into_ptr),
            )?;
            sections.append(section)
        },
    )?;
    Ok(sections)
}

fn as_children<'a, 'py>(children: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyDict>> {
    children
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("children must be a dict"))
}

/// The walk: `emit(span, start, end, name path)` for each section, latest first.
fn walk<'py>(
    py: Python<'py>,
    children: &Bound<'py, PyDict>,
    root: &Bound<'py, PyTuple>,
    allowance: i128,
    mut emit: impl FnMut(&Bound<'py, PyTuple>, i128, i128, &Bound<'py, PyTuple>) -> PyResult<()>,
) -> PyResult<()> {
    let root = root.clone();
    let (rs, re) = times(&root)?;
    let mut on_path = vec![span_id(&root)?];
    let mut frames = vec![Frame {
        kids: clipped(children, &root, rs, re)?,
        lo: rs,
        cursor: 0,
        stack: PyTuple::new(py, [root.get_item(3)?])?,
        span: root,
    }];
    let mut returning = re;
    while let Some(frame) = frames.last_mut() {
        let end = returning;
        let mut chosen = None;
        while frame.cursor < frame.kids.len() {
            let k = &frame.kids[frame.cursor];
            frame.cursor += 1;
            if k.1 <= end + allowance && k.0 < end && !on_path.contains(&span_id(&k.2)?) {
                chosen = Some(k.clone());
                break;
            }
        }
        match chosen {
            Some((cs, ce, child)) => {
                let cut = ce.min(end);
                if cut < end {
                    emit(&frame.span, cut, end, &frame.stack)?;
                }
                let mut names: Vec<Bound<'py, PyAny>> = frame.stack.iter().collect();
                names.push(child.get_item(3)?);
                on_path.push(span_id(&child)?);
                frames.push(Frame {
                    kids: clipped(children, &child, cs, cut)?,
                    lo: cs,
                    cursor: 0,
                    stack: PyTuple::new(py, names)?,
                    span: child,
                });
                returning = cut;
            }
            None => {
                let lo = frame.lo;
                if lo < end {
                    emit(&frame.span, lo, end, &frame.stack)?;
                }
                frames.pop();
                on_path.pop();
                returning = lo;
            }
        }
    }
    Ok(())
}

/// Nanoseconds per span name in first-seen order (names compared as Python strings).
struct ByName<'py>(Vec<(Bound<'py, PyAny>, i128)>);

impl<'py> ByName<'py> {
    fn add(&mut self, name: &Bound<'py, PyAny>, ns: i128) -> PyResult<()> {
        for (seen, total) in &mut self.0 {
            if seen.is(name) || seen.eq(name)? {
                *total += ns;
                return Ok(());
            }
        }
        self.0.push((name.clone(), ns));
        Ok(())
    }

    /// The name with the most time; the first of equal totals, as Python's `max` keeps.
    fn top(&self) -> Option<&(Bound<'py, PyAny>, i128)> {
        let mut best: Option<&(Bound<'py, PyAny>, i128)> = None;
        for entry in &self.0 {
            if best.is_none_or(|b| entry.1 > b.1) {
                best = Some(entry);
            }
        }
        best
    }
}

/// Per-name nanosecond lists, folded stacks, summed latency, dominant segments.
type PathTotals<'py> = (
    Bound<'py, PyDict>,
    Bound<'py, PyDict>,
    Bound<'py, PyAny>,
    Bound<'py, PyDict>,
);

/// `critical_path.request_paths` in one call: for each `(children, root, ttft_ns or None,
/// request span id)` the walk, folded into what `aggregate` and `_dominant` return from its
/// sections: per-name exclusive nanoseconds (one list entry per request the name is on),
/// the folded stacks, the summed latency and each request's dominant segments.
#[pyfunction]
pub fn path_totals<'py>(
    py: Python<'py>,
    requests: &Bound<'py, PyList>,
    overlap_allowance_ns: i64,
) -> PyResult<PathTotals<'py>> {
    let allowance = i128::from(overlap_allowance_ns);
    let totals = PyDict::new(py);
    let folded = PyDict::new(py);
    let dominant = PyDict::new(py);
    let e2e_key = PyString::new(py, "e2e_s");
    let ttft_key = PyString::new(py, "ttft_s");
    let mut latency_total: i128 = 0;
    for item in requests.iter() {
        let item = item.cast_into::<PyTuple>()?;
        let children = item.get_item(0)?;
        let root = item.get_item(1)?;
        let root = root.cast::<PyTuple>()?;
        let ttft = item.get_item(2)?;
        let ttft: Option<i128> = if ttft.is_none() {
            None
        } else {
            Some(i128::from(ttft.extract::<i64>()?))
        };
        let (rs, re) = times(root)?;
        latency_total += re - rs;
        let mut whole = ByName(Vec::new());
        let mut first = ByName(Vec::new());
        walk(
            py,
            as_children(&children)?,
            root,
            allowance,
            |span, lo, hi, stack| {
                let name = span.get_item(3)?;
                whole.add(&name, hi - lo)?;
                if let Some(t) = ttft {
                    let cut = hi.min(t);
                    if cut > lo {
                        first.add(&name, cut - lo)?;
                    }
                }
                let so_far = match folded.get_item(stack)? {
                    Some(v) => v.extract::<i128>()?,
                    None => 0,
                };
                folded.set_item(stack, so_far + (hi - lo))
            },
        )?;
        for (name, ns) in &whole.0 {
            match totals.get_item(name)? {
                Some(list) => list.cast_into::<PyList>()?.append(*ns)?,
                None => totals.set_item(name, PyList::new(py, [*ns])?)?,
            }
        }
        let span_id = item.get_item(3)?;
        for (metric, by) in [(&e2e_key, &whole), (&ttft_key, &first)] {
            if let Some((name, ns)) = by.top() {
                let key = PyTuple::new(py, [span_id.clone(), metric.clone().into_any()])?;
                dominant.set_item(key, (name, *ns as f64 / 1e9))?;
            }
        }
    }
    Ok((
        totals,
        folded,
        latency_total.into_pyobject(py)?.into_any(),
        dominant,
    ))
}
