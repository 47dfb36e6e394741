//! The table's columns: spans, attributes, array elements and links as plain Rust
//! values, appended to by the decoder (lib.rs, `Ctx::table_span`), and the id packing.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::Fx;

/// How many span names the table takes (`Decoder::engine_spans`); a span's index in them
/// is its `name` code: engine window, step, schedule, forward, sample, postprocess, gc.
pub(crate) const ENGINE_SPANS: usize = 7;
/// How many step attributes the views read (`Decoder::step_keys`), in this order: engine
/// id, step id, batch size, queue waiting, queue running, kv-cache usage, preempted, batch
/// request ids.
pub(crate) const STEP_KEYS: usize = 8;
// Name codes (indexes into `Decoder::engine_spans`).
pub(crate) const WINDOW: u8 = 0;
pub(crate) const STEP: u8 = 1;
pub(crate) const SCHEDULE: u8 = 2;
pub(crate) const FORWARD: u8 = 3;
pub(crate) const SAMPLE: u8 = 4;
pub(crate) const POSTPROCESS: u8 = 5;
pub(crate) const GC: u8 = 6;

/// `Span.parent_id is None`: no id of ASCII characters packs to this.
pub(crate) const NO_ID: u128 = u128::MAX;

/// A 16-character ASCII id, packed.
pub(crate) fn pack_id(s: &str) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(s.as_bytes());
    u128::from_be_bytes(b)
}

pub(crate) fn unpack_id(id: u128) -> [u8; 16] {
    id.to_be_bytes()
}

/// An attribute value or array element as the Python paths make it.
#[derive(Clone, Copy)]
pub(crate) enum Val {
    /// An array element with no value (`None`).
    Nothing,
    Str(u32),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// `elems[start..start + len]`, a tuple.
    Array(u32, u32),
}

pub(crate) struct TSpan {
    pub(crate) id: u128,
    pub(crate) parent: u128,
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// Python spans read before this one (its place in the unified read order).
    pub(crate) before: u64,
    pub(crate) trace: u32,
    pub(crate) resource: u32,
    pub(crate) attrs: u32,
    pub(crate) links: u32,
    pub(crate) n_attrs: u16,
    pub(crate) n_links: u16,
    pub(crate) name: u8,
    pub(crate) kind: u8,
    pub(crate) status: u8,
}

#[derive(Default)]
pub(crate) struct Strings {
    map: HashMap<Box<str>, u32, Fx>,
    pub(crate) list: Vec<Box<str>>,
}

impl Strings {
    pub(crate) fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.map.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.into());
        self.map.insert(s.into(), i);
        i
    }
    pub(crate) fn find(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }
    pub(crate) fn text(&self, i: u32) -> &str {
        &self.list[i as usize]
    }
}

pub(crate) struct Resource {
    pub(crate) service: Py<PyAny>,
    pub(crate) resource: Py<PyAny>,
    pub(crate) service_text: String,
}

/// The table's columns; the decoder appends to them (lib.rs, `Ctx::table_span`).
#[derive(Default)]
pub(crate) struct Data {
    pub(crate) spans: Vec<TSpan>,
    pub(crate) attrs: Vec<(u32, Val)>,
    pub(crate) elems: Vec<Val>,
    pub(crate) links: Vec<(u32, u128)>,
    pub(crate) strings: Strings,
    pub(crate) resources: Vec<Resource>,
    pub(crate) python_seen: u64,
}

/// Lengths to roll back to when a line is declined half-way.
pub(crate) struct Mark(pub(crate) [usize; 5]);

impl Data {
    pub(crate) fn mark(&self) -> Mark {
        Mark([
            self.spans.len(),
            self.attrs.len(),
            self.elems.len(),
            self.links.len(),
            self.resources.len(),
        ])
    }
    pub(crate) fn rollback(&mut self, m: &Mark) {
        self.spans.truncate(m.0[0]);
        self.attrs.truncate(m.0[1]);
        self.elems.truncate(m.0[2]);
        self.links.truncate(m.0[3]);
        self.resources.truncate(m.0[4]);
    }
    pub(crate) fn add_resource(
        &mut self,
        service: Py<PyAny>,
        resource: Py<PyAny>,
        service_text: String,
    ) -> u32 {
        self.resources.push(Resource {
            service,
            resource,
            service_text,
        });
        (self.resources.len() - 1) as u32
    }
    /// The value of attribute `key` (the last one when repeated: a dict keeps the last).
    pub(crate) fn attr(&self, s: &TSpan, key: Option<u32>) -> Option<Val> {
        let key = key?;
        let a = &self.attrs[s.attrs as usize..s.attrs as usize + usize::from(s.n_attrs)];
        a.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pack_and_unpack_losslessly() {
        for id in [
            "0123456789abcdef",
            "ffffffffffffffff",
            "0000000000000000",
            "ABCDEFabcdef0123",
        ] {
            let packed = pack_id(id);
            assert_ne!(packed, NO_ID);
            assert_eq!(&unpack_id(packed), id.as_bytes());
        }
    }

    #[test]
    fn packing_keeps_ids_apart_and_in_order() {
        let (a, b) = (pack_id("0000000000000001"), pack_id("0000000000000010"));
        assert_ne!(a, b);
        assert!(a < b); // big-endian: byte order is text order
        assert!(pack_id("~~~~~~~~~~~~~~~~") < NO_ID); // the largest ASCII id is not "no parent"
    }
}
