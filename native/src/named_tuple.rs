//! Named tuples made from Rust, as `tuple.__new__(cls, fields)` makes them, without the
//! Python call: the decoder's spans and links and GPU idle's gaps.

use pyo3::ffi;
use pyo3::prelude::*;

/// Whether `cls` is a tuple subclass (a named tuple class). Checked where a class is handed
/// in, so that [`new`] may fill its item slots.
pub(crate) fn is_tuple_class(cls: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `cls` is a live object (a `Bound`, so the GIL is held); the checks only read
    // its type, and `PyType_IsSubtype` is called only once it is known to be a type.
    unsafe {
        ffi::PyType_Check(cls.as_ptr()) != 0
            && ffi::PyType_IsSubtype(
                cls.as_ptr().cast(),
                std::ptr::addr_of_mut!(ffi::PyTuple_Type),
            ) != 0
    }
}

/// A new instance of the tuple subclass `cls` (checked with [`is_tuple_class`]) holding
/// `items`, owned references it takes over. The items are drawn only once the tuple exists,
/// so when allocation fails the iterator still owns (and releases) them.
pub(crate) fn new<'py, I>(
    py: Python<'py>,
    cls: *mut ffi::PyObject,
    items: I,
) -> PyResult<Bound<'py, PyAny>>
where
    I: ExactSizeIterator<Item = *mut ffi::PyObject>,
{
    let tp = cls.cast::<ffi::PyTypeObject>();
    // SAFETY: `cls` is a tuple subclass (every caller checked it with `is_tuple_class`
    // when it was handed in) and `py` proves the GIL is held. Its tp_alloc is
    // PyType_GenericAlloc: zeroed item slots (named tuples add no fields of their own), so
    // each index below the length is an empty slot that takes over one item's reference.
    unsafe {
        let alloc = (*tp).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
        let obj = alloc(tp, items.len() as ffi::Py_ssize_t);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        for (i, item) in items.enumerate() {
            ffi::PyTuple_SET_ITEM(obj, i as ffi::Py_ssize_t, item);
        }
        Ok(Bound::from_owned_ptr(py, obj))
    }
}
