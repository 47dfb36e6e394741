//! The tokenizer methods llmtrace puts in place of `encode`/`decode` (`integrations/_common.py`:
//! `_timed_tokenizer_method`), compiled for the calls that need nothing of llmtrace.
//!
//! A streamed response decodes once per token, through two patched methods (transformers'
//! `decode` calls the `tokenizers` one), and at production sampling nine requests in ten are
//! not sampled: the decode's time would land on no span, so the call only has to pass through.
//! Written in Python, each patched method is a frame that repacks `*args, **kwargs` (a dict per
//! call for `skip_special_tokens=True`), and asking whether anything records the decode is two
//! more frames (~13k instructions a streamed token at 0 % sampling on the reference server). The
//! builtin this module makes answers those cases without a Python frame:
//!
//! 1. a call nested in a tokenizer call llmtrace already handles (the `in_tokenizer` context
//!    variable is true) goes to `original` with the arguments as they came;
//! 2. a call that *observe* finds unobserved — the current request (`request_var`) is not
//!    recording, or else the current server scope's (`scope_var`) `recording` is false — goes
//!    to `original` with `in_tokenizer` set around it, so that its nested calls pass through;
//! 3. everything else goes to `fallback`, the Python method itself (the reference, which
//!    decides again and times and reports the call): every encode, an observed decode, a
//!    decode with neither a request nor a scope current, and any error while looking (the
//!    Python method then decides, and counts the error).
//!
//! Binding: the object put on the class is a `TokenizerMethod`, a descriptor whose `__get__`
//! returns a bound method of the builtin, so `tokenizer.decode(ids)` reaches the builtin with
//! the instance as its first argument and the caller's arguments untouched (vectorcall). It
//! carries a `__dict__` for `functools.update_wrapper` (`__wrapped__`, `__name__`, ...) and
//! llmtrace's patch marker. Its body makes only C-API calls, none of which can panic.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

extern "C" {
    /// CPython's bound-method constructor (`types.MethodType(func, self)`), not in pyo3-ffi.
    fn PyMethod_New(func: *mut ffi::PyObject, self_: *mut ffi::PyObject) -> *mut ffi::PyObject;
}

/// What the builtin reads: the method it stands in for and how llmtrace decides about a call.
#[pyclass(module = "llmtrace_native", frozen)]
pub(crate) struct MethodState {
    /// The tokenizer's own method.
    original: Py<PyAny>,
    /// The Python method this one short-cuts (`_timed_tokenizer_method`'s), for every other call.
    fallback: Py<PyAny>,
    /// `ContextVar[bool]`: true while a tokenizer call llmtrace handles runs.
    in_tokenizer: Py<PyAny>,
    /// `(request_var, scope_var)` for a method whose calls are timed only when observed
    /// (decodes); `None` for one whose user-level calls are all timed (encodes).
    observe: Option<Observe>,
    /// `recording`, interned once per process.
    recording: &'static Py<PyString>,
}

struct Observe {
    /// `ContextVar[RequestHandle | None]`: the current request.
    request_var: Py<PyAny>,
    /// `ContextVar[ServerScope | None]`: the current server call.
    scope_var: Py<PyAny>,
}

static RECORDING: std::sync::OnceLock<Py<PyString>> = std::sync::OnceLock::new();

#[pymethods]
impl MethodState {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.original)?;
        visit.call(&self.fallback)?;
        visit.call(&self.in_tokenizer)?;
        if let Some(observe) = &self.observe {
            visit.call(&observe.request_var)?;
            visit.call(&observe.scope_var)?;
        }
        Ok(())
    }
}

/// The object on the class: binds like a function (see the module docstring).
#[pyclass(module = "llmtrace_native", frozen, dict)]
pub(crate) struct TokenizerMethod {
    /// The builtin bound to its `MethodState`.
    function: Py<PyAny>,
}

#[pymethods]
impl TokenizerMethod {
    /// `instance.method` is a bound method of the builtin; `Class.method` is this object.
    fn __get__(
        slf: &Bound<'_, Self>,
        instance: Option<&Bound<'_, PyAny>>,
        _owner: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match instance {
            None => Ok(slf.clone().into_any().unbind()),
            Some(instance) if instance.is_none() => Ok(slf.clone().into_any().unbind()),
            // SAFETY: both pointers are valid objects with the GIL held; PyMethod_New returns a
            // new reference or NULL with an exception set.
            Some(instance) => unsafe {
                let bound = PyMethod_New(slf.get().function.as_ptr(), instance.as_ptr());
                Ok(Bound::from_owned_ptr_or_err(py, bound)?.unbind())
            },
        }
    }

    /// `Class.method(instance, ...)`: the same call, through the builtin.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        Ok(self.function.bind(py).call(args, kwargs)?.unbind())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.function)
    }
}

/// `Sync` for the one `PyMethodDef` CPython reads (never writes) through the pointer it is given.
struct MethodDef(ffi::PyMethodDef);
// SAFETY: the definition is immutable after construction and holds pointers to 'static data.
unsafe impl Sync for MethodDef {}

static CALL_DEF: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"tokenizer_method".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: call,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    // The text signature makes `inspect.signature(tokenizer.decode)` answer (*args, **kwargs)
    // rather than raise; `Class.decode`'s follows `__wrapped__` to the original's.
    ml_doc: c"tokenizer_method($self, /, *args, **kwargs)\n--\n\nA tokenizer method under llmtrace's tokenizer integration."
        .as_ptr(),
});

/// The method put in place of a tokenizer's *original*: see the module docstring. *observe* is
/// `(request_var, scope_var)` for a method timed only when observed, else `None`.
#[pyfunction]
#[pyo3(signature = (original, fallback, in_tokenizer, observe=None))]
pub(crate) fn tokenizer_method<'py>(
    py: Python<'py>,
    original: Py<PyAny>,
    fallback: Py<PyAny>,
    in_tokenizer: Py<PyAny>,
    observe: Option<(Py<PyAny>, Py<PyAny>)>,
) -> PyResult<Bound<'py, TokenizerMethod>> {
    let recording = RECORDING.get_or_init(|| PyString::intern(py, "recording").unbind());
    let observe = observe.map(|(request_var, scope_var)| Observe {
        request_var,
        scope_var,
    });
    let state = Bound::new(
        py,
        MethodState {
            original,
            fallback,
            in_tokenizer,
            observe,
            recording,
        },
    )?;
    // SAFETY: CALL_DEF lives for the process and CPython does not write through the pointer;
    // `state` is a valid object the new function keeps a reference to (its `__self__`).
    let function = unsafe {
        let function = ffi::PyCFunction_NewEx(
            std::ptr::addr_of!(CALL_DEF.0).cast_mut(),
            state.as_ptr(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, function)?
    };
    Bound::new(
        py,
        TokenizerMethod {
            function: function.unbind(),
        },
    )
}

/// The builtin's body: `slf` is the `MethodState`, `args[..nargs]` the positional arguments (the
/// tokenizer first) and `kwnames` the names of the keyword ones after them. Returns a new
/// reference, or NULL with the callee's exception set.
unsafe extern "C" fn call(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a builtin with the GIL held (attached), and `slf` is the `MethodState`
    // bound by `tokenizer_method` (the only maker of functions from CALL_DEF), alive while it is.
    let (py, state) = unsafe {
        let py = Python::assume_attached();
        (
            py,
            Borrowed::from_ptr(py, slf)
                .cast_unchecked::<MethodState>()
                .get(),
        )
    };
    let nargs = nargs as usize;
    // Every C-API call below gets valid objects (owned by `state`, or the caller's arguments
    // borrowed for the call) with the GIL held.
    let in_tokenizer = state.in_tokenizer.as_ptr();
    // SAFETY: as said above.
    match unsafe { flag_set(in_tokenizer) } {
        None => return std::ptr::null_mut(),
        Some(true) => {
            // SAFETY: as said above: the arguments exactly as CPython passed them.
            return unsafe {
                ffi::PyObject_Vectorcall(state.original.as_ptr(), args, nargs, kwnames)
            };
        }
        Some(false) => {}
    }
    let unobserved = match &state.observe {
        // SAFETY: as said above.
        Some(observe) => unsafe { unobserved(observe, state.recording.as_ptr()) },
        None => false,
    };
    if !unobserved {
        // SAFETY: as said above.
        return unsafe { ffi::PyObject_Vectorcall(state.fallback.as_ptr(), args, nargs, kwnames) };
    }
    // SAFETY: as said above; the token is a new reference, released after the reset.
    unsafe {
        let token = ffi::PyContextVar_Set(in_tokenizer, ffi::Py_True());
        if token.is_null() {
            return std::ptr::null_mut();
        }
        let result = ffi::PyObject_Vectorcall(state.original.as_ptr(), args, nargs, kwnames);
        // The callee's exception, if any, is kept across the reset.
        let raised = PyErr::take(py);
        let reset = ffi::PyContextVar_Reset(in_tokenizer, token);
        ffi::Py_DECREF(token);
        if let Some(error) = raised {
            error.restore(py);
        } else if reset < 0 {
            ffi::Py_XDECREF(result);
            return std::ptr::null_mut();
        }
        result
    }
}

/// The context variable's truth: `Some(value is True)`, or `None` with an exception set.
unsafe fn flag_set(var: *mut ffi::PyObject) -> Option<bool> {
    let mut value: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: a valid ContextVar with the GIL held; `value` receives a new reference (or NULL
    // when the variable has no value and no default).
    unsafe {
        if ffi::PyContextVar_Get(var, std::ptr::null_mut(), &mut value) < 0 {
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

/// Whether the call certainly lands on no recording span: the current request's `recording` is
/// false, or, with no request current, the current server scope's. False whenever that is not
/// known (neither is current, or reading them failed: the error is cleared, and the Python
/// method, which asks again, decides and counts it).
unsafe fn unobserved(observe: &Observe, recording: *mut ffi::PyObject) -> bool {
    // SAFETY: valid objects with the GIL held (the caller's contract); every new reference is
    // released before returning.
    unsafe {
        for var in [&observe.request_var, &observe.scope_var] {
            let mut current: *mut ffi::PyObject = std::ptr::null_mut();
            if ffi::PyContextVar_Get(var.as_ptr(), ffi::Py_None(), &mut current) < 0 {
                ffi::PyErr_Clear();
                return false;
            }
            if current.is_null() || current == ffi::Py_None() {
                ffi::Py_XDECREF(current);
                continue;
            }
            let value = ffi::PyObject_GetAttr(current, recording);
            ffi::Py_DECREF(current);
            if value.is_null() {
                ffi::PyErr_Clear();
                return false;
            }
            let truth = ffi::PyObject_IsTrue(value);
            ffi::Py_DECREF(value);
            if truth < 0 {
                ffi::PyErr_Clear();
                return false;
            }
            return truth == 0;
        }
        false
    }
}
