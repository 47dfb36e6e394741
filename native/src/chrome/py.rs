//! What the Chrome trace writer reads from Python objects: strings by code point, `str()`
//! and `format()` of any value, mapping lookups, and attribute values as msgspec's JSON
//! encoder writes them (with the Python encoder itself for any type it does not know).

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::text::{push_ascii_escaped_code_points, push_i128, push_msgspec_f64, push_utf8_quoted};

/// The code points of a Python string (a lone surrogate included), the first `limit`.
pub(crate) fn code_points<'a>(
    s: &'a Bound<'_, PyString>,
    limit: usize,
) -> impl Iterator<Item = u32> + 'a {
    let p = s.as_ptr();
    // SAFETY: `p` is a live `str` (a `Bound`, so the GIL is held), ready (every str is on
    // 3.12+; on 3.10/3.11 a str made by the C API or Python code is created ready); its
    // kind and data describe `len` code points, read only while `s` is borrowed.
    let (kind, data, len) = unsafe {
        (
            ffi::PyUnicode_KIND(p),
            ffi::PyUnicode_DATA(p),
            ffi::PyUnicode_GET_LENGTH(p) as usize,
        )
    };
    (0..len.min(limit)).map(move |i| {
        // SAFETY: `i` is below the string's length and `kind` is its storage width.
        unsafe {
            match kind {
                1 => u32::from(*data.cast::<u8>().add(i)),
                2 => u32::from(*data.cast::<u16>().add(i)),
                _ => *data.cast::<u32>().add(i),
            }
        }
    })
}

/// The first `limit` code points of `s` escaped as `json.dumps` escapes them (without the
/// quotes): [`push_ascii_escaped_code_points`] over [`code_points`], with runs that need no
/// escape copied whole when the string stores one byte per code point (attribute keys, span
/// names, ids: nearly every string a span holds) — one bounds-free byte test per code point
/// instead of the per-code-point width dispatch and push.
pub(crate) fn push_escaped_code_points(out: &mut Vec<u8>, s: &Bound<'_, PyString>, limit: usize) {
    let p = s.as_ptr();
    // SAFETY: as in `code_points`: a live, ready `str`, read only while `s` is borrowed.
    let (kind, data, len) = unsafe {
        (
            ffi::PyUnicode_KIND(p),
            ffi::PyUnicode_DATA(p),
            ffi::PyUnicode_GET_LENGTH(p) as usize,
        )
    };
    if kind != 1 {
        push_ascii_escaped_code_points(out, code_points(s, limit));
        return;
    }
    // SAFETY: a one-byte-kind string stores `len` code points as `len` bytes at `data`.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len.min(limit)) };
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        push_ascii_escaped_code_points(out, std::iter::once(u32::from(b)));
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `json.dumps(str(value))[1:-1]`, the first `limit` code points of it.
pub(crate) fn push_str_escaped(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    limit: usize,
) -> PyResult<()> {
    match value.cast::<PyString>() {
        Ok(s) if s.is_exact_instance_of::<PyString>() => push_escaped_code_points(out, s, limit),
        _ => push_escaped_code_points(out, &value.str()?, limit),
    }
    Ok(())
}

/// `json.dumps(f"{value}")[1:-1]`: as [`push_str_escaped`], through `format()`.
pub(crate) fn push_format_escaped(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(s) = value.cast_exact::<PyString>() {
        push_escaped_code_points(out, s, usize::MAX);
        return Ok(());
    }
    // SAFETY: `value` is live and the GIL is held; a NULL spec is format(value, "").
    let formatted = unsafe { ffi::PyObject_Format(value.as_ptr(), std::ptr::null_mut()) };
    if formatted.is_null() {
        return Err(PyErr::fetch(value.py()));
    }
    // SAFETY: `formatted` is a new non-null reference, taken over here.
    let formatted = unsafe { Bound::from_owned_ptr(value.py(), formatted) };
    let s = formatted
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err("__format__ must return a str"))?;
    push_escaped_code_points(out, s, usize::MAX);
    Ok(())
}

/// `str(value)` as text (exact strings borrowed).
pub(crate) fn str_of<'a>(value: &'a Bound<'_, PyAny>) -> PyResult<std::borrow::Cow<'a, str>> {
    if let Ok(s) = value.cast_exact::<PyString>() {
        return Ok(std::borrow::Cow::Borrowed(s.to_str()?));
    }
    Ok(std::borrow::Cow::Owned(value.str()?.to_str()?.to_owned()))
}

/// `mapping[key]` when the key is there (a `None` value included), else `None`: a dict
/// read in place, any other mapping (an empty one asked nothing) by item access.
pub(crate) fn get<'py>(
    mapping: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(d) = mapping.cast_exact::<PyDict>() {
        return d.get_item(key);
    }
    if mapping.len()? == 0 {
        return Ok(None);
    }
    match mapping.get_item(key) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(mapping.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `key in mapping`.
pub(crate) fn contains(mapping: &Bound<'_, PyAny>, key: &Bound<'_, PyString>) -> PyResult<bool> {
    if let Ok(d) = mapping.cast_exact::<PyDict>() {
        return d.contains(key);
    }
    mapping.contains(key)
}

/// Writes attribute values as msgspec's encoder does (`perfetto._encode_json`); the types
/// it does not take itself (an int beyond 64 bits, a str subclass, anything else) are
/// handed to that encoder, so the bytes are its own.
pub(crate) struct Json<'a, 'py> {
    pub(crate) encode: &'a Bound<'py, PyAny>,
}

impl<'py> Json<'_, 'py> {
    /// A dict's members without its opening brace, then its closing one (`encode(d)[1:]`).
    pub(crate) fn members(&self, out: &mut Vec<u8>, mapping: &Bound<'py, PyAny>) -> PyResult<()> {
        let mark = out.len();
        if let Ok(d) = mapping.cast_exact::<PyDict>() {
            if self.dict_members(out, d)? {
                return Ok(());
            }
        }
        out.truncate(mark);
        let encoded = self.encode.call1((mapping,))?;
        let bytes: &[u8] = encoded.extract()?;
        out.extend_from_slice(bytes.get(1..).unwrap_or_default());
        Ok(())
    }

    /// `false` (and some bytes written) when a key is not an exact `str`.
    fn dict_members(&self, out: &mut Vec<u8>, d: &Bound<'py, PyDict>) -> PyResult<bool> {
        let mut first = true;
        for (k, v) in d.iter() {
            let Ok(k) = k.cast_exact::<PyString>() else {
                return Ok(false);
            };
            if !first {
                out.push(b',');
            }
            first = false;
            match k.to_str() {
                Ok(text) => push_utf8_quoted(out, text),
                Err(_) => return Ok(false), // a lone surrogate: msgspec's own error
            }
            out.push(b':');
            self.value(out, &v)?;
        }
        out.push(b'}');
        Ok(true)
    }

    pub(crate) fn value(&self, out: &mut Vec<u8>, v: &Bound<'py, PyAny>) -> PyResult<()> {
        let p = v.as_ptr();
        // SAFETY: `p` is live (`v` is a `Bound`); the checks read its type only.
        let exact = unsafe {
            (
                ffi::PyUnicode_CheckExact(p) != 0,
                ffi::PyFloat_CheckExact(p) != 0,
                ffi::PyLong_CheckExact(p) != 0,
            )
        };
        match exact {
            (true, _, _) => {
                if let Ok(text) = v.cast_exact::<PyString>()?.to_str() {
                    push_utf8_quoted(out, text);
                    return Ok(());
                }
            }
            (_, true, _) => {
                // SAFETY: `p` is an exact float.
                push_msgspec_f64(out, unsafe { ffi::PyFloat_AS_DOUBLE(p) });
                return Ok(());
            }
            (_, _, true) => {
                let mut overflow = 0;
                // SAFETY: `p` is an exact int; overflow is reported, not raised.
                let n = unsafe { ffi::PyLong_AsLongLongAndOverflow(p, &mut overflow) };
                if overflow == 0 {
                    push_i128(out, i128::from(n));
                    return Ok(());
                }
            }
            _ => {
                if v.is_none() {
                    out.extend_from_slice(b"null");
                    return Ok(());
                }
                // SAFETY: `p` is live; `Py_True`/`Py_False` are the immortal singletons.
                if p == unsafe { ffi::Py_True() } {
                    out.extend_from_slice(b"true");
                    return Ok(());
                }
                // SAFETY: as above.
                if p == unsafe { ffi::Py_False() } {
                    out.extend_from_slice(b"false");
                    return Ok(());
                }
                if let Ok(t) = v.cast_exact::<pyo3::types::PyTuple>() {
                    out.push(b'[');
                    for (i, item) in t.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        self.value(out, &item)?;
                    }
                    out.push(b']');
                    return Ok(());
                }
                if let Ok(d) = v.cast_exact::<PyDict>() {
                    let mark = out.len();
                    out.push(b'{');
                    if d.is_empty() {
                        out.push(b'}');
                        return Ok(());
                    }
                    if self.dict_members(out, d)? {
                        return Ok(());
                    }
                    out.truncate(mark);
                }
            }
        }
        let encoded = self.encode.call1((v,))?;
        let bytes: &[u8] = encoded.extract()?;
        out.extend_from_slice(bytes);
        Ok(())
    }
}
