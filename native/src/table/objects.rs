//! Rows made into the Python objects the Python paths would have made: `Span` tuples
//! (with their attribute dicts and links), traces, `StepView` fields.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::columns::{unpack_id, Mark, Val, NO_ID};
use super::{EngineTable, StepRow};
use crate::named_tuple;

impl EngineTable {
    pub(super) fn text<'py>(&mut self, py: Python<'py>, i: u32) -> Bound<'py, PyAny> {
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

    pub(super) fn id_text<'py>(py: Python<'py>, id: u128) -> Bound<'py, PyAny> {
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

    pub(super) fn spans_tuple<'py>(
        &mut self,
        py: Python<'py>,
        idx: &[u32],
    ) -> PyResult<Bound<'py, PyTuple>> {
        let objs = idx
            .iter()
            .map(|&i| self.span_obj(py, i))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, objs)
    }

    /// [`EngineTable::materialize`].
    pub(super) fn placed_spans<'py>(
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

    /// [`EngineTable::traces`].
    pub(super) fn trace_rows<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
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

    /// [`EngineTable::steps`].
    pub(super) fn step_rows<'py>(
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
}
