//! The vLLM adapter's pass over a step's outputs, compiled for the output that needs nothing but
//! counting: on the API server (`integrations/vllm/_api.py`: `_api_outputs`) and in EngineCore
//! (`integrations/vllm/_engine.py`: `_engine_outputs`).
//!
//! Every running request gets an output every engine step, and the common one is a decode
//! step's: one new token for a request still running, with no request events of vLLM's and no
//! engine summary in its `trace_headers`. For it the pass only appends the step's token time to
//! the request's record and (API server) adds the request's share of the step's processing
//! time — in Python ~65 bytecodes an output, a third of llmtrace's work on the API server's
//! thread (docs/performance.md). `outputs_pass` does that for every such output and returns the
//! others (a first token where the caller asks, a multi-token output, one with events or a
//! summary, a request that ended or whose record has ended, any output it cannot read as
//! expected) in order, untouched, for the Python pass to handle whole: the two together do
//! exactly what the Python pass alone does.

use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

struct Names {
    request_id: Py<PyString>,
    new_token_ids: Py<PyString>,
    events: Py<PyString>,
    trace_headers: Py<PyString>,
    finish_reason: Py<PyString>,
    finish_ns: Py<PyString>,
    token_ns: Py<PyString>,
    detokenize_ns: Py<PyString>,
}

static NAMES: OnceLock<Names> = OnceLock::new();

fn names(py: Python<'_>) -> &'static Names {
    NAMES.get_or_init(|| Names {
        request_id: PyString::intern(py, "request_id").unbind(),
        new_token_ids: PyString::intern(py, "new_token_ids").unbind(),
        events: PyString::intern(py, "events").unbind(),
        trace_headers: PyString::intern(py, "trace_headers").unbind(),
        finish_reason: PyString::intern(py, "finish_reason").unbind(),
        finish_ns: PyString::intern(py, "finish_ns").unbind(),
        token_ns: PyString::intern(py, "token_ns").unbind(),
        detokenize_ns: PyString::intern(py, "detokenize_ns").unbind(),
    })
}

/// How an output is counted: the step's token time, each output's share of the processing time
/// (None: none kept), whether a request's first token goes to Python, the summary key.
struct Counting<'a, 'py> {
    at_ns: i64,
    share: Option<i64>,
    first_to_python: bool,
    summary_key: &'a Bound<'py, PyString>,
}

/// The outputs of `outputs` the Python pass must handle, in order (None: none). `open`: the open
/// request records by request id; `states`: vLLM's requests still open (`request_states`), or
/// None to tell an ended request by its `finish_reason`; `at_ns`: the step's token time; `share`:
/// each output's share of the processing time, or None where the caller keeps none;
/// `summary_key`: the `trace_headers` key of an engine summary; `first_to_python`: whether the
/// first token of a request (its record has no token yet) is left to Python.
#[pyfunction]
#[pyo3(signature = (outputs, open, states, at_ns, share, summary_key, first_to_python=false))]
pub(crate) fn outputs_pass<'py>(
    outputs: &Bound<'py, PyList>,
    open: &Bound<'py, PyDict>,
    states: Option<&Bound<'py, PyDict>>,
    at_ns: i64,
    share: Option<i64>,
    summary_key: &Bound<'py, PyString>,
    first_to_python: bool,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = outputs.py();
    let n = names(py);
    let how = Counting {
        at_ns,
        share,
        first_to_python,
        summary_key,
    };
    let mut left: Option<Bound<'py, PyList>> = None;
    for output in outputs.iter() {
        if !counted(&output, open, states, &how, n).unwrap_or(false) {
            // (An error reading it: the Python pass reads it again and reports what it finds.)
            match &left {
                Some(list) => list.append(output)?,
                None => left = Some(PyList::new(py, [output])?),
            }
        }
    }
    Ok(left)
}

/// Whether `output` was the common kind and is now counted; Ok(false) and nothing done otherwise.
fn counted(
    output: &Bound<'_, PyAny>,
    open: &Bound<'_, PyDict>,
    states: Option<&Bound<'_, PyDict>>,
    how: &Counting<'_, '_>,
    n: &Names,
) -> PyResult<bool> {
    let py = output.py();
    let request_id = output.getattr(n.request_id.bind(py))?;
    let Some(record) = open.get_item(&request_id)? else {
        return Ok(true); // no record here: nothing to do, as in the Python pass
    };
    let tokens = output.getattr(n.new_token_ids.bind(py))?;
    if tokens.is_none() || tokens.len()? != 1 || !output.getattr(n.events.bind(py))?.is_none() {
        return Ok(false);
    }
    let headers = output.getattr(n.trace_headers.bind(py))?;
    if headers.is_truthy()? && headers.contains(how.summary_key)? {
        return Ok(false);
    }
    let still_open = match states {
        Some(states) => states.contains(&request_id)?,
        None => output.getattr(n.finish_reason.bind(py))?.is_none(),
    };
    if !still_open || !record.getattr(n.finish_ns.bind(py))?.is_none() {
        return Ok(false);
    }
    let token_times = record.getattr(n.token_ns.bind(py))?;
    let token_times = token_times.cast::<PyList>()?;
    if how.first_to_python && token_times.is_empty() {
        return Ok(false);
    }
    if let Some(share) = how.share {
        let detokenize = record.getattr(n.detokenize_ns.bind(py))?.add(share)?;
        record.setattr(n.detokenize_ns.bind(py), detokenize)?;
    }
    // Can fail only by running out of memory (then the output may be counted twice).
    token_times.append(how.at_ns)?;
    Ok(true)
}
