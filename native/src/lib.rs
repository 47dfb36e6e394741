//! The compiled fast path of llmtrace's OTLP/JSON reader (`llmtrace.analysis.sources`).
//!
//! One line of the file exporter's output (an `ExportTraceServiceRequest`) is parsed by
//! `serde_json` into borrowed Rust structs (no Python object per JSON value, unknown
//! fields skipped), checked, and turned into the analyzer's `Span` named tuples directly.
//!
//! Contract: a line is either converted exactly as the generic Python reader
//! (`sources/otlp.py`) converts it, or declined — `None` is returned and the caller reads
//! the line through that reader, which produces the same spans, warnings and errors. So
//! this module only accepts what it is sure of: hex ids of the exact length, decimal times
//! that fit an `i64`, known span kinds, scalar attribute values and arrays of them.
//! Everything else (base64 ids, `kvlistValue`, `bytesValue`, string doubles such as
//! `"NaN"`, a value with several keys, duplicate JSON keys, malformed JSON) is declined.
//! `tests/analysis/test_native_decoder.py` compares both paths.
//!
//! The analyzer's other kernels: the engine table (`table/`), the GPU idle sweeps
//! (`gpu_idle.rs`) and the critical-path walk (`critical_path.rs`), driven by
//! `analysis/_kernels.py` (the engine table's own wrapper is `analysis/engine_table.py`), and
//! the Chrome trace writer (`chrome/`). The serving side's: the exporters' OTLP/JSON encoder
//! (`otlp_json.rs`), the ASGI middlewares' `send` (`asgi_send.rs`) and the tokenizer
//! integrations' pass-through methods (`tokenizer_method.rs`). `llmtrace/_native.py`
//! loads this module for all of them; `llmtrace_native.pyi` types every export.

// Every `unsafe` block says why it is sound (`// SAFETY:`), and an `unsafe fn` marks each
// unsafe operation inside it too: clippy -D warnings in CI holds both.
#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use rustc_hash::FxBuildHasher;
use serde::de::{self, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer};

// ---------------------------------------------------------------------------------------
// The OTLP/JSON document, as far as the analyzer reads it.

/// Missing field -> `None` (via `default`), present -> `Some(value)`; `null` is then an
/// error for a non-`Option` `T`, which declines the line.
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A struct that must be a JSON object. serde's derived structs also accept a JSON array
/// (fields by position), which the Python paths reject (`[]` has no `.get`): without this
/// wrapper `{"resourceSpans": [[]]}` would read as an empty document instead of an error.
struct Obj<T>(T);

impl<T> std::ops::Deref for Obj<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Obj)
    }
}

#[derive(Deserialize)]
struct Export<'a> {
    #[serde(
        rename = "resourceSpans",
        default,
        borrow,
        deserialize_with = "present"
    )]
    resource_spans: Option<Option<Vec<Obj<ResourceSpans<'a>>>>>,
}

#[derive(Deserialize)]
struct ResourceSpans<'a> {
    #[serde(default, borrow)]
    resource: Option<Obj<Resource<'a>>>,
    #[serde(rename = "scopeSpans", default, borrow)]
    scope_spans: Option<Vec<Obj<ScopeSpans<'a>>>>,
    #[serde(rename = "instrumentationLibrarySpans", default, borrow)]
    library_spans: Option<Vec<Obj<ScopeSpans<'a>>>>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(default, borrow)]
    attributes: Option<Vec<Obj<KeyValue<'a>>>>,
}

#[derive(Deserialize)]
struct ScopeSpans<'a> {
    #[serde(default, borrow)]
    spans: Option<Vec<Obj<RawSpan<'a>>>>,
}

#[derive(Deserialize)]
struct RawSpan<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(rename = "spanId", borrow)]
    span_id: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(rename = "startTimeUnixNano", borrow)]
    start: IntOrStr<'a>,
    #[serde(rename = "endTimeUnixNano", borrow)]
    end: IntOrStr<'a>,
    #[serde(rename = "parentSpanId", default, borrow)]
    parent: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    kind: Option<IntOrStr<'a>>,
    #[serde(default, borrow)]
    status: Option<Obj<Status<'a>>>,
    #[serde(default, borrow)]
    attributes: Option<Vec<Obj<KeyValue<'a>>>>,
    #[serde(default, borrow)]
    links: Option<Vec<Obj<RawLink<'a>>>>,
}

#[derive(Deserialize)]
struct Status<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    code: Option<IntOrStr<'a>>,
}

#[derive(Deserialize)]
struct RawLink<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(rename = "spanId", borrow)]
    span_id: Cow<'a, str>,
}

impl RawLink<'_> {
    /// Ids the Python paths take as they are (see [`is_id`]).
    fn ids_ok(&self) -> bool {
        is_id(&self.trace_id, 32) && is_id(&self.span_id, 16)
    }
}

#[derive(Deserialize)]
struct KeyValue<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    value: Obj<Value<'a>>,
}

/// An `AnyValue`. `A` is what an `arrayValue` may hold: the values of an attribute take an
/// array of [`Element`]s, an element itself no further array (`IgnoredAny`: declined).
#[derive(Deserialize)]
#[serde(bound(deserialize = "A: Deserialize<'de>"))]
struct AnyValue<'a, A> {
    #[serde(rename = "stringValue", default, borrow, deserialize_with = "present")]
    string: Option<Cow<'a, str>>,
    #[serde(rename = "intValue", default, borrow, deserialize_with = "present")]
    int: Option<IntOrStr<'a>>,
    // A string double ("NaN", "Infinity") fails here and declines the line.
    #[serde(rename = "doubleValue", default, deserialize_with = "present")]
    double: Option<f64>,
    #[serde(rename = "boolValue", default, deserialize_with = "present")]
    boolean: Option<bool>,
    #[serde(rename = "arrayValue", default, deserialize_with = "present")]
    array: Option<A>,
    #[serde(rename = "kvlistValue", default, deserialize_with = "present")]
    kvlist: Option<IgnoredAny>,
    #[serde(rename = "bytesValue", default, deserialize_with = "present")]
    bytes: Option<IgnoredAny>,
}

impl<A> AnyValue<'_, A> {
    /// Whether only the Python paths convert this value: `kvlistValue`, `bytesValue`, or
    /// several keys (the generic path takes the first in document order).
    fn python_only(&self) -> bool {
        self.kvlist.is_some() || self.bytes.is_some() || self.keys_set() > 1
    }

    /// [`AnyValue::python_only`] for an array element, which may not nest an array either.
    fn python_only_element(&self) -> bool {
        self.array.is_some() || self.python_only()
    }

    /// How many of the scalar and array keys are present.
    fn keys_set(&self) -> usize {
        [
            self.string.is_some(),
            self.int.is_some(),
            self.double.is_some(),
            self.boolean.is_some(),
            self.array.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count()
    }
}

/// An attribute's value.
type Value<'a> = AnyValue<'a, Obj<ArrayValue<'a>>>;

/// An element of an `arrayValue`: the Python path takes its first key in document order,
/// so only elements with at most one key are accepted (then the order cannot matter).
type Element<'a> = AnyValue<'a, IgnoredAny>;

#[derive(Deserialize)]
struct ArrayValue<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    values: Option<Vec<Obj<Element<'a>>>>,
}

/// A JSON integer or string (OTLP/JSON writes 64-bit integers as decimal strings).
enum IntOrStr<'a> {
    Int(i64),
    Str(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for IntOrStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IntOrStr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(IntOrStr::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(IntOrStr::Int)
                    .map_err(|_| E::custom("integer out of range"))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(IntOrStr::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(IntOrStr::Str(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_any(V)
    }
}

impl IntOrStr<'_> {
    /// Python's `int(x)` where Rust agrees with it exactly (digits with an optional sign,
    /// within `i64`); anything else (spaces, `_`, non-ASCII digits) declines.
    fn to_i64(&self) -> Result<i64, Fail> {
        match self {
            IntOrStr::Int(v) => Ok(*v),
            IntOrStr::Str(s) => s.parse::<i64>().map_err(|_| Fail::Decline),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Conversion to Python objects.

enum Fail {
    /// The Python paths must read this line.
    Decline,
    /// CPython failed (out of memory).
    Py(PyErr),
}

/// An owned reference, released on drop unless handed over with `into_raw`.
struct Owned(*mut ffi::PyObject);

impl Owned {
    fn new(py: Python<'_>, p: *mut ffi::PyObject) -> Result<Owned, Fail> {
        if p.is_null() {
            Err(Fail::Py(PyErr::fetch(py)))
        } else {
            Ok(Owned(p))
        }
    }
    fn into_raw(self) -> *mut ffi::PyObject {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: `Owned` holds a non-null strong reference it owns, released once, with the GIL
        // held (it never leaves `spans_from_line`).
        unsafe { ffi::Py_DECREF(self.0) }
    }
}

const KIND_NAMES: [&str; 6] = [
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
];
const STATUS_NAMES: [&str; 3] = ["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"];

/// Decodes OTLP/JSON lines into `llmtrace.analysis.model.Span` tuples.
///
/// Built once with the model's classes and enum members and the span and attribute names
/// of `llmtrace.semconv`, so the module has no import-time dependency on llmtrace and
/// writes none of its names a second time (`analysis/_kernels.py` constructs it).
#[pyclass(module = "llmtrace_native", frozen)]
pub struct Decoder {
    pub(crate) span_type: Py<PyAny>,
    pub(crate) link_type: Py<PyAny>,
    pub(crate) kinds: Vec<Py<PyAny>>,
    pub(crate) statuses: Vec<Py<PyAny>>,
    pub(crate) empty_attrs: Py<PyAny>,
    /// The engine-side span names, by the table's name code ([`table::ENGINE_SPANS`]).
    pub(crate) engine_spans: Vec<String>,
    /// The same names as Python strings (the spans the table makes share them).
    pub(crate) engine_span_objects: Vec<Py<PyAny>>,
    /// `service.name`, the resource attribute a span's service is read from.
    pub(crate) service_key: Py<PyAny>,
    /// The step attributes the table reads, in [`table::STEP_KEYS`] order.
    pub(crate) step_keys: Vec<String>,
}

#[pymethods]
impl Decoder {
    /// `Decoder(Span, Link, kinds, statuses, empty_attrs, engine_spans, service_key,
    /// step_keys)`: `kinds[i]` is `SpanKind(i)` for i in 0..6, `statuses[i]` is
    /// `StatusCode(i)` for i in 0..3; the names are described on the fields.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        span_type: Bound<'_, PyAny>,
        link_type: Bound<'_, PyAny>,
        kinds: Vec<Py<PyAny>>,
        statuses: Vec<Py<PyAny>>,
        empty_attrs: Py<PyAny>,
        engine_spans: Vec<String>,
        service_key: String,
        step_keys: Vec<String>,
    ) -> PyResult<Self> {
        for t in [&span_type, &link_type] {
            if !named_tuple::is_tuple_class(t) {
                return Err(PyTypeError::new_err(
                    "Span and Link must be tuple subclasses (named tuples)",
                ));
            }
        }
        if kinds.len() != 6 || statuses.len() != 3 {
            return Err(PyTypeError::new_err("need 6 span kinds and 3 status codes"));
        }
        if engine_spans.len() != table::ENGINE_SPANS || step_keys.len() != table::STEP_KEYS {
            return Err(PyTypeError::new_err(format!(
                "need {} engine span names and {} step attribute keys",
                table::ENGINE_SPANS,
                table::STEP_KEYS
            )));
        }
        let engine_span_objects = engine_spans
            .iter()
            .map(|n| PyString::new(py, n).into_any().unbind())
            .collect();
        Ok(Decoder {
            span_type: span_type.unbind(),
            link_type: link_type.unbind(),
            kinds,
            statuses,
            empty_attrs,
            engine_spans,
            engine_span_objects,
            service_key: PyString::new(py, &service_key).into_any().unbind(),
            step_keys,
        })
    }

    /// The spans of one OTLP/JSON traces line as a list, or `None` when the Python paths
    /// must read it. `strings` is the interning dict shared with them (`Interner.strings`).
    /// With `table`, engine-side spans (`Decoder::engine_spans`) go into it instead of the
    /// list; a declined line leaves the table as it was. `scan=False` reads the line with
    /// serde alone, skipping the hand-written fast path (`scan.rs`; the tests compare both).
    #[pyo3(signature = (data, strings, table=None, scan=true))]
    fn spans_from_line<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyBytes>,
        strings: &Bound<'py, PyDict>,
        table: Option<&Bound<'py, table::EngineTable>>,
        scan: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        // One UTF-8 check of the whole line, then from_str: from_slice checks every string
        // on its own, which cost more than the rest of the JSON parse.
        let Ok(text) = std::str::from_utf8(data.as_bytes()) else {
            return Ok(None);
        };
        let scanned = if scan { scan::export(text) } else { None };
        let doc: Obj<Export> = match scanned {
            Some(doc) => doc,
            None => match serde_json::from_str(text) {
                Ok(doc) => doc,
                Err(_) => return Ok(None),
            },
        };
        let rss = match doc.0.resource_spans {
            None => return Ok(None), // not an OTLP traces document
            Some(rss) => rss.unwrap_or_default(),
        };
        let mut guard = table.map(|t| t.borrow_mut());
        let data = guard.as_deref_mut().map(|t| &mut t.data);
        let mark = data.as_ref().map(|d| d.mark());
        let ctx = Ctx {
            py,
            strings: strings.as_ptr(),
            decoder: self,
            seen: RefCell::default(),
            ids: RefCell::default(),
            table: data.map(RefCell::new),
        };
        let result = ctx.convert(&rss);
        if result.is_err() {
            if let (Some(t), Some(m)) = (&ctx.table, &mark) {
                t.borrow_mut().rollback(m);
            }
        }
        match result {
            // SAFETY: `into_raw` hands over the non-null new reference to the list.
            Ok(list) => Ok(Some(unsafe { Bound::from_owned_ptr(py, list.into_raw()) })),
            Err(Fail::Decline) => Ok(None),
            Err(Fail::Py(err)) => Err(err),
        }
    }
}

struct Ctx<'py, 'd, 'doc, 't> {
    py: Python<'py>,
    /// Where engine-side spans go, when the caller gave a table.
    table: Option<RefCell<&'t mut table::Data>>,
    strings: *mut ffi::PyObject,
    decoder: &'d Decoder,
    /// The line's interned strings by their text (borrowed: `strings` holds them), so a
    /// trace id or span name repeated in the line is neither copied nor hashed again.
    seen: RefCell<HashMap<&'doc str, *mut ffi::PyObject, FxBuildHasher>>,
    /// The line's span ids, so a parent id and its span's own id are one string object (a
    /// step's four children name it): fewer allocations, less memory. Not interned across
    /// lines: span ids are unique, a global table would only grow.
    ids: RefCell<HashMap<&'doc str, Owned, FxBuildHasher>>,
}

impl<'doc> Ctx<'_, '_, 'doc, '_> {
    fn convert(&self, rss: &'doc [Obj<ResourceSpans<'doc>>]) -> Result<Owned, Fail> {
        let py = self.py;
        // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token);
        // `Owned::new` checks for NULL.
        let out = Owned::new(py, unsafe { ffi::PyList_New(0) })?;
        for rs in rss {
            let rattrs = match rs.resource.as_ref().and_then(|r| r.attributes.as_deref()) {
                Some(raw) if !raw.is_empty() => Some(self.attributes(raw)?),
                _ => None,
            };
            let service = self.service(rattrs.as_ref())?;
            let resource = match &rattrs {
                // SAFETY: `d` is a live dict this call made.
                Some(d) if unsafe { ffi::PyDict_Size(d.0) } > 0 => d.0,
                _ => self.decoder.empty_attrs.as_ptr(),
            };
            let scopes = match (&rs.scope_spans, &rs.library_spans) {
                (Some(s), _) if !s.is_empty() => s.as_slice(),
                (_, Some(s)) => s.as_slice(),
                _ => &[],
            };
            let mut in_table: Option<u32> = None; // this resource's index in the table
            for ss in scopes {
                for sp in ss.spans.as_deref().unwrap_or_default() {
                    if let Some(tab) = &self.table {
                        if let Some(code) =
                            self.decoder.engine_spans.iter().position(|n| *n == sp.name)
                        {
                            let mut t = tab.borrow_mut();
                            let res = match in_table {
                                Some(r) => r,
                                None => {
                                    // SAFETY: `service` and `resource` are live references held
                                    // for the whole loop, and the GIL is held (`py`).
                                    let service =
                                        unsafe { Bound::from_borrowed_ptr(py, service.0) };
                                    // SAFETY: as the line above.
                                    let resource =
                                        unsafe { Bound::from_borrowed_ptr(py, resource) };
                                    let text = py_text(&service)?;
                                    let r =
                                        t.add_resource(service.unbind(), resource.unbind(), text);
                                    in_table = Some(r);
                                    r
                                }
                            };
                            // SAFETY: `out` is the live list this call made.
                            let before = t.python_seen + unsafe { ffi::PyList_Size(out.0) } as u64;
                            self.table_span(&mut t, sp, code as u8, res, before)?;
                            continue;
                        }
                    }
                    let span = self.span(sp, service.0, resource)?;
                    // SAFETY: `out` and `span` are live; `PyList_Append` takes its own reference.
                    if unsafe { ffi::PyList_Append(out.0, span.0) } != 0 {
                        return Err(Fail::Py(PyErr::fetch(py)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// `str(resource[service_key])`, interned; "" when absent. Only strings are taken.
    fn service(&self, rattrs: Option<&Owned>) -> Result<Owned, Fail> {
        if let Some(d) = rattrs {
            let key = self.decoder.service_key.as_ptr();
            // SAFETY: `d` is a live dict and `key` the decoder's live `str`; the result is borrowed
            // or NULL.
            let v = unsafe { ffi::PyDict_GetItemWithError(d.0, key) };
            if !v.is_null() {
                // SAFETY: `v` is a non-null borrowed reference from the dict, alive while `d` is.
                if unsafe { ffi::PyUnicode_CheckExact(v) } == 0 {
                    return Err(Fail::Decline);
                }
                // SAFETY: `v` is live (borrowed from `d`); the new reference is the one `Owned`
                // takes over.
                unsafe { ffi::Py_INCREF(v) };
                return self.intern_object(Owned(v));
            }
            // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token).
            if unsafe { !ffi::PyErr_Occurred().is_null() } {
                return Err(Fail::Py(PyErr::fetch(self.py)));
            }
        }
        self.text("")
    }

    fn span(
        &self,
        sp: &'doc RawSpan<'doc>,
        service: *mut ffi::PyObject,
        resource: *mut ffi::PyObject,
    ) -> Result<Owned, Fail> {
        let py = self.py;
        let d = self.decoder;
        let (parent, start, end, kind, code) = header(sp)?;
        let attrs = match sp.attributes.as_deref() {
            Some(raw) if !raw.is_empty() => {
                let dict = self.attributes(raw)?;
                // SAFETY: `dict` is a live dict this call made.
                if unsafe { ffi::PyDict_Size(dict.0) } > 0 {
                    dict
                } else {
                    self.borrowed(d.empty_attrs.as_ptr())
                }
            }
            _ => self.borrowed(d.empty_attrs.as_ptr()),
        };
        let links = match sp.links.as_deref() {
            Some(raw) if !raw.is_empty() => self.links(raw)?,
            // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token);
            // `Owned::new` checks for NULL.
            _ => Owned::new(py, unsafe { ffi::PyTuple_New(0) })?,
        };
        let fields = [
            self.interned(&sp.trace_id)?,
            self.span_id(&sp.span_id)?,
            match parent {
                Some(p) => self.span_id(p)?,
                // SAFETY: `Py_None` is the immortal `None` singleton; `borrowed` adds a reference.
                None => self.borrowed(unsafe { ffi::Py_None() }),
            },
            self.interned(&sp.name)?,
            // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token);
            // `Owned::new` checks for NULL.
            Owned::new(py, unsafe { ffi::PyLong_FromLongLong(start) })?,
            // SAFETY: as the line above.
            Owned::new(py, unsafe { ffi::PyLong_FromLongLong(end) })?,
            self.borrowed(d.kinds[kind].as_ptr()),
            self.borrowed(d.statuses[code].as_ptr()),
            attrs,
            links,
            self.borrowed(service),
            self.borrowed(resource),
        ];
        self.new_tuple(d.span_type.as_ptr(), fields)
    }

    /// An engine-side span into the table, with the checks and values of [`Ctx::span`].
    fn table_span(
        &self,
        t: &mut table::Data,
        sp: &'doc RawSpan<'doc>,
        name: u8,
        resource: u32,
        before: u64,
    ) -> Result<(), Fail> {
        let (parent, start, end, kind, code) = header(sp)?;
        let first_attr = t.attrs.len();
        for kv in sp.attributes.as_deref().unwrap_or_default() {
            let v = &kv.value;
            if v.python_only() {
                return Err(Fail::Decline);
            }
            let value = match (table_scalar(t, v)?, &v.array) {
                (Some(x), _) => x,
                (None, Some(arr)) => {
                    let values = arr.values.as_deref().unwrap_or_default();
                    let at = t.elems.len() as u32;
                    for e in values {
                        if e.python_only_element() {
                            return Err(Fail::Decline);
                        }
                        let x = table_scalar(t, e)?.unwrap_or(table::Val::Nothing);
                        t.elems.push(x);
                    }
                    table::Val::Array(at, values.len() as u32)
                }
                (None, None) => continue,
            };
            let key = t.strings.id(&kv.key);
            t.attrs.push((key, value));
        }
        let first_link = t.links.len();
        for ln in sp.links.as_deref().unwrap_or_default() {
            if !ln.ids_ok() {
                return Err(Fail::Decline);
            }
            let trace = t.strings.id(&ln.trace_id);
            t.links.push((trace, table::pack_id(&ln.span_id)));
        }
        let (n_attrs, n_links) = (t.attrs.len() - first_attr, t.links.len() - first_link);
        if n_attrs > usize::from(u16::MAX) || n_links > usize::from(u16::MAX) {
            return Err(Fail::Decline);
        }
        let trace = t.strings.id(&sp.trace_id);
        t.spans.push(table::TSpan {
            id: table::pack_id(&sp.span_id),
            parent: parent.map_or(table::NO_ID, table::pack_id),
            start,
            end,
            before,
            trace,
            resource,
            attrs: first_attr as u32,
            links: first_link as u32,
            n_attrs: n_attrs as u16,
            n_links: n_links as u16,
            name,
            kind: kind as u8,
            status: code as u8,
        });
        Ok(())
    }

    fn links(&self, raw: &'doc [Obj<RawLink<'doc>>]) -> Result<Owned, Fail> {
        let py = self.py;
        if raw.iter().any(|ln| !ln.ids_ok()) {
            return Err(Fail::Decline);
        }
        // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token); NULL
        // is checked, and every slot is filled below before the tuple is used.
        let tuple = Owned::new(py, unsafe {
            ffi::PyTuple_New(raw.len() as ffi::Py_ssize_t)
        })?;
        for (i, ln) in raw.iter().enumerate() {
            let fields = [self.interned(&ln.trace_id)?, self.text(&ln.span_id)?];
            let link = self.new_tuple(self.decoder.link_type.as_ptr(), fields)?;
            // SAFETY: `i` is below the length of this fresh tuple; the slot is empty and takes over
            // `link`'s reference.
            unsafe { ffi::PyTuple_SET_ITEM(tuple.0, i as ffi::Py_ssize_t, link.into_raw()) };
        }
        Ok(tuple)
    }

    /// A new instance of the named-tuple class `cls` holding `fields` (references stolen).
    fn new_tuple<const N: usize>(
        &self,
        cls: *mut ffi::PyObject,
        fields: [Owned; N],
    ) -> Result<Owned, Fail> {
        let obj = named_tuple::new(self.py, cls, fields.into_iter().map(Owned::into_raw));
        Ok(Owned(obj.map_err(Fail::Py)?.into_ptr()))
    }

    /// `otlp._attributes`: keys interned, strings under 64 characters interned,
    /// a value with no known key left out; later duplicates win, as in a dict.
    fn attributes(&self, raw: &'doc [Obj<KeyValue<'doc>>]) -> Result<Owned, Fail> {
        let py = self.py;
        // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token);
        // `Owned::new` checks for NULL.
        let dict = Owned::new(py, unsafe { ffi::PyDict_New() })?;
        for kv in raw {
            let v = &kv.value;
            if v.python_only() {
                return Err(Fail::Decline);
            }
            let value = match (self.scalar(v, true)?, &v.array) {
                (Some(value), _) => value,
                (None, Some(arr)) => self.array(arr)?,
                (None, None) => continue,
            };
            let key = self.interned(&kv.key)?;
            // SAFETY: `dict`, `key` and `value` are live; `PyDict_SetItem` takes its own
            // references.
            if unsafe { ffi::PyDict_SetItem(dict.0, key.0, value.0) } != 0 {
                return Err(Fail::Py(PyErr::fetch(py)));
            }
        }
        Ok(dict)
    }

    /// `otlp._array`: a tuple of the elements' values (`None` for an element with no key).
    fn array(&self, arr: &'doc ArrayValue<'doc>) -> Result<Owned, Fail> {
        let py = self.py;
        let values = arr.values.as_deref().unwrap_or_default();
        // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token); NULL
        // is checked, and every slot is filled below before the tuple is used.
        let tuple = Owned::new(py, unsafe {
            ffi::PyTuple_New(values.len() as ffi::Py_ssize_t)
        })?;
        for (i, e) in values.iter().enumerate() {
            if e.python_only_element() {
                return Err(Fail::Decline);
            }
            let value = match self.scalar(e, false)? {
                Some(value) => value,
                // SAFETY: `Py_None` is the immortal `None` singleton; `borrowed` adds a reference.
                None => self.borrowed(unsafe { ffi::Py_None() }),
            };
            // SAFETY: `i` is below the length of this fresh tuple; the slot is empty and takes over
            // `value`'s reference.
            unsafe { ffi::PyTuple_SET_ITEM(tuple.0, i as ffi::Py_ssize_t, value.into_raw()) };
        }
        Ok(tuple)
    }

    /// The string, int, double or bool of an `AnyValue` (`None` when it has none of them).
    /// `intern_short`: strings under 64 characters are interned, as attribute values are.
    fn scalar<A>(
        &self,
        v: &'doc AnyValue<'doc, A>,
        intern_short: bool,
    ) -> Result<Option<Owned>, Fail> {
        let py = self.py;
        Ok(Some(if let Some(s) = &v.string {
            if intern_short && (s.len() < 64 || s.chars().count() < 64) {
                self.interned(s)?
            } else {
                self.text(s)?
            }
        } else if let Some(i) = &v.int {
            // SAFETY: the GIL is held (a `Ctx` lives inside `spans_from_line`'s `Python` token);
            // `Owned::new` checks for NULL.
            Owned::new(py, unsafe { ffi::PyLong_FromLongLong(i.to_i64()?) })?
        } else if let Some(x) = v.double {
            // SAFETY: as above.
            Owned::new(py, unsafe { ffi::PyFloat_FromDouble(x) })?
        } else if let Some(b) = v.boolean {
            self.boolean(b)
        } else {
            return Ok(None);
        }))
    }

    fn boolean(&self, b: bool) -> Owned {
        // SAFETY: `Py_True` and `Py_False` are immortal singletons; `borrowed` adds a reference.
        self.borrowed(unsafe {
            if b {
                ffi::Py_True()
            } else {
                ffi::Py_False()
            }
        })
    }

    fn borrowed(&self, p: *mut ffi::PyObject) -> Owned {
        // SAFETY: `p` is a live object the caller holds a reference to.
        unsafe { ffi::Py_INCREF(p) };
        Owned(p)
    }

    fn text(&self, s: &str) -> Result<Owned, Fail> {
        // SAFETY: `s` is valid UTF-8 of exactly `s.len()` bytes; the GIL is held (a `Ctx` lives
        // inside `spans_from_line`'s `Python` token); `Owned::new` checks for NULL.
        Owned::new(self.py, unsafe {
            ffi::PyUnicode_FromStringAndSize(s.as_ptr().cast(), s.len() as ffi::Py_ssize_t)
        })
    }

    fn span_id(&self, s: &'doc str) -> Result<Owned, Fail> {
        if let Some(p) = self.ids.borrow().get(s) {
            return Ok(self.borrowed(p.0));
        }
        let id = self.text(s)?;
        self.ids.borrow_mut().insert(s, self.borrowed(id.0));
        Ok(id)
    }

    /// `strings.setdefault(s, s)`: the one copy every span shares.
    fn interned(&self, s: &'doc str) -> Result<Owned, Fail> {
        if let Some(&p) = self.seen.borrow().get(s) {
            return Ok(self.borrowed(p));
        }
        let kept = self.intern_object(self.text(s)?)?;
        self.seen.borrow_mut().insert(s, kept.0);
        Ok(kept)
    }

    fn intern_object(&self, s: Owned) -> Result<Owned, Fail> {
        // SAFETY: `self.strings` is the caller's interning dict (kept alive by its `Bound` for the
        // call) and `s` a live `str`; the result is borrowed or NULL.
        let kept = unsafe { ffi::PyDict_SetDefault(self.strings, s.0, s.0) };
        if kept.is_null() {
            return Err(Fail::Py(PyErr::fetch(self.py)));
        }
        Ok(self.borrowed(kept))
    }
}

/// [`Ctx::scalar`] for the table.
fn table_scalar<A>(t: &mut table::Data, v: &AnyValue<'_, A>) -> Result<Option<table::Val>, Fail> {
    Ok(Some(if let Some(s) = &v.string {
        table::Val::Str(t.strings.id(s))
    } else if let Some(i) = &v.int {
        table::Val::Int(i.to_i64()?)
    } else if let Some(x) = v.double {
        table::Val::Float(x)
    } else if let Some(b) = v.boolean {
        table::Val::Bool(b)
    } else {
        return Ok(None);
    }))
}

/// The text of a Python `str` (`Ctx::service` always gives one).
fn py_text(s: &Bound<'_, PyAny>) -> Result<String, Fail> {
    let text = s
        .cast::<PyString>()
        .map_err(|e| Fail::Py(e.into()))?
        .to_str();
    Ok(text.map_err(Fail::Py)?.to_owned())
}

/// The checks and fields every span shares (they mirror `otlp._span`: where the
/// generic path would normalise, record a warning or raise, decline): parent id, start,
/// end, kind index, status index.
#[allow(clippy::type_complexity)]
fn header<'doc>(
    sp: &'doc RawSpan<'doc>,
) -> Result<(Option<&'doc str>, i64, i64, usize, usize), Fail> {
    if !is_id(&sp.trace_id, 32) || !is_id(&sp.span_id, 16) {
        return Err(Fail::Decline);
    }
    let parent = match sp.parent.as_deref() {
        None | Some("") => None,
        Some(p) if is_id(p, 16) => Some(p),
        Some(_) => return Err(Fail::Decline),
    };
    let (start, end) = (sp.start.to_i64()?, sp.end.to_i64()?);
    if start > end {
        return Err(Fail::Decline);
    }
    let kind = match &sp.kind {
        None => 1,
        Some(IntOrStr::Int(k)) if (0..6).contains(k) => *k as usize,
        Some(IntOrStr::Str(s)) => KIND_NAMES
            .iter()
            .position(|n| *n == s.as_ref())
            .ok_or(Fail::Decline)?,
        Some(_) => return Err(Fail::Decline),
    };
    let code = match sp.status.as_ref().and_then(|st| st.code.as_ref()) {
        None => 0,
        Some(IntOrStr::Int(c)) if (0..3).contains(c) => *c as usize,
        Some(IntOrStr::Int(_)) => 0,
        Some(IntOrStr::Str(s)) => STATUS_NAMES
            .iter()
            .position(|n| *n == s.as_ref())
            .unwrap_or(0),
    };
    Ok((parent, start, end, kind, code))
}

/// A trace or span id the Python paths take as it is: exactly `len` ASCII characters
/// (they count characters; for ASCII that is the byte length).
fn is_id(s: &str, len: usize) -> bool {
    s.len() == len && s.is_ascii()
}

mod asgi_send;
mod chrome;
mod critical_path;
mod gpu_idle;
mod named_tuple;
mod otlp_json;
mod scan;
mod step_counter;
mod table;
mod tokenizer_method;

#[pymodule]
fn llmtrace_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Bump with ABI_VERSION in llmtrace/_native.py when a signature changes: a
    // build from another version is then ignored instead of called wrongly.
    m.add("ABI_VERSION", 11)?;
    m.add_class::<Decoder>()?;
    m.add_class::<table::EngineTable>()?;
    m.add_class::<table::GapSet>()?;
    m.add_class::<chrome::ChromeTraceEvents>()?;
    m.add_class::<otlp_json::OtlpJsonEncoder>()?;
    m.add_class::<step_counter::StepCounter>()?;
    m.add_function(wrap_pyfunction!(asgi_send::asgi_send, m)?)?;
    m.add("TokenizerMethod", tokenizer_method::method_type(m.py())?)?;
    m.add_function(wrap_pyfunction!(tokenizer_method::tokenizer_method, m)?)?;
    m.add_function(wrap_pyfunction!(
        tokenizer_method::tokenizer_passing_through,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(gpu_idle::classify_gaps, m)?)?;
    m.add_function(wrap_pyfunction!(critical_path::critical_path, m)?)?;
    m.add_function(wrap_pyfunction!(critical_path::path_totals, m)?)?;
    m.add_function(wrap_pyfunction!(scan::scans, m)?)?;
    Ok(())
}
