//! What the analyzers read from an engine's steps: evidence of work between and during
//! steps (`gpu_idle._step_runs`), step segments, step statistics (`bottleneck.step_stats`).

use std::collections::HashSet;

use pyo3::prelude::*;

use super::columns::{pack_id, Val};
use super::{EngineCols, EngineTable, Fx};
use crate::gpu_idle::Interval;

/// The attribute keys the views read, looked up once.
pub(super) struct Keys {
    pub(super) engine_id: Option<u32>,
    pub(super) step_id: Option<u32>,
    pub(super) nums: [Option<u32>; 5],
    pub(super) request_ids: Option<u32>,
}

/// `model.FINITE_LIMIT`.
const FINITE_LIMIT: f64 = 1e300;

/// `StepView`'s numbers: `float(v)` for a finite int or float, else the default.
pub(super) fn number(v: Option<Val>, default: f64) -> f64 {
    match v {
        Some(Val::Int(i)) => i as f64,
        Some(Val::Float(x)) if -FINITE_LIMIT < x && x < FINITE_LIMIT => x,
        _ => default,
    }
}

/// Where a step's batch ids come from (`gpu_idle._batch_ids`), compared as Python compares
/// the values: an int equals the float of the same value and `True` equals 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Nothing,
    Int(i64),
    FloatBits(u64),
    Text(u32),
    /// A 16-character ASCII string (a link's span id or a string of that shape).
    Id(u128),
}

impl EngineTable {
    pub(super) fn keys(&self) -> Keys {
        let st = &self.data.strings;
        let names = &self.decoder.get().step_keys;
        let find = |k: usize| st.find(&names[k]);
        Keys {
            engine_id: find(0),
            step_id: find(1),
            nums: [find(2), find(3), find(4), find(5), find(6)],
            request_ids: find(7),
        }
    }

    /// `_batch_ids`: the request-id attribute when it is a non-empty array, else the link
    /// span ids, else `None`.
    fn batch_ids(&self, keys: &Keys, i: u32) -> Option<Vec<Key>> {
        let d = &self.data;
        let s = &d.spans[i as usize];
        if let Some(Val::Array(start, len)) = d.attr(s, keys.request_ids) {
            if len > 0 {
                let elems = &d.elems[start as usize..(start + len) as usize];
                return Some(elems.iter().map(|e| self.key(*e)).collect());
            }
        }
        if s.n_links > 0 {
            let l0 = s.links as usize;
            let links = &d.links[l0..l0 + usize::from(s.n_links)];
            return Some(links.iter().map(|&(_, id)| Key::Id(id)).collect());
        }
        None
    }

    fn key(&self, v: Val) -> Key {
        match v {
            Val::Nothing | Val::Array(..) => Key::Nothing,
            Val::Int(i) => Key::Int(i),
            Val::Bool(b) => Key::Int(i64::from(b)),
            Val::Float(x) => {
                // An integral float equals the int of the same value.
                if x.fract() == 0.0 && (-9.2e18..9.2e18).contains(&x) {
                    Key::Int(x as i64)
                } else {
                    Key::FloatBits(x.to_bits())
                }
            }
            Val::Str(t) => {
                let text = self.data.strings.text(t);
                if text.len() == 16 && text.is_ascii() {
                    Key::Id(pack_id(text))
                } else {
                    Key::Text(t)
                }
            }
        }
    }

    /// [`EngineTable::step_runs`].
    pub(super) fn runs(&self, e: usize) -> PyResult<Vec<Interval>> {
        let cols = self.engine(e)?;
        let keys = self.keys();
        let spans = &self.data.spans;
        let mut out: Vec<Interval> = Vec::new();
        let (mut lo, mut hi, mut joining) = (0i64, 0i64, false);
        let mut push = |s: i64, e: i64| {
            if e <= s {
                return;
            }
            if joining && s <= hi && e >= lo {
                lo = lo.min(s);
                hi = hi.max(e);
            } else {
                if joining {
                    out.push((lo, hi));
                }
                (lo, hi, joining) = (s, e, true);
            }
        };
        // `_step_evidence`, reading batch ids only where needed and then once per step.
        let mut prev: Option<usize> = None;
        let mut prev_ids: Option<Option<Vec<Key>>> = None;
        for k in 0..cols.steps.len() {
            let st = &spans[cols.steps[k] as usize];
            let mut ids: Option<Option<Vec<Key>>> = None;
            if let Some(p) = prev {
                let pn = cols.nums[p];
                let mut held = pn[1] > 0.0;
                if !held && pn[2] > 0.0 && cols.nums[k][2] > 0.0 {
                    let mine = self.batch_ids(&keys, cols.steps[k]);
                    let theirs = match prev_ids.take() {
                        Some(v) => v,
                        None => self.batch_ids(&keys, cols.steps[p]),
                    };
                    held = continued(&theirs, &mine);
                    ids = Some(mine);
                }
                if held {
                    push(spans[cols.steps[p] as usize].end, st.start);
                }
            }
            if cols.nums[k][0] > 0.0 {
                push(st.start, st.end);
            }
            prev = Some(k);
            prev_ids = ids;
        }
        if joining {
            out.push((lo, hi));
        }
        Ok(out)
    }

    /// [`EngineTable::step_segments`].
    pub(super) fn segments(&self, e: usize) -> PyResult<Vec<Interval>> {
        let cols = self.engine(e)?;
        let spans = &self.data.spans;
        let mut out: Vec<Interval> = Vec::new();
        for k in 0..cols.steps.len() {
            let s = &spans[cols.steps[k] as usize];
            let contiguous = k > 0
                && match (cols.step_id[k], cols.step_id[k - 1]) {
                    (Some(a), Some(b)) => b.checked_add(1) == Some(a),
                    _ => true,
                };
            match out.last_mut() {
                Some(last) if contiguous => last.1 = last.1.max(s.end),
                _ => out.push((s.start, s.end)),
            }
        }
        Ok(out)
    }

    /// [`EngineTable::step_stats`].
    #[allow(clippy::type_complexity)]
    pub(super) fn stats(
        &self,
        engines: &[usize],
        lo: usize,
        hi: usize,
    ) -> PyResult<(usize, f64, f64, f64, usize, f64, f64)> {
        let mut picked: Vec<(&EngineCols, usize, usize)> = Vec::with_capacity(engines.len());
        for &e in engines {
            let c = self.engine(e)?;
            let n = c.steps.len();
            picked.push(if engines.len() == 1 {
                let hi = hi.min(n);
                (c, lo.min(hi), hi)
            } else {
                (c, 0, n)
            });
        }
        let rows = || {
            picked
                .iter()
                .flat_map(|&(c, a, b)| (a..b).map(move |k| (c, k)))
        };
        let spans = &self.data.spans;
        let n = rows().count();
        let batch = py_sum(rows().map(|(c, k)| c.nums[k][0]));
        let waiting = py_sum(rows().map(|(c, k)| c.nums[k][1]));
        let preempted = py_sum(rows().map(|(c, k)| c.nums[k][4]));
        let linked = if preempted != 0.0 {
            let mut ids: HashSet<u128, Fx> = HashSet::default();
            for (c, k) in rows() {
                let s = &spans[c.steps[k] as usize];
                let l0 = s.links as usize;
                ids.extend(
                    self.data.links[l0..l0 + usize::from(s.n_links)]
                        .iter()
                        .map(|l| l.1),
                );
            }
            ids.len()
        } else {
            0
        };
        let mut kv: Vec<f64> = rows()
            .map(|(c, k)| c.nums[k][3])
            .filter(|&v| v >= 0.0)
            .collect();
        kv.sort_by(f64::total_cmp);
        let kv_p90 = if kv.is_empty() {
            0.0
        } else {
            percentile_sorted(&kv, 90.0)
        };
        let growth = if n < 3 {
            0.0
        } else {
            let xs: Vec<f64> = rows()
                .map(|(c, k)| spans[c.steps[k] as usize].start as f64 / 1e9)
                .collect();
            let ys: Vec<f64> = rows().map(|(c, k)| c.nums[k][1]).collect();
            slope(&xs, &ys)
        };
        Ok((n, batch, waiting, preempted, linked, kv_p90, growth))
    }
}

/// `gpu_idle._continued`: whether a request of batch `a` is also in batch `b`.
fn continued(a: &Option<Vec<Key>>, b: &Option<Vec<Key>>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    if a == b {
        return true;
    }
    let set: HashSet<Key, Fx> = a.iter().copied().collect();
    b.iter().any(|k| set.contains(k)) || (a.len() >= 64 && b.len() >= 64)
}
/// `stats.percentile` over sorted values.
fn percentile_sorted(xs: &[f64], q: f64) -> f64 {
    if xs.len() == 1 {
        return xs[0];
    }
    let pos = (xs.len() - 1) as f64 * q / 100.0;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(xs.len() - 1);
    xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
}
/// The least-squares slope of `ys` over `xs` (`bottleneck`'s queue growth), summed as
/// Python sums; 0 when the `xs` do not vary.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mx = py_sum(xs.iter().copied()) / n;
    let my = py_sum(ys.iter().copied()) / n;
    let var = py_sum(xs.iter().map(|x| (x - mx) * (x - mx)));
    let cov = py_sum(xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)));
    if var != 0.0 {
        cov / var
    } else {
        0.0
    }
}

/// Python's `sum()` of floats on CPython 3.11: left to right from 0.
fn py_sum(xs: impl Iterator<Item = f64>) -> f64 {
    xs.fold(0.0, |acc, x| acc + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_continue_when_a_request_is_in_both_or_either_is_unknown() {
        let ids = |xs: &[i64]| Some(xs.iter().map(|&x| Key::Int(x)).collect::<Vec<_>>());
        assert!(continued(&ids(&[1, 2]), &ids(&[2, 3])));
        assert!(!continued(&ids(&[1, 2]), &ids(&[3, 4])));
        assert!(continued(&None, &ids(&[3])));
        let capped: Vec<i64> = (0..64).collect();
        let other: Vec<i64> = (100..164).collect();
        assert!(continued(&ids(&capped), &ids(&other))); // both capped: may have continued
    }

    #[test]
    fn percentiles_interpolate_as_python_does() {
        assert_eq!(percentile_sorted(&[1.0, 2.0, 3.0, 4.0, 5.0], 90.0), 4.6);
    }
}
