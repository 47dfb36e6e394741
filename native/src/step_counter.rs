//! The steps of an engine's unsampled window, counted in compiled code (`lifecycle/engine.py`:
//! `EngineTracer.attach_counter`; the vLLM adapter's scheduler hooks use it).
//!
//! At production sampling nine engine windows in ten are not sampled, and while no request of
//! the engine has a record open (an unsampled request leaves none), a step of such a window only
//! feeds the serving metrics: its batch size (the batch-size histogram) and its forward time (the
//! engine's idle ratio). Written in Python, that bookkeeping — a pending-step object between the
//! scheduler's `schedule()` and `update_from_output()`, the window's checks, the counting — was
//! ~300 bytecodes a step on the engine thread, 4.5–5 % of a step of vLLM's own Scheduler with no
//! model (docs/performance.md). A `StepCounter` does it in three calls the hooks make: `scheduled`
//! (a step may be counted here: the batch size read, the step held as pending), `dispatched`
//! (the forward pass starts) and `updated` (the step's outputs are back: counted).
//!
//! The tracer stays the owner of its windows: it lets the counter take the steps of the open
//! window (`allow`, with the window's deadline and the steps it may still hold), and takes the
//! counted steps back into the window (`drain`) whenever it closes one or a step needs Python
//! (a request with a record open, a window due to close, the engine going idle): `scheduled`
//! then answers false and `updated` true, and the hooks go the Python way (the reference, which
//! gives the same window totals without this module).
//!
//! Locking: the hooks run on the engine thread, but a flush may come from any thread. The state
//! sits behind a mutex that is never held across a call into Python (an attribute read, a
//! length, dropping an object), so a thread switch cannot happen while it is held.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyWeakrefMethods, PyWeakrefReference};

/// A step between `scheduled` and `updated`: its key object (held, so that no other object can
/// take its address meanwhile) and its times.
struct Pending {
    key: Py<PyAny>,
    start_ns: i64,
    schedule_end_ns: i64,
    size: u32,
    forward_start_ns: Option<i64>,
}

/// Counted steps not yet drained into the tracer's window.
#[derive(Default)]
struct Tally {
    sizes: Vec<u32>,
    busy_ns: i64,
    forward_seen: bool,
    first_start_ns: Option<i64>,
    end_ns: i64,
}

struct State {
    /// The engine whose steps may be counted (a weak reference: the counter outlives no engine
    /// it was given), and until when and for how many more steps.
    engine: Option<Py<PyWeakrefReference>>,
    open: bool,
    deadline_ns: i64,
    steps_left: i64,
    pending: Vec<Pending>,
    tally: Tally,
    /// Steps counted here since the counter was made.
    counted: u64,
}

/// One engine's counted steps (see the module's documentation).
#[pyclass(module = "llmtrace_native", frozen)]
pub(crate) struct StepCounter {
    /// The engine's open request records: steps are counted here only while it is empty.
    records: Py<PyDict>,
    /// The key object's attribute whose length is the batch size (vLLM: `num_scheduled_tokens`).
    batch_attr: Py<PyString>,
    /// The engine's attribute that is empty when no request is left (vLLM: `requests`).
    busy_attr: Py<PyString>,
    /// Pending steps kept at most (a key never updated must not be held forever).
    max_pending: usize,
    state: Mutex<State>,
}

impl State {
    /// Whether a step that begins (or ends) at `at_ns` is still the allowed window's.
    fn takes(&self, at_ns: i64) -> bool {
        self.open && self.steps_left > 0 && at_ns < self.deadline_ns
    }
}

impl StepCounter {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic never happens under the lock (no call into Python, no allocation that could
        // fail but by aborting), so the lock is never poisoned; if it were, the state is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[pymethods]
impl StepCounter {
    #[new]
    fn new(
        records: Bound<'_, PyDict>,
        batch_attr: Bound<'_, PyString>,
        busy_attr: Bound<'_, PyString>,
        max_pending: usize,
    ) -> Self {
        StepCounter {
            records: records.unbind(),
            batch_attr: batch_attr.unbind(),
            busy_attr: busy_attr.unbind(),
            max_pending: max_pending.max(1),
            state: Mutex::new(State {
                engine: None,
                open: false,
                deadline_ns: 0,
                steps_left: 0,
                pending: Vec::new(),
                tally: Tally::default(),
                counted: 0,
            }),
        }
    }

    /// The steps of `engine` that begin before `deadline_ns`, `steps` of them at most, may be
    /// counted here (the tracer's open window is unsampled).
    fn allow(&self, engine: &Bound<'_, PyAny>, deadline_ns: i64, steps: i64) -> PyResult<()> {
        let reference = PyWeakrefReference::new(engine)?.unbind();
        let old = {
            let mut state = self.lock();
            state.open = steps > 0;
            state.deadline_ns = deadline_ns;
            state.steps_left = steps;
            state.engine.replace(reference)
        };
        drop(old);
        Ok(())
    }

    /// No further step may begin here (the window closed); pending ones are still counted.
    fn stop(&self) {
        self.lock().open = false;
    }

    /// A step of `engine` that began at `start_ns` was scheduled by `end_ns`, its batch in
    /// `key`: true when it is counted here, false when the caller must handle it (the counter
    /// is stopped or the window due, another engine's step, a request record open).
    fn scheduled(
        &self,
        engine: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        start_ns: i64,
        end_ns: i64,
    ) -> PyResult<bool> {
        let reference = {
            let state = self.lock();
            if !state.takes(start_ns) {
                return Ok(false);
            }
            match &state.engine {
                Some(reference) => reference.clone_ref(engine.py()),
                None => return Ok(false),
            }
        };
        let same = reference
            .bind(engine.py())
            .upgrade()
            .is_some_and(|current| current.is(engine));
        if !same || !self.records.bind(engine.py()).is_empty() {
            return Ok(false);
        }
        // A key without a readable batch is left to the caller, which reads it leniently.
        let Ok(batch) = key.getattr(self.batch_attr.bind(engine.py())) else {
            return Ok(false);
        };
        let size = if batch.is_none() {
            0
        } else {
            match batch.len() {
                Ok(size) => size,
                Err(_) => return Ok(false),
            }
        };
        let dropped = {
            let mut state = self.lock();
            if !state.takes(start_ns) {
                return Ok(false); // stopped meanwhile (another thread closed the window)
            }
            state.steps_left -= 1;
            let dropped = if state.pending.len() >= self.max_pending {
                Some(state.pending.remove(0))
            } else {
                None
            };
            state.pending.push(Pending {
                key: key.clone().unbind(),
                start_ns,
                schedule_end_ns: end_ns,
                size: u32::try_from(size).unwrap_or(u32::MAX),
                forward_start_ns: None,
            });
            dropped
        };
        drop(dropped);
        Ok(true)
    }

    /// The forward pass of the step keyed by `key` was dispatched at `at_ns` (its first
    /// dispatch counts): whether the step is pending here.
    fn dispatched(&self, key: &Bound<'_, PyAny>, at_ns: i64) -> bool {
        let mut state = self.lock();
        match state
            .pending
            .iter_mut()
            .find(|p| p.key.as_ptr() == key.as_ptr())
        {
            Some(pending) => {
                pending.forward_start_ns.get_or_insert(at_ns);
                true
            }
            None => false,
        }
    }

    /// The outputs of the step keyed by `key` came back at `start_ns` and were processed by
    /// `end_ns`: None when the step is not pending here, else it is counted, and true when the
    /// caller must settle (drain the counted steps into the window, which may be due to close,
    /// or see whether `engine` went idle; a request record is open), false when nothing is left
    /// to do.
    fn updated(
        &self,
        engine: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        start_ns: i64,
        end_ns: i64,
    ) -> PyResult<Option<bool>> {
        let (pending, due) = {
            let mut state = self.lock();
            let Some(index) = state
                .pending
                .iter()
                .position(|p| p.key.as_ptr() == key.as_ptr())
            else {
                return Ok(None);
            };
            let pending = state.pending.remove(index);
            state.counted += 1;
            let tally = &mut state.tally;
            tally.sizes.push(pending.size);
            let forward_start = pending.forward_start_ns.unwrap_or(pending.schedule_end_ns);
            tally.busy_ns += start_ns - forward_start;
            tally.forward_seen = true;
            tally.first_start_ns.get_or_insert(pending.start_ns);
            tally.end_ns = tally.end_ns.max(end_ns);
            let due = !state.takes(end_ns);
            (pending, due)
        };
        drop(pending);
        if due || !self.records.bind(engine.py()).is_empty() {
            return Ok(Some(true));
        }
        // The engine may be going idle: the caller closes the window then, or its steps would
        // wait for the next request to be exported.
        let busy = engine
            .getattr(self.busy_attr.bind(engine.py()))?
            .is_truthy()?;
        Ok(Some(!busy))
    }

    /// Steps pending here.
    fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Steps counted here since the counter was made (whether it is in use: tests, benchmarks).
    fn counted(&self) -> u64 {
        self.lock().counted
    }

    /// The counted steps since the last drain, forgotten here: (batch sizes, forward time,
    /// whether a forward was timed, the first one's start, the last one's end); None when no
    /// step was counted since.
    #[allow(clippy::type_complexity)]
    fn drain<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyList>, i64, bool, i64, i64)>> {
        let tally = std::mem::take(&mut self.lock().tally);
        let Some(first_start_ns) = tally.first_start_ns else {
            return Ok(None);
        };
        let sizes = PyList::new(py, tally.sizes)?;
        Ok(Some((
            sizes,
            tally.busy_ns,
            tally.forward_seen,
            first_start_ns,
            tally.end_ns,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(py: Python<'_>) -> Bound<'_, StepCounter> {
        let records = PyDict::new(py);
        Bound::new(
            py,
            StepCounter::new(
                records,
                PyString::new(py, "real"),
                PyString::new(py, "real"),
                2,
            ),
        )
        .unwrap()
    }

    #[test]
    fn counts_only_what_it_was_allowed() {
        Python::initialize();
        Python::attach(|py| {
            let counter = counter(py);
            let c = counter.get();
            // An engine object that can be weakly referenced: a module.
            let engine = py.import("math").unwrap().into_any();
            let key = py
                .eval(c"type('Output', (), {'real': [1, 2]})()", None, None)
                .unwrap();
            assert!(!c.scheduled(&engine, &key, 0, 1).unwrap()); // not allowed yet
            c.allow(&engine, 100, 1).unwrap();
            assert!(!c.scheduled(&engine, &key, 100, 101).unwrap()); // past the deadline
            assert!(c.scheduled(&engine, &key, 10, 12).unwrap());
            assert!(!c.scheduled(&engine, &key, 20, 21).unwrap()); // its one step taken
            assert!(c.dispatched(&key, 13));
            assert_eq!(c.updated(&engine, &key, 30, 31).unwrap(), Some(true)); // room spent: settle
            assert_eq!(c.updated(&engine, &key, 40, 41).unwrap(), None);
            let (sizes, busy, seen, first, end) = c.drain(py).unwrap().unwrap();
            assert_eq!(sizes.extract::<Vec<u32>>().unwrap(), vec![2]);
            assert_eq!((busy, seen, first, end), (17, true, 10, 31));
            assert!(c.drain(py).unwrap().is_none());
            assert_eq!((c.pending(), c.counted()), (0, 1));
        });
    }
}
