//! The `send` an ASGI app gets from llmtrace's middlewares (`integrations/_asgi.py`:
//! `app_send`, for the SERVER span's and the scope middleware alike), compiled for the one case
//! that happens per body chunk.
//!
//! A streamed response is one `send` per chunk (33 for a 32-token stream), and a `send`
//! wrapper written in Python costs a Python frame per chunk (~1k instructions) for a check
//! that finds nothing to note: the response has started, its first byte is timed, more body
//! follows. The function that `asgi_send` makes answers that case without a Python frame — it
//! hands the message to the server's own `send` and returns the server's awaitable — and
//! calls the Python observer (`observe`, the call's `ObservedCall.send`) for every other message: the
//! response start, the first body bytes, the last body, a message that is not an exact
//! `dict`. It takes the fast path only after the observer has returned for a body message
//! with bytes in it (the observer times the first byte there), so both paths send exactly what
//! the observer alone would. It holds the observer and the observer's call does not hold it:
//! no reference cycle per HTTP call.
//!
//! The function is a `METH_FASTCALL` builtin bound to its state (`AsgiSend`), one of the
//! cheapest calls CPython has: no argument tuple, no keyword parsing, no trampoline. (A pyo3
//! class's `__call__` pays for those, and measured no gain over the Python frame it would
//! replace: docs/performance.md.) Its body makes only C-API calls, none of which can panic.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{PyTraverseError, PyVisit};

/// One HTTP call's `send` state. Immutable but for the switch; any thread may call it.
#[pyclass(module = "llmtrace_native", frozen)]
pub(crate) struct AsgiSend {
    /// The server's `send` (the next layer out).
    downstream: Py<PyAny>,
    /// The call's Python observer for every message the fast path does not take.
    observe: Py<PyAny>,
    /// The keys and the type it reads, interned once per process.
    keys: &'static Keys,
    /// Set once the observer has returned for the response's first body bytes: a chunk with
    /// more to follow then needs nothing of llmtrace.
    streaming: AtomicBool,
}

struct Keys {
    more_body: Py<PyString>,
    kind: Py<PyString>,
    body: Py<PyString>,
    response_body: Py<PyString>,
}

static KEYS: std::sync::OnceLock<Keys> = std::sync::OnceLock::new();

#[pymethods]
impl AsgiSend {
    /// The references it holds, for the cycle collector: an app may keep its `send` where the
    /// observer's call reaches it (in the ASGI scope), and without this such a cycle would
    /// never be collected. (Clearing any other member of the cycle breaks it.)
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.downstream)?;
        visit.call(&self.observe)
    }
}

/// `Sync` for the one `PyMethodDef` CPython reads (never writes) through the pointer it is given.
struct MethodDef(ffi::PyMethodDef);
// SAFETY: the definition is immutable after construction and holds pointers to 'static data.
unsafe impl Sync for MethodDef {}

static SEND_DEF: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"send".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: send,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"The ASGI app's send(message) under llmtrace's middleware.".as_ptr(),
});

/// The app's `send` for one HTTP call: `send(message)` returns the server's awaitable, from
/// the server's `send` (`downstream`) directly for a chunk in the middle of a streamed body,
/// from `observe` for anything else.
#[pyfunction]
pub(crate) fn asgi_send<'py>(
    py: Python<'py>,
    downstream: Py<PyAny>,
    observe: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let keys = KEYS.get_or_init(|| Keys {
        more_body: PyString::intern(py, "more_body").unbind(),
        kind: PyString::intern(py, "type").unbind(),
        body: PyString::intern(py, "body").unbind(),
        response_body: PyString::intern(py, "http.response.body").unbind(),
    });
    let state = Bound::new(
        py,
        AsgiSend {
            downstream,
            observe,
            keys,
            streaming: AtomicBool::new(false),
        },
    )?;
    // SAFETY: SEND_DEF lives for the process and CPython does not write through the pointer;
    // `state` is a valid object the new function keeps a reference to (its `__self__`).
    unsafe {
        let function = ffi::PyCFunction_NewEx(
            std::ptr::addr_of!(SEND_DEF.0).cast_mut(),
            state.as_ptr(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, function)
    }
}

/// The builtin's body: `slf` is the `AsgiSend` the function was made with; `args[..nargs]` the
/// positional arguments and `kwnames` the names of the keyword ones after them. Returns a new
/// reference, or NULL with the callee's exception set. The ASGI call, `send(message)`, takes
/// the short path; any other (`send(message=...)`, a wrong count) goes to the observer as it
/// came, which takes it or raises Python's own `TypeError` for it.
unsafe extern "C" fn send(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a builtin with the GIL held (attached), and `slf` is the `AsgiSend`
    // bound by `asgi_send` (the only maker of functions from SEND_DEF), alive while it is.
    let state: &AsgiSend = unsafe {
        let py = Python::assume_attached();
        Borrowed::from_ptr(py, slf)
            .cast_unchecked::<AsgiSend>()
            .get()
    };
    if nargs != 1 || !kwnames.is_null() {
        // SAFETY: the arguments exactly as CPython passed them to this call.
        return unsafe {
            ffi::PyObject_Vectorcall(state.observe.as_ptr(), args, nargs as usize, kwnames)
        };
    }
    // SAFETY: one positional argument, borrowed for the call.
    let message = unsafe { *args };
    let keys = state.keys;
    // `message` is a valid object borrowed for the call; the keys and callables are owned by
    // `state`; every C-API call below gets valid pointers with the GIL held.
    if state.streaming.load(Ordering::Relaxed) {
        // SAFETY: as said above.
        let more = unsafe { is_true_item(message, keys.more_body.as_ptr()) };
        let callee = if more {
            &state.downstream
        } else {
            &state.observe
        };
        // SAFETY: as said above.
        return unsafe { call_one(callee.as_ptr(), message) };
    }
    // SAFETY: as said above.
    let sent = unsafe { call_one(state.observe.as_ptr(), message) };
    // SAFETY: as said above (`first_bytes` is only asked after the observer returned).
    if !sent.is_null() && unsafe { first_bytes(message, keys) } {
        state.streaming.store(true, Ordering::Relaxed);
    }
    sent
}

/// `callee(message)` by vectorcall: a new reference or NULL with an exception set.
unsafe fn call_one(callee: *mut ffi::PyObject, message: *mut ffi::PyObject) -> *mut ffi::PyObject {
    let mut args = [std::ptr::null_mut(), message];
    // SAFETY: slot 0 is scratch the callee may use (PY_VECTORCALL_ARGUMENTS_OFFSET); slot 1
    // is the one argument, borrowed for the call.
    unsafe {
        ffi::PyObject_Vectorcall(
            callee,
            args.as_mut_ptr().add(1),
            1 | ffi::PY_VECTORCALL_ARGUMENTS_OFFSET,
            std::ptr::null_mut(),
        )
    }
}

/// Whether `message` is an exact `dict` whose `key` holds a true value. Anything else, an
/// error included (a value whose truth raises; the error is cleared), is false: the observer
/// then handles the message as Python would, raising that error itself.
unsafe fn is_true_item(message: *mut ffi::PyObject, key: *mut ffi::PyObject) -> bool {
    // SAFETY: valid pointers with the GIL held (the caller's contract). The item is borrowed
    // from the dict, and its own `__bool__` may run Python code that changes the dict, so it
    // is held by a reference of ours across PyObject_IsTrue.
    unsafe {
        if ffi::PyDict_CheckExact(message) == 0 {
            return false;
        }
        let value = ffi::PyDict_GetItemWithError(message, key);
        if value.is_null() {
            ffi::PyErr_Clear();
            return false;
        }
        ffi::Py_INCREF(value);
        let truth: c_int = ffi::PyObject_IsTrue(value);
        ffi::Py_DECREF(value);
        if truth < 0 {
            ffi::PyErr_Clear();
        }
        truth > 0
    }
}

/// Whether `message` is an exact `dict` of type `http.response.body` with a non-empty `body`:
/// the message on which the observer times the first byte.
unsafe fn first_bytes(message: *mut ffi::PyObject, keys: &Keys) -> bool {
    // SAFETY: as `is_true_item`; the type is compared by identity first (an interned literal,
    // as servers and frameworks write it) and by value otherwise.
    unsafe {
        if ffi::PyDict_CheckExact(message) == 0 {
            return false;
        }
        let kind = ffi::PyDict_GetItemWithError(message, keys.kind.as_ptr());
        if kind.is_null() {
            ffi::PyErr_Clear();
            return false;
        }
        let wanted = keys.response_body.as_ptr();
        if kind != wanted {
            ffi::Py_INCREF(kind);
            let equal = ffi::PyObject_RichCompareBool(kind, wanted, ffi::Py_EQ);
            ffi::Py_DECREF(kind);
            if equal != 1 {
                if equal < 0 {
                    ffi::PyErr_Clear();
                }
                return false;
            }
        }
        is_true_item(message, keys.body.as_ptr())
    }
}
