//! The tokenizer methods llmtrace puts in place of `encode`/`decode` (`integrations/_common.py`:
//! `_timed_tokenizer_method`), compiled for the calls that need nothing of llmtrace.
//!
//! A streamed response decodes once per token, through two patched methods (transformers'
//! `decode` calls the `tokenizers` one), and at production sampling nine requests in ten are
//! not sampled: the decode's time would land on no span, so the call only has to pass through.
//! Written in Python, each patched method is a frame that repacks `*args, **kwargs` (a dict per
//! call for `skip_special_tokens=True`), and asking whether anything records the decode is two
//! more frames (~13k instructions a streamed token at 0 % sampling on the reference server). The
//! method this module makes answers those cases without a Python frame:
//!
//! 1. a call nested in a tokenizer call llmtrace already handles (the `in_tokenizer` context
//!    variable is true) goes to `original` with the arguments as they came;
//! 2. a call that *observe* finds unobserved — the current request (`request_var`) is not
//!    recording, or else the current server scope's (`scope_var`) `recording` is false — goes
//!    to `original` with this thread's pass-through flag set around it, so that its nested calls
//!    pass through too (case 1 asks that flag first). A thread-local `Cell`, not `in_tokenizer`:
//!    the context variable's set and reset were 1.9k of the 3.0k instructions such a decode
//!    added (each makes and frees a context mapping), and a synchronous call cannot hand its
//!    thread to another context before it returns — except by switching greenlets inside the
//!    tokenizer, where a call of another greenlet would pass through unobserved until it does;
//! 3. a call that is observed — every user-level encode; a decode whose current request, or else
//!    server scope, is recording — goes to `timed`, the Python function that times and reports
//!    it (what the Python method calls for it too), with the pass-through flag set around it as
//!    in case 2: the calls nested in it pass through, and `timed` sets no flag of its own.
//!    Except the common one of them, a streamed token of a sampled request (sixteen in a 16-token
//!    stream): a decode method made with `failed` times the call itself and adds its duration to
//!    the request it belongs to, which is all `timed` would do with it (`_decode_reporting`),
//!    without its frame (which repacks the arguments) and the three below it. That request is the
//!    current one when it records; with no request current, the recording server scope's last
//!    open request, unless the scope defers a request's end (then, and when it has no open
//!    request, `timed` decides). A call that raises an `Exception` is reported through
//!    `failed(elapsed_ns, exception, tokenizer, *args, **kwargs)` (the failed decode's span)
//!    before the exception goes on to the caller; an interrupt is not reported;
//! 4. everything else goes to `fallback`, the Python method itself (the reference, which decides
//!    again): a decode with neither a request nor a scope current, and any error while looking
//!    (the Python method then decides, and counts the error).
//!
//! Binding: the object put on the class is a `TokenizerMethod`, a type made here with the C API
//! (pyo3's classes cannot be called by vectorcall) that binds as Python functions do: it is a
//! method descriptor (`Py_TPFLAGS_METHOD_DESCRIPTOR`), so `tokenizer.decode(ids)` calls it with
//! the instance as its first argument and the caller's arguments untouched, with no bound method
//! made per call; `__get__` makes one for any other access (`f = tokenizer.decode`). It carries a
//! `__dict__` for `functools.update_wrapper` (`__wrapped__`, `__name__`, ...) and llmtrace's patch
//! marker. Its call makes only C-API calls, none of which can panic, and it never turns the
//! tokenizer's exception (a pyo3 `PanicException` included) into anything else.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

extern "C" {
    /// CPython's bound-method constructor (`types.MethodType(func, self)`), not in pyo3-ffi.
    fn PyMethod_New(func: *mut ffi::PyObject, self_: *mut ffi::PyObject) -> *mut ffi::PyObject;
}

/// A `TokenizerMethod`'s memory: the object header, then what the type's members and calls read.
/// Every object pointer is a strong reference, NULL only for an absent `observe` (and after a
/// clear by the cycle collector).
#[repr(C)]
struct RawMethod {
    ob_base: ffi::PyObject,
    /// The call (`__vectorcalloffset__` points here).
    vectorcall: Option<ffi::vectorcallfunc>,
    /// The instance `__dict__` (`__dictoffset__` points here).
    dict: *mut ffi::PyObject,
    /// The tokenizer's own method.
    original: *mut ffi::PyObject,
    /// The Python function that times and reports an observed call (`_timed_tokenizer_method`'s).
    timed: *mut ffi::PyObject,
    /// The Python method this one short-cuts (`_timed_tokenizer_method`'s), for every other call.
    fallback: *mut ffi::PyObject,
    /// `ContextVar[bool]`: true while a tokenizer call llmtrace handles runs.
    in_tokenizer: *mut ffi::PyObject,
    /// `ContextVar[RequestHandle | None]`, for a method timed only when observed (decodes); NULL
    /// for one whose user-level calls are all timed (encodes).
    request_var: *mut ffi::PyObject,
    /// `ContextVar[ServerScope | None]`, NULL with `request_var`.
    scope_var: *mut ffi::PyObject,
    /// For a decode timed here when its request records (case 3 of the module docs): reports a
    /// failed call; NULL where every observed call goes to `timed`.
    failed: *mut ffi::PyObject,
}

/// The type object and the interned attribute names, made once per process.
struct MadeOnce {
    kind: Py<PyType>,
    recording: Py<PyString>,
    detokenize_ns: Py<PyString>,
    deferred: Py<PyString>,
    handles: Py<PyString>,
    finish_ns: Py<PyString>,
}

static MADE: OnceLock<MadeOnce> = OnceLock::new();

/// `Sync` wrappers for the tables CPython reads (never writes) through the pointers it is given.
struct Members([ffi::PyMemberDef; 3]);
// SAFETY: immutable after construction; holds pointers to 'static data only.
unsafe impl Sync for Members {}
struct GetSets([ffi::PyGetSetDef; 2]);
// SAFETY: as Members.
unsafe impl Sync for GetSets {}

static MEMBERS: Members = Members([
    ffi::PyMemberDef {
        name: c"__vectorcalloffset__".as_ptr(),
        type_code: ffi::Py_T_PYSSIZET,
        offset: std::mem::offset_of!(RawMethod, vectorcall) as ffi::Py_ssize_t,
        flags: ffi::Py_READONLY,
        doc: std::ptr::null(),
    },
    ffi::PyMemberDef {
        name: c"__dictoffset__".as_ptr(),
        type_code: ffi::Py_T_PYSSIZET,
        offset: std::mem::offset_of!(RawMethod, dict) as ffi::Py_ssize_t,
        flags: ffi::Py_READONLY,
        doc: std::ptr::null(),
    },
    ffi::PyMemberDef {
        name: std::ptr::null(),
        type_code: 0,
        offset: 0,
        flags: 0,
        doc: std::ptr::null(),
    },
]);

static GETSETS: GetSets = GetSets([
    ffi::PyGetSetDef {
        name: c"__dict__".as_ptr(),
        get: Some(ffi::PyObject_GenericGetDict),
        set: Some(ffi::PyObject_GenericSetDict),
        doc: std::ptr::null(),
        closure: null_mut(),
    },
    ffi::PyGetSetDef {
        name: std::ptr::null(),
        get: None,
        set: None,
        doc: std::ptr::null(),
        closure: null_mut(),
    },
]);

fn made_once(py: Python<'_>) -> PyResult<&'static MadeOnce> {
    if let Some(found) = MADE.get() {
        return Ok(found);
    }
    let mut slots = [
        slot(ffi::Py_tp_dealloc, dealloc as *mut c_void),
        slot(ffi::Py_tp_traverse, traverse as *mut c_void),
        slot(ffi::Py_tp_clear, clear as *mut c_void),
        slot(ffi::Py_tp_descr_get, descr_get as *mut c_void),
        slot(ffi::Py_tp_call, ffi::PyVectorcall_Call as *mut c_void),
        slot(
            ffi::Py_tp_members,
            std::ptr::addr_of!(MEMBERS.0).cast_mut().cast(),
        ),
        slot(
            ffi::Py_tp_getset,
            std::ptr::addr_of!(GETSETS.0).cast_mut().cast(),
        ),
        slot(
            ffi::Py_tp_doc,
            c"A tokenizer method under llmtrace's tokenizer integration (tokenizer_method)."
                .as_ptr()
                .cast_mut()
                .cast(),
        ),
        slot(0, null_mut()),
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"llmtrace_native.TokenizerMethod".as_ptr(),
        basicsize: std::mem::size_of::<RawMethod>() as c_int,
        itemsize: 0,
        flags: (ffi::Py_TPFLAGS_DEFAULT
            | ffi::Py_TPFLAGS_HAVE_GC
            | ffi::Py_TPFLAGS_HAVE_VECTORCALL
            | ffi::Py_TPFLAGS_METHOD_DESCRIPTOR) as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and its slots are valid for the call (CPython copies what it keeps; the
    // member and getset tables it points into are static); a new reference or NULL with an error.
    let kind = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&mut spec))? };
    let made = MadeOnce {
        kind: kind.cast_into::<PyType>()?.unbind(),
        recording: PyString::intern(py, "recording").unbind(),
        detokenize_ns: PyString::intern(py, "detokenize_ns").unbind(),
        deferred: PyString::intern(py, "deferred").unbind(),
        handles: PyString::intern(py, "handles").unbind(),
        finish_ns: PyString::intern(py, "finish_ns").unbind(),
    };
    // Another thread may have made them first (the GIL is released nowhere above, but be exact).
    Ok(MADE.get_or_init(|| made))
}

fn slot(slot: c_int, pfunc: *mut c_void) -> ffi::PyType_Slot {
    ffi::PyType_Slot { slot, pfunc }
}

/// The type of the objects `tokenizer_method` makes, for the module to export.
pub(crate) fn method_type(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    Ok(made_once(py)?.kind.bind(py).clone())
}

/// The method put in place of a tokenizer's *original*: see the module docstring. *observe* is
/// `(request_var, scope_var)` for a method timed only when observed, else `None`; *failed*, for
/// such a method (a decode), makes it time a call of a recording request itself.
#[pyfunction]
#[pyo3(signature = (original, timed, fallback, in_tokenizer, observe=None, failed=None))]
pub(crate) fn tokenizer_method<'py>(
    py: Python<'py>,
    original: Bound<'py, PyAny>,
    timed: Bound<'py, PyAny>,
    fallback: Bound<'py, PyAny>,
    in_tokenizer: Bound<'py, PyAny>,
    observe: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    failed: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if !original.is_callable() || !timed.is_callable() || !fallback.is_callable() {
        return Err(PyTypeError::new_err(
            "tokenizer_method: original, timed and fallback must be callable",
        ));
    }
    if let Some(failed) = &failed {
        if observe.is_none() || !failed.is_callable() {
            return Err(PyTypeError::new_err(
                "tokenizer_method: failed must be callable, and given with observe",
            ));
        }
    }
    let kind = made_once(py)?.kind.bind(py);
    // SAFETY: `kind` is the type made above (a GC type of RawMethod's size); GenericAlloc returns
    // a zeroed, tracked object with a reference to its type, or NULL with an error. Every field
    // written below takes a new reference.
    unsafe {
        let object =
            Bound::from_owned_ptr_or_err(py, ffi::PyType_GenericAlloc(kind.as_ptr().cast(), 0))?;
        let raw = object.as_ptr().cast::<RawMethod>();
        (*raw).vectorcall = Some(call);
        (*raw).original = original.into_ptr();
        (*raw).timed = timed.into_ptr();
        (*raw).fallback = fallback.into_ptr();
        (*raw).in_tokenizer = in_tokenizer.into_ptr();
        if let Some((request_var, scope_var)) = observe {
            (*raw).request_var = request_var.into_ptr();
            (*raw).scope_var = scope_var.into_ptr();
        }
        if let Some(failed) = failed {
            (*raw).failed = failed.into_ptr();
        }
        Ok(object)
    }
}

/// `instance.method` without a call: a bound method (`Class.method`: the method itself).
unsafe extern "C" fn descr_get(
    slf: *mut ffi::PyObject,
    instance: *mut ffi::PyObject,
    _owner: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython passes valid objects (the instance NULL or None for a class access).
    unsafe {
        if instance.is_null() || instance == ffi::Py_None() {
            ffi::Py_INCREF(slf);
            return slf;
        }
        PyMethod_New(slf, instance)
    }
}

unsafe extern "C" fn traverse(
    slf: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: `slf` is a RawMethod; every non-NULL field is a valid object it owns; its type is
    // a heap type, which the object references and must visit too.
    unsafe {
        let raw = slf.cast::<RawMethod>();
        for field in [
            (*raw).dict,
            (*raw).original,
            (*raw).timed,
            (*raw).fallback,
            (*raw).in_tokenizer,
            (*raw).request_var,
            (*raw).scope_var,
            (*raw).failed,
            ffi::Py_TYPE(slf).cast(),
        ] {
            if !field.is_null() {
                let found = visit(field, arg);
                if found != 0 {
                    return found;
                }
            }
        }
        0
    }
}

unsafe extern "C" fn clear(slf: *mut ffi::PyObject) -> c_int {
    // SAFETY: `slf` is a RawMethod; each field is set to NULL before its reference is released
    // (a release may run code that reaches this object again).
    unsafe {
        let raw = slf.cast::<RawMethod>();
        for field in [
            &mut (*raw).dict,
            &mut (*raw).original,
            &mut (*raw).timed,
            &mut (*raw).fallback,
            &mut (*raw).in_tokenizer,
            &mut (*raw).request_var,
            &mut (*raw).scope_var,
            &mut (*raw).failed,
        ] {
            let old = std::mem::replace(field, null_mut());
            ffi::Py_XDECREF(old);
        }
        0
    }
}

unsafe extern "C" fn dealloc(slf: *mut ffi::PyObject) {
    // SAFETY: the object is dying (no other reference): untracked first, its fields released, its
    // memory freed by its type's tp_free, then the reference to its heap type dropped.
    unsafe {
        ffi::PyObject_GC_UnTrack(slf.cast());
        clear(slf);
        let kind = ffi::Py_TYPE(slf);
        let free = ffi::PyType_GetSlot(kind, ffi::Py_tp_free);
        let free: ffi::freefunc = std::mem::transmute(free);
        free(slf.cast());
        ffi::Py_DECREF(kind.cast());
    }
}

/// The call: `slf` is the RawMethod, `args[..nargs]` the positional arguments (the tokenizer
/// first) and `kwnames` the names of the keyword ones after them. Returns a new reference, or NULL
/// with the callee's exception set.
unsafe extern "C" fn call(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls with the GIL held (attached) and `slf` a live RawMethod; its fields are
    // valid objects it owns (NULL only after the cycle collector cleared it: checked below), and
    // the arguments are the caller's, borrowed for the call and forwarded exactly as they came
    // (the offset flag included: the same buffer).
    unsafe {
        let raw = &*slf.cast::<RawMethod>();
        if raw.original.is_null()
            || raw.timed.is_null()
            || raw.fallback.is_null()
            || raw.in_tokenizer.is_null()
        {
            ffi::PyErr_SetString(
                ffi::PyExc_RuntimeError,
                c"llmtrace tokenizer method used after it was cleared".as_ptr(),
            );
            return null_mut();
        }
        if PASSING_THROUGH.get() {
            return ffi::PyObject_Vectorcall(raw.original, args, nargsf, kwnames);
        }
        match flag_set(raw.in_tokenizer) {
            None => return null_mut(),
            Some(true) => return ffi::PyObject_Vectorcall(raw.original, args, nargsf, kwnames),
            Some(false) => {}
        }
        let made = MADE.get();
        let observed = if raw.request_var.is_null() || raw.scope_var.is_null() {
            Observed::Yes // a method whose user-level calls are all timed
        } else {
            match made {
                Some(found) => observed(raw.request_var, raw.scope_var, found.recording.as_ptr()),
                None => Observed::Unknown,
            }
        };
        // Where this method times a recorded call itself (a decode made with `failed`, case 3).
        let timing = if raw.failed.is_null() { None } else { made };
        let callee = match observed {
            Observed::Request(request) => match timing {
                Some(found) => return timed_here(raw, request, found, args, nargsf, kwnames),
                None => {
                    ffi::Py_DECREF(request);
                    raw.timed
                }
            },
            Observed::Scope(scope) => {
                let request = timing.map_or(null_mut(), |found| streaming_request(scope, found));
                ffi::Py_DECREF(scope);
                match timing {
                    Some(found) if !request.is_null() => {
                        return timed_here(raw, request, found, args, nargsf, kwnames);
                    }
                    _ => raw.timed,
                }
            }
            Observed::Yes => raw.timed,
            Observed::Unknown => {
                return ffi::PyObject_Vectorcall(raw.fallback, args, nargsf, kwnames)
            }
            Observed::No => raw.original,
        };
        // Restoring the flag touches no Python state: the callee's result or exception (a pyo3
        // `PanicException` included) reaches the caller exactly as it came.
        let outer = PASSING_THROUGH.replace(true);
        let result = ffi::PyObject_Vectorcall(callee, args, nargsf, kwnames);
        PASSING_THROUGH.set(outer);
        result
    }
}

thread_local! {
    /// Set while this thread runs a call this module passed on: unobserved to `original`, or
    /// observed to `timed` (cases 2 and 3 of the module docs).
    static PASSING_THROUGH: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside a tokenizer call a method of this module passed on (so a nested
/// call of any llmtrace tokenizer method now passes straight through): for tests and diagnostics.
#[pyfunction]
pub(crate) fn tokenizer_passing_through() -> bool {
    PASSING_THROUGH.get()
}

/// The context variable's truth: `Some(value is True)`, or `None` with an exception set.
unsafe fn flag_set(var: *mut ffi::PyObject) -> Option<bool> {
    let mut value: *mut ffi::PyObject = null_mut();
    // SAFETY: a valid ContextVar with the GIL held; `value` receives a new reference (or NULL
    // when the variable has no value and no default).
    unsafe {
        if ffi::PyContextVar_Get(var, null_mut(), &mut value) < 0 {
            return None;
        }
        if value.is_null() {
            return Some(false);
        }
        let set = value == ffi::Py_True();
        ffi::Py_DECREF(value);
        Some(set)
    }
}

/// What [`observed`] found.
enum Observed {
    /// The current request records: a new reference to it.
    Request(*mut ffi::PyObject),
    /// No request is current and the current server scope records: a new reference to it.
    Scope(*mut ffi::PyObject),
    /// The method times every call.
    Yes,
    /// The current request, or else server scope, does not record.
    No,
    /// Not known here: neither is current, or reading them failed (the error is cleared, and the
    /// Python method, which asks again, decides and counts it).
    Unknown,
}

/// Whether the call lands on a recording span: the current request's `recording`, or, with no
/// request current, the current server scope's.
unsafe fn observed(
    request_var: *mut ffi::PyObject,
    scope_var: *mut ffi::PyObject,
    recording: *mut ffi::PyObject,
) -> Observed {
    // SAFETY: valid objects with the GIL held (the caller's contract); every new reference is
    // released before returning, but the recording request's, which the caller owns.
    unsafe {
        for var in [request_var, scope_var] {
            let mut current: *mut ffi::PyObject = null_mut();
            if ffi::PyContextVar_Get(var, ffi::Py_None(), &mut current) < 0 {
                ffi::PyErr_Clear();
                return Observed::Unknown;
            }
            if current.is_null() || current == ffi::Py_None() {
                ffi::Py_XDECREF(current);
                continue;
            }
            let value = ffi::PyObject_GetAttr(current, recording);
            if value.is_null() {
                ffi::Py_DECREF(current);
                ffi::PyErr_Clear();
                return Observed::Unknown;
            }
            let truth = ffi::PyObject_IsTrue(value);
            ffi::Py_DECREF(value);
            if truth <= 0 {
                ffi::Py_DECREF(current);
            }
            return match truth {
                0 => Observed::No,
                1.. if var == request_var => Observed::Request(current),
                1.. => Observed::Scope(current),
                _ => {
                    ffi::PyErr_Clear();
                    Observed::Unknown
                }
            };
        }
        Observed::Unknown
    }
}

/// The request a decode in the recording server scope *scope* belongs to, as `_decode_reporting`
/// finds it: the scope's last open request (`finish_ns` is None), unless the scope defers a
/// request's end. A new reference, or NULL (no exception set) where `timed` must decide.
unsafe fn streaming_request(scope: *mut ffi::PyObject, made: &MadeOnce) -> *mut ffi::PyObject {
    // SAFETY: a live object with the GIL held; new references released, the found request's
    // excepted, and every error cleared (`timed`, which asks again, then decides and counts it).
    unsafe {
        let deferred = ffi::PyObject_GetAttr(scope, made.deferred.as_ptr());
        if deferred.is_null() {
            ffi::PyErr_Clear();
            return null_mut();
        }
        let defers = ffi::PyObject_IsTrue(deferred);
        ffi::Py_DECREF(deferred);
        if defers != 0 {
            ffi::PyErr_Clear(); // (an error reading it: -1)
            return null_mut();
        }
        let handles = ffi::PyObject_GetAttr(scope, made.handles.as_ptr());
        if handles.is_null() {
            ffi::PyErr_Clear();
            return null_mut();
        }
        let mut found = null_mut();
        if ffi::PyList_CheckExact(handles) != 0 {
            let mut index = ffi::PyList_GET_SIZE(handles);
            while index > 0 {
                index -= 1;
                // Held while its attribute is read: reading may run code that changes the list.
                let handle = ffi::PyList_GET_ITEM(handles, index);
                ffi::Py_INCREF(handle);
                let finish = ffi::PyObject_GetAttr(handle, made.finish_ns.as_ptr());
                if finish.is_null() {
                    ffi::Py_DECREF(handle);
                    ffi::PyErr_Clear();
                    break;
                }
                let open = finish == ffi::Py_None();
                ffi::Py_DECREF(finish);
                if open {
                    found = handle;
                    break;
                }
                ffi::Py_DECREF(handle);
                index = index.min(ffi::PyList_GET_SIZE(handles)); // (shorter now, if that code shrank it)
            }
        }
        ffi::Py_DECREF(handles);
        found
    }
}

/// Case 3's common call, timed here: `original` with the pass-through flag set around it, its
/// duration added to *request*'s `detokenize_ns` (whose reference this consumes); a failed call
/// reported through `failed`. Returns what `original` returned, or NULL with its exception.
unsafe fn timed_here(
    raw: &RawMethod,
    request: *mut ffi::PyObject,
    made: &MadeOnce,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: the caller's contract (GIL held, live objects, the caller's arguments); every new
    // reference made here is released before returning, the result's excepted.
    unsafe {
        let start = Instant::now();
        let outer = PASSING_THROUGH.replace(true);
        let result = ffi::PyObject_Vectorcall(raw.original, args, nargsf, kwnames);
        PASSING_THROUGH.set(outer);
        let elapsed = i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX);
        if result.is_null() {
            ffi::Py_DECREF(request);
            if ffi::PyErr_ExceptionMatches(ffi::PyExc_Exception) != 0 {
                report_failure(raw.failed, elapsed, args, nargsf, kwnames);
            }
            return result;
        }
        add_duration(request, made.detokenize_ns.as_ptr(), elapsed);
        ffi::Py_DECREF(request);
        result
    }
}

/// `request.detokenize_ns += elapsed`, what `RequestHandle.detokenized` does. Never the host's
/// error: a failure is cleared (the attribute is a slot of an int that only llmtrace writes).
unsafe fn add_duration(request: *mut ffi::PyObject, name: *mut ffi::PyObject, elapsed: i64) {
    // SAFETY: live objects with the GIL held, no exception set; new references released.
    unsafe {
        let total = ffi::PyObject_GetAttr(request, name);
        if total.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        let duration = ffi::PyLong_FromLongLong(elapsed);
        let sum = if duration.is_null() {
            null_mut()
        } else {
            ffi::PyNumber_Add(total, duration)
        };
        ffi::Py_DECREF(total);
        ffi::Py_XDECREF(duration);
        if sum.is_null() || ffi::PyObject_SetAttr(request, name, sum) < 0 {
            ffi::PyErr_Clear();
        }
        ffi::Py_XDECREF(sum);
    }
}

/// `failed(elapsed_ns, exception, *args, **kwargs)` for the call whose exception is set, which is
/// set again afterwards, exactly as it was (an error of `failed` itself is cleared).
unsafe fn report_failure(
    failed: *mut ffi::PyObject,
    elapsed: i64,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) {
    // SAFETY: an exception is set (the caller checked); it is fetched before Python code runs and
    // restored after, with every reference it held. The argument buffer is the caller's, read
    // for `nargs` positional and `len(kwnames)` keyword values.
    unsafe {
        let (mut kind, mut value, mut traceback) = (null_mut(), null_mut(), null_mut());
        ffi::PyErr_Fetch(&mut kind, &mut value, &mut traceback);
        ffi::PyErr_NormalizeException(&mut kind, &mut value, &mut traceback);
        if !traceback.is_null() && !value.is_null() {
            ffi::PyException_SetTraceback(value, traceback);
        }
        let nargs = ffi::PyVectorcall_NARGS(nargsf) as usize;
        let nkw = if kwnames.is_null() {
            0
        } else {
            ffi::PyTuple_GET_SIZE(kwnames) as usize
        };
        let duration = ffi::PyLong_FromLongLong(elapsed);
        if !duration.is_null() && !value.is_null() {
            let mut call_args: Vec<*mut ffi::PyObject> = Vec::with_capacity(2 + nargs + nkw);
            call_args.push(duration);
            call_args.push(value);
            call_args.extend_from_slice(std::slice::from_raw_parts(args, nargs + nkw));
            let reported = ffi::PyObject_Vectorcall(failed, call_args.as_ptr(), 2 + nargs, kwnames);
            ffi::Py_XDECREF(reported);
        }
        ffi::Py_XDECREF(duration);
        ffi::PyErr_Clear(); // failed's own error, or the long's: never instead of the call's
        ffi::PyErr_Restore(kind, value, traceback);
    }
}
