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
    let section = |span: &Bound<'py, PyTuple>, lo: i128, hi: i128, stack: &Bound<'py, PyTuple>| {
        let fields = [
            span.clone().into_any(),
            (lo as i64).into_pyobject(py)?.into_any(),
            (hi as i64).into_pyobject(py)?.into_any(),
            stack.clone().into_any(),
        ];
        named_tuple::new(
            py,
            section_type.as_ptr(),
            fields.into_iter().map(Bound::into_ptr),
        )
    };
    let children = children
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("children must be a dict"))?;
    let root = root.cast::<PyTuple>()?.clone();
    let allowance = i128::from(overlap_allowance_ns);
    let sections = PyList::empty(py);
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
                    sections.append(section(&frame.span, cut, end, &frame.stack)?)?;
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
                    sections.append(section(&frame.span, lo, end, &frame.stack)?)?;
                }
                frames.pop();
                on_path.pop();
                returning = lo;
            }
        }
    }
    Ok(sections)
}
