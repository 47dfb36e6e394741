//! OTLP/JSON text for a batch of OpenTelemetry SDK spans, compiled: the very text
//! `llmtrace._otel.otlp_json.encode_spans` writes, byte for byte (an
//! `ExportTraceServiceRequest` in the protobuf JSON mapping, grouped by resource and then by
//! instrumentation scope in first-seen order).
//!
//! The file and OTLP/HTTP-JSON exporters run inside the serving process and share its GIL;
//! at full tracing the Python encoder was about half of their threads' CPU. This one reads a
//! span's fields straight from the instance dict of an exact SDK `ReadableSpan` (any other
//! span object through its public properties, as the Python encoder reads them) and writes
//! the text without a Python object per field.
//!
//! Contract, as the analyzer's decoder keeps it: what this module writes is what the Python
//! encoder writes, or it hands that piece to the Python encoder. An attribute value of a type
//! it does not write itself (an int beyond 64 bits, a subclass, bytes, a mapping) goes to
//! `any_value`; a mapping it cannot walk (a key that is not a `str`) to `attributes`; a span
//! with any field it does not recognise (a name that is not a `str`, an unknown kind or
//! status code, an id or time that is not an int in range, a property that raises) to the
//! Python span encoder, which writes it — or raises its own error for it.
//! `tests/core/test_otlp_json_native.py` compares both on generated and hostile spans.

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};

use crate::chrome::py::push_escaped_code_points;
use crate::chrome::text::{push_hex, push_i128, push_repr_f64};

/// Spans written between two calls of the caller's `pause` (its GIL yield).
const SPANS_PER_PAUSE: usize = 32;

/// The encoder: the SDK types and enum members it recognises and the Python encoder's
/// functions for what it hands over. Immutable; one per process, used by any thread.
#[pyclass(module = "llmtrace_native", frozen)]
pub(crate) struct OtlpJsonEncoder {
    readable_span: Py<PyType>,
    span_context: Py<PyType>,
    status: Py<PyType>,
    /// `SpanKind` members and their OTLP numbers (the API's value + 1).
    kinds: Vec<(Py<PyAny>, u8)>,
    /// `StatusCode` members and their numbers.
    codes: Vec<(Py<PyAny>, u8)>,
    span_text: Py<PyAny>,
    any_value: Py<PyAny>,
    attributes: Py<PyAny>,
    resource_attributes: Py<PyAny>,
    quote: Py<PyAny>,
    /// `id(link) -> (link, text)`, the Python encoder's own cache: a request's link object is
    /// written once per step it is in.
    links: Py<PyDict>,
    links_max: usize,
}

/// The spans of one instrumentation scope, under one resource.
struct ScopeGroup {
    /// `(scope.name, scope.version)`, compared as the Python encoder's dict keys are.
    key: Py<PyAny>,
    text: Vec<u8>,
}

struct ResourceGroup {
    resource: Py<PyAny>,
    scopes: Vec<ScopeGroup>,
    /// Scope objects seen under this resource and their group: kept alive, so a pointer
    /// stays theirs.
    seen: Vec<(Py<PyAny>, usize)>,
}

/// A span's fields, from its instance dict or its properties.
struct Fields<'py> {
    name: Bound<'py, PyAny>,
    context: Bound<'py, PyAny>,
    kind: Bound<'py, PyAny>,
    parent: Bound<'py, PyAny>,
    start: Bound<'py, PyAny>,
    end: Bound<'py, PyAny>,
    attributes: Bound<'py, PyAny>,
    events: Bound<'py, PyAny>,
    links: Bound<'py, PyAny>,
    status: Bound<'py, PyAny>,
    resource: Bound<'py, PyAny>,
    scope: Bound<'py, PyAny>,
}

#[pymethods]
impl OtlpJsonEncoder {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        readable_span: Bound<'_, PyType>,
        span_context: Bound<'_, PyType>,
        status: Bound<'_, PyType>,
        kinds: Vec<(Py<PyAny>, u8)>,
        codes: Vec<(Py<PyAny>, u8)>,
        span_text: Py<PyAny>,
        any_value: Py<PyAny>,
        attributes: Py<PyAny>,
        resource_attributes: Py<PyAny>,
        quote: Py<PyAny>,
        links: Py<PyDict>,
        links_max: usize,
    ) -> Self {
        Self {
            readable_span: readable_span.unbind(),
            span_context: span_context.unbind(),
            status: status.unbind(),
            kinds,
            codes,
            span_text,
            any_value,
            attributes,
            resource_attributes,
            quote,
            links,
            links_max,
        }
    }

    /// One `ExportTraceServiceRequest` for `spans` as a JSON line; `pause` is called every
    /// few spans.
    #[pyo3(signature = (spans, pause=None))]
    fn encode(
        &self,
        py: Python<'_>,
        spans: &Bound<'_, PyAny>,
        pause: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        let mut groups: Vec<ResourceGroup> = Vec::new();
        for (index, span) in spans.try_iter()?.enumerate() {
            let span = span?;
            if index % SPANS_PER_PAUSE == SPANS_PER_PAUSE - 1 {
                if let Some(pause) = pause {
                    pause.call0()?;
                }
            }
            let fields = self.fields(py, &span).unwrap_or(None);
            let (resource, scope) = match &fields {
                Some(f) => (f.resource.clone(), f.scope.clone()),
                None => (
                    span.getattr(intern!(py, "resource"))?,
                    span.getattr(intern!(py, "instrumentation_scope"))?,
                ),
            };
            let text = self.group_text(py, &mut groups, resource, scope)?;
            if !text.is_empty() {
                text.push(b',');
            }
            let mark = text.len();
            let written = match fields {
                Some(f) => self.try_span(py, text, f).unwrap_or(false), // an error: declined (see try_span)
                None => false,
            };
            if !written {
                text.truncate(mark);
                let python_text = self.span_text.bind(py).call1((&span,))?;
                text.extend_from_slice(python_text.cast::<PyString>()?.to_str()?.as_bytes());
            }
        }
        let mut out: Vec<u8> = b"{\"resourceSpans\":[".to_vec();
        for (i, group) in groups.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"resource\":{\"attributes\":");
            let attrs = self
                .resource_attributes
                .bind(py)
                .call1((group.resource.bind(py),))?;
            out.extend_from_slice(attrs.cast::<PyString>()?.to_str()?.as_bytes());
            out.extend_from_slice(b"},\"scopeSpans\":[");
            for (j, scope) in group.scopes.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                self.scope_text(py, &mut out, scope)?;
            }
            out.extend_from_slice(b"]}");
        }
        out.extend_from_slice(b"]}");
        // Every byte written is ASCII: strings are escaped as `json.dumps` escapes them.
        String::from_utf8(out).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }
}

impl OtlpJsonEncoder {
    /// The text of the scope group `span` belongs to (made when it is the first of it).
    fn group_text<'g>(
        &self,
        py: Python<'_>,
        groups: &'g mut Vec<ResourceGroup>,
        resource: Bound<'_, PyAny>,
        scope: Bound<'_, PyAny>,
    ) -> PyResult<&'g mut Vec<u8>> {
        let r = match groups
            .iter()
            .position(|g| g.resource.as_ptr() == resource.as_ptr())
        {
            Some(r) => r,
            None => {
                groups.push(ResourceGroup {
                    resource: resource.unbind(),
                    scopes: Vec::new(),
                    seen: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[r];
        let s = match group
            .seen
            .iter()
            .find(|(seen, _)| seen.as_ptr() == scope.as_ptr())
        {
            Some(&(_, s)) => s,
            None => {
                let key = if scope.is_none() {
                    PyTuple::new(
                        py,
                        [PyString::new(py, "").into_any(), py.None().into_bound(py)],
                    )?
                } else {
                    PyTuple::new(
                        py,
                        [
                            scope.getattr(intern!(py, "name"))?,
                            scope.getattr(intern!(py, "version"))?,
                        ],
                    )?
                };
                let mut found = None;
                for (i, existing) in group.scopes.iter().enumerate() {
                    if existing.key.bind(py).eq(&key)? {
                        found = Some(i);
                        break;
                    }
                }
                let s = match found {
                    Some(s) => s,
                    None => {
                        group.scopes.push(ScopeGroup {
                            key: key.into_any().unbind(),
                            text: Vec::new(),
                        });
                        group.scopes.len() - 1
                    }
                };
                group.seen.push((scope.unbind(), s));
                s
            }
        };
        Ok(&mut group.scopes[s].text)
    }

    /// `{"scope":{"name":…[,"version":…]},"spans":[…]}`.
    fn scope_text(&self, py: Python<'_>, out: &mut Vec<u8>, scope: &ScopeGroup) -> PyResult<()> {
        let key = scope.key.bind(py);
        out.extend_from_slice(b"{\"scope\":{\"name\":");
        self.quoted(py, out, &key.get_item(0)?)?;
        let version = key.get_item(1)?;
        if version.is_truthy()? {
            out.extend_from_slice(b",\"version\":");
            self.quoted(py, out, &version)?;
        }
        out.extend_from_slice(b"},\"spans\":[");
        out.extend_from_slice(&scope.text);
        out.extend_from_slice(b"]}");
        Ok(())
    }

    /// A JSON string as `json.dumps` writes it; anything but a `str` through the Python
    /// quoting, which raises its own error for it.
    fn quoted(&self, py: Python<'_>, out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(s) = value.cast::<PyString>() {
            push_quoted(out, s);
            return Ok(());
        }
        let text = self.quote.bind(py).call1((value,))?;
        out.extend_from_slice(text.cast::<PyString>()?.to_str()?.as_bytes());
        Ok(())
    }

    /// The span's fields: read from the instance dict of an exact SDK `ReadableSpan` (what
    /// its properties return, without the copies `events` and `links` make), else through
    /// the properties.
    fn fields<'py>(
        &self,
        py: Python<'py>,
        span: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Fields<'py>>> {
        if span.get_type().as_ptr() == self.readable_span.as_ptr() {
            let dict = instance_dict(span)?;
            let dict = dict.cast::<PyDict>()?;
            let get = |key: &Bound<'py, PyString>| dict.get_item(key);
            let (Some(name), Some(context), Some(kind), Some(parent), Some(start), Some(end)) = (
                get(intern!(py, "_name"))?,
                get(intern!(py, "_context"))?,
                get(intern!(py, "_kind"))?,
                get(intern!(py, "_parent"))?,
                get(intern!(py, "_start_time"))?,
                get(intern!(py, "_end_time"))?,
            ) else {
                return Ok(None);
            };
            let (
                Some(attributes),
                Some(events),
                Some(links),
                Some(status),
                Some(resource),
                Some(scope),
            ) = (
                get(intern!(py, "_attributes"))?,
                get(intern!(py, "_events"))?,
                get(intern!(py, "_links"))?,
                get(intern!(py, "_status"))?,
                get(intern!(py, "_resource"))?,
                get(intern!(py, "_instrumentation_scope"))?,
            )
            else {
                return Ok(None);
            };
            if events.is_none() || links.is_none() {
                return Ok(None); // its properties raise for these: the Python encoder says so
            }
            return Ok(Some(Fields {
                name,
                context,
                kind,
                parent,
                start,
                end,
                attributes,
                events,
                links,
                status,
                resource,
                scope,
            }));
        }
        let get = |name: &Bound<'py, PyString>| span.getattr(name);
        Ok(Some(Fields {
            name: get(intern!(py, "name"))?,
            context: get(intern!(py, "context"))?,
            kind: get(intern!(py, "kind"))?,
            parent: get(intern!(py, "parent"))?,
            start: get(intern!(py, "start_time"))?,
            end: get(intern!(py, "end_time"))?,
            attributes: get(intern!(py, "attributes"))?,
            events: get(intern!(py, "events"))?,
            links: get(intern!(py, "links"))?,
            status: get(intern!(py, "status"))?,
            resource: get(intern!(py, "resource"))?,
            scope: get(intern!(py, "instrumentation_scope"))?,
        }))
    }

    /// Writes one span; `false` when it declines it (the caller undoes what was written
    /// and asks the Python encoder). The caller declines on an error of Python code it
    /// calls too: the Python encoder then meets the same error and raises it.
    fn try_span(&self, py: Python<'_>, out: &mut Vec<u8>, f: Fields<'_>) -> PyResult<bool> {
        let (trace_id, span_id) = if f.context.is_none() {
            (Some(0), Some(0))
        } else {
            self.ids(py, &f.context)?
        };
        let (Some(trace_id), Some(span_id)) = (trace_id, span_id) else {
            return Ok(false);
        };
        out.extend_from_slice(b"{\"traceId\":\"");
        push_hex(out, trace_id, 32);
        out.extend_from_slice(b"\",\"spanId\":\"");
        push_hex(out, span_id, 16);
        out.extend_from_slice(b"\",");
        if !f.parent.is_none() {
            let (_, Some(parent_id)) = self.ids(py, &f.parent)? else {
                return Ok(false);
            };
            out.extend_from_slice(b"\"parentSpanId\":\"");
            push_hex(out, parent_id, 16);
            out.extend_from_slice(b"\",");
        }
        let Ok(name) = f.name.cast::<PyString>() else {
            return Ok(false);
        };
        out.extend_from_slice(b"\"name\":");
        push_quoted(out, name);
        let Some(kind) = member(&self.kinds, &f.kind) else {
            return Ok(false);
        };
        out.extend_from_slice(b",\"kind\":");
        out.push(b'0' + kind);
        out.extend_from_slice(b",\"startTimeUnixNano\":\"");
        if !push_time(out, &f.start) {
            return Ok(false);
        }
        out.extend_from_slice(b"\",\"endTimeUnixNano\":\"");
        if !push_time(out, &f.end) {
            return Ok(false);
        }
        out.extend_from_slice(b"\",\"attributes\":");
        self.attributes(py, out, &f.attributes)?;
        let (code, description) = if f.status.get_type().as_ptr() == self.status.as_ptr() {
            let dict = instance_dict(&f.status)?;
            let dict = dict.cast::<PyDict>()?;
            match (
                dict.get_item(intern!(py, "_status_code"))?,
                dict.get_item(intern!(py, "_description"))?,
            ) {
                (Some(code), Some(description)) => (code, description),
                _ => return Ok(false),
            }
        } else {
            (
                f.status.getattr(intern!(py, "status_code"))?,
                f.status.getattr(intern!(py, "description"))?,
            )
        };
        let Some(code) = member(&self.codes, &code) else {
            return Ok(false);
        };
        out.extend_from_slice(b",\"status\":{\"code\":");
        out.push(b'0' + code);
        if description.is_truthy()? {
            let Ok(description) = description.cast::<PyString>() else {
                return Ok(false);
            };
            out.extend_from_slice(b",\"message\":");
            push_quoted(out, description);
        }
        out.push(b'}');
        if f.events.is_truthy()? {
            out.extend_from_slice(b",\"events\":[");
            for (i, event) in f.events.try_iter()?.enumerate() {
                let event = event?;
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"timeUnixNano\":\"");
                let timestamp = event.getattr(intern!(py, "timestamp"))?;
                if timestamp.is_none() || !push_time(out, &timestamp) {
                    return Ok(false); // (the Python encoder writes `None` as it is)
                }
                let name = event.getattr(intern!(py, "name"))?;
                let Ok(name) = name.cast::<PyString>() else {
                    return Ok(false);
                };
                out.extend_from_slice(b"\",\"name\":");
                push_quoted(out, name);
                out.extend_from_slice(b",\"attributes\":");
                self.attributes(py, out, &event.getattr(intern!(py, "attributes"))?)?;
                out.push(b'}');
            }
            out.push(b']');
        }
        if f.links.is_truthy()? {
            out.extend_from_slice(b",\"links\":[");
            for (i, link) in f.links.try_iter()?.enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !self.link(py, out, &link?)? {
                    return Ok(false);
                }
            }
            out.push(b']');
        }
        out.push(b'}');
        Ok(true)
    }

    /// A span context's trace and span id (`None` for one that is not an int in range).
    fn ids(
        &self,
        py: Python<'_>,
        context: &Bound<'_, PyAny>,
    ) -> PyResult<(Option<u128>, Option<u128>)> {
        let (trace_id, span_id) = if context.get_type().as_ptr() == self.span_context.as_ptr() {
            // The API's SpanContext is a tuple (trace_id, span_id, ...): its properties read
            // these items.
            let t = context.cast::<PyTuple>()?;
            (t.get_item(0)?, t.get_item(1)?)
        } else {
            (
                context.getattr(intern!(py, "trace_id"))?,
                context.getattr(intern!(py, "span_id"))?,
            )
        };
        Ok((id_value(&trace_id, 128), id_value(&span_id, 64)))
    }

    /// `{"traceId":…,"spanId":…,"attributes":…}`, cached by the link object.
    fn link(&self, py: Python<'_>, out: &mut Vec<u8>, link: &Bound<'_, PyAny>) -> PyResult<bool> {
        let cache = self.links.bind(py);
        let id = link.as_ptr() as usize;
        if let Some(cached) = cache.get_item(id)? {
            let cached = cached.cast::<PyTuple>()?;
            if cached.get_item(0)?.as_ptr() == link.as_ptr() {
                out.extend_from_slice(cached.get_item(1)?.cast::<PyString>()?.to_str()?.as_bytes());
                return Ok(true);
            }
        }
        let mark = out.len();
        let (Some(trace_id), Some(span_id)) =
            self.ids(py, &link.getattr(intern!(py, "context"))?)?
        else {
            return Ok(false);
        };
        out.extend_from_slice(b"{\"traceId\":\"");
        push_hex(out, trace_id, 32);
        out.extend_from_slice(b"\",\"spanId\":\"");
        push_hex(out, span_id, 16);
        out.extend_from_slice(b"\",\"attributes\":");
        self.attributes(py, out, &link.getattr(intern!(py, "attributes"))?)?;
        out.push(b'}');
        if cache.len() >= self.links_max {
            cache.clear(); // old requests' links; the live ones come back on their next step
        }
        // SAFETY: `out` holds ASCII only from `mark` on (escaped strings, digits).
        let text = unsafe { std::str::from_utf8_unchecked(&out[mark..]) };
        cache.set_item(id, (link, text))?;
        Ok(true)
    }

    /// A `KeyValue` list; a mapping it cannot walk is written by the Python encoder.
    fn attributes(
        &self,
        py: Python<'_>,
        out: &mut Vec<u8>,
        attrs: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mark = out.len();
        if self.try_attributes(py, out, attrs)? {
            return Ok(());
        }
        out.truncate(mark);
        let text = self.attributes.bind(py).call1((attrs,))?;
        out.extend_from_slice(text.cast::<PyString>()?.to_str()?.as_bytes());
        Ok(())
    }

    fn try_attributes(
        &self,
        py: Python<'_>,
        out: &mut Vec<u8>,
        attrs: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        if attrs.is_none() {
            out.extend_from_slice(b"[]");
            return Ok(true);
        }
        out.push(b'[');
        let mut first = true;
        if let Ok(d) = attrs.cast_exact::<PyDict>() {
            // `PyDict_Next` itself rather than pyo3's iterator, which panics when the dict
            // changes size meanwhile: the Python code a value may be handed to could let
            // another thread change it, and a panic must not reach the export thread.
            let size = d.len();
            let mut position: ffi::Py_ssize_t = 0;
            let mut key_ptr = std::ptr::null_mut();
            let mut value_ptr = std::ptr::null_mut();
            // SAFETY: `d` is a live dict and the GIL is held; `PyDict_Next` bounds-checks
            // `position` itself, so a dict changed meanwhile is walked safely (as C code
            // does); the borrowed key and value are made strong references at once.
            while unsafe {
                ffi::PyDict_Next(d.as_ptr(), &mut position, &mut key_ptr, &mut value_ptr)
            } != 0
            {
                // SAFETY: non-null borrowed references from `PyDict_Next`, owned from here on.
                let (key, value) = unsafe {
                    (
                        Bound::from_borrowed_ptr(py, key_ptr),
                        Bound::from_borrowed_ptr(py, value_ptr),
                    )
                };
                if !self.key_value(py, out, &key, &value, &mut first)? || d.len() != size {
                    return Ok(false); // (changed meanwhile: the Python encoder meets it as it does)
                }
            }
        } else {
            if !attrs.is_truthy()? {
                out.push(b']');
                return Ok(true);
            }
            for item in attrs.call_method0(intern!(py, "items"))?.try_iter()? {
                let item = item?;
                let (key, value) = (item.get_item(0)?, item.get_item(1)?);
                if !self.key_value(py, out, &key, &value, &mut first)? {
                    return Ok(false);
                }
            }
        }
        out.push(b']');
        Ok(true)
    }

    fn key_value(
        &self,
        py: Python<'_>,
        out: &mut Vec<u8>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        first: &mut bool,
    ) -> PyResult<bool> {
        let Ok(key) = key.cast::<PyString>() else {
            return Ok(false);
        };
        if !*first {
            out.push(b',');
        }
        *first = false;
        out.extend_from_slice(b"{\"key\":");
        push_quoted(out, key);
        out.extend_from_slice(b",\"value\":");
        self.any_value(py, out, value)?;
        out.push(b'}');
        Ok(true)
    }

    /// One `AnyValue`: exact `str`, `int` (64 bits), `float`, `bool`, `list` and `tuple`
    /// written here, anything else by the Python encoder.
    fn any_value(
        &self,
        py: Python<'_>,
        out: &mut Vec<u8>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let p = value.as_ptr();
        // SAFETY: `p` is live (`value` is a `Bound`); the checks read its type only.
        let (is_str, is_int, is_float, is_list, is_tuple) = unsafe {
            (
                ffi::PyUnicode_CheckExact(p) != 0,
                ffi::PyLong_CheckExact(p) != 0,
                ffi::PyFloat_CheckExact(p) != 0,
                ffi::PyList_CheckExact(p) != 0,
                ffi::PyTuple_CheckExact(p) != 0,
            )
        };
        if is_str {
            out.extend_from_slice(b"{\"stringValue\":");
            push_quoted(out, value.cast::<PyString>()?);
            out.push(b'}');
            return Ok(());
        }
        if is_int {
            if let Some(n) = exact_i64(value) {
                out.extend_from_slice(b"{\"intValue\":\"");
                push_i128(out, i128::from(n));
                out.extend_from_slice(b"\"}");
                return Ok(());
            }
        } else if is_float {
            // SAFETY: `p` is an exact float.
            let x = unsafe { ffi::PyFloat_AS_DOUBLE(p) };
            out.extend_from_slice(b"{\"doubleValue\":");
            if x.is_finite() {
                push_repr_f64(out, x);
            } else if x.is_nan() {
                out.extend_from_slice(b"\"NaN\"");
            } else if x > 0.0 {
                out.extend_from_slice(b"\"Infinity\"");
            } else {
                out.extend_from_slice(b"\"-Infinity\"");
            }
            out.push(b'}');
            return Ok(());
        } else if is_list || is_tuple {
            return self.array(py, out, value);
        } else {
            // SAFETY: `p` is live; `Py_True`/`Py_False` are the interpreter's singletons.
            let (is_true, is_false) = unsafe { (p == ffi::Py_True(), p == ffi::Py_False()) };
            if is_true || is_false {
                out.extend_from_slice(if is_true {
                    b"{\"boolValue\":true}"
                } else {
                    b"{\"boolValue\":false}"
                });
                return Ok(());
            }
        }
        let text = self.any_value.bind(py).call1((value,))?;
        out.extend_from_slice(text.cast::<PyString>()?.to_str()?.as_bytes());
        Ok(())
    }

    /// `{"arrayValue":{"values":[…]}}`: a list of strings (subclasses too, by their text, as
    /// the Python encoder's one-join path quotes them) or of any values.
    fn array(&self, py: Python<'_>, out: &mut Vec<u8>, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let items: Vec<Bound<'_, PyAny>> = match values.cast_exact::<PyList>() {
            Ok(list) => list.iter().collect(),
            Err(_) => values.cast::<PyTuple>()?.iter().collect(),
        };
        let all_str = items.iter().all(|item| item.is_instance_of::<PyString>());
        out.extend_from_slice(b"{\"arrayValue\":{\"values\":[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if all_str {
                out.extend_from_slice(b"{\"stringValue\":");
                push_quoted(out, item.cast::<PyString>()?);
                out.push(b'}');
            } else {
                self.any_value(py, out, item)?;
            }
        }
        out.extend_from_slice(b"]}}");
        Ok(())
    }
}

/// The OTLP number of an enum member, found by identity.
fn member(members: &[(Py<PyAny>, u8)], value: &Bound<'_, PyAny>) -> Option<u8> {
    members
        .iter()
        .find(|(m, _)| m.as_ptr() == value.as_ptr())
        .map(|&(_, n)| n)
}

/// An id that fits `bits` (exact ints and bools, as `format(id, "032x")` takes them).
fn id_value(value: &Bound<'_, PyAny>, bits: u32) -> Option<u128> {
    if !value.is_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    let v: u128 = value.extract().ok()?;
    (bits == 128 || v >> bits == 0).then_some(v)
}

/// `value or 0` in decimal, for an int within 64 bits (`None` and `0` are `0`).
fn push_time(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> bool {
    if value.is_none() {
        out.push(b'0');
        return true;
    }
    let Some(n) = exact_i64(value) else {
        return false;
    };
    push_i128(out, i128::from(n));
    true
}

/// An exact `int` that fits 64 bits (no subclass: a bool or an IntEnum is written otherwise).
fn exact_i64(value: &Bound<'_, PyAny>) -> Option<i64> {
    let p = value.as_ptr();
    // SAFETY: `p` is live (`value` is a `Bound`); the check reads its type only.
    if unsafe { ffi::PyLong_CheckExact(p) } == 0 {
        return None;
    }
    let mut overflow = 0;
    // SAFETY: `p` is an exact int; overflow is reported, not raised.
    let n = unsafe { ffi::PyLong_AsLongLongAndOverflow(p, &mut overflow) };
    (overflow == 0).then_some(n)
}

/// The instance dict of `value` (made if it had none yet).
fn instance_dict<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `value` is live and the GIL is held; a new reference or NULL comes back.
    let dict = unsafe { ffi::PyObject_GenericGetDict(value.as_ptr(), std::ptr::null_mut()) };
    if dict.is_null() {
        return Err(PyErr::fetch(value.py()));
    }
    // SAFETY: a new non-null reference, taken over here.
    Ok(unsafe { Bound::from_owned_ptr(value.py(), dict) })
}

/// A string (a subclass by its text) quoted as `json.dumps` quotes it.
fn push_quoted(out: &mut Vec<u8>, s: &Bound<'_, PyString>) {
    out.push(b'"');
    push_escaped_code_points(out, s, usize::MAX);
    out.push(b'"');
}
