//! A hand-written reader for the usual shape of an OTLP/JSON line, in front of `serde_json`.
//!
//! serde's derived visitors cost ~20 instructions per byte of these lines (an `Option`, a
//! field match and a `Vec` growth for every attribute of every span); this reader makes the
//! very same borrowed structs (`Export` and below) in one pass. It is only a fast path:
//! whenever a line holds anything whose reading it would have to reproduce from serde rather
//! than just follow — a `null`, a backslash escape or control character in a string, a
//! duplicate known key, a number outside plain digits where an integer is wanted, `-0`, a
//! `kvlistValue`/`bytesValue`, a nested array value, nesting deeper than serde allows — it
//! gives up (`None`) and `serde_json::from_str` reads the line as before. So serde stays the
//! definition of what a line means; `tests/analysis/test_native_decoder.py` decodes every
//! line both ways (`spans_from_line(..., scan=False)`) and requires identical results.
//!
//! What it does follow exactly as serde does: unknown keys are skipped (their values must
//! be valid JSON), missing optional fields are `None`, missing required ones fail, JSON
//! whitespace, trailing content after the document, and numbers (strict JSON grammar;
//! doubles correctly rounded by `str::parse::<f64>`, as serde's `float_roundtrip` is).

use std::borrow::Cow;

use serde::de::IgnoredAny;

use crate::{
    AnyValue, ArrayValue, Element, Export, IntOrStr, KeyValue, Obj, RawLink, RawSpan, Resource,
    ResourceSpans, ScopeSpans, Status, Value,
};

/// Give up: serde reads the line.
struct GiveUp;

type R<T> = Result<T, GiveUp>;

/// serde_json refuses nesting deeper than 128; skipped values give up well before that.
const MAX_DEPTH: usize = 100;

/// Whether the fast path reads `data` (for the tests: a line it gives up on is still read,
/// by serde).
#[pyo3::pyfunction]
pub fn scans(data: &[u8]) -> bool {
    std::str::from_utf8(data).is_ok_and(|text| export(text).is_some())
}

/// The document of one line, or `None` when serde must read it.
pub(crate) fn export(text: &str) -> Option<Obj<Export<'_>>> {
    let mut s = Scanner {
        text,
        bytes: text.as_bytes(),
        i: 0,
    };
    let doc = s.export().ok()?;
    s.ws();
    (s.i == s.bytes.len()).then_some(doc)
}

/// The high bit of each byte of `x` that is a quote, a backslash or a control character.
#[inline]
fn stops(x: u64) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    let ctrl = x.wrapping_sub(ONES * 0x20) & !x;
    let quote = x ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let slash = x ^ (ONES * u64::from(b'\\'));
    let slash = slash.wrapping_sub(ONES) & !slash;
    (ctrl | quote | slash) & (ONES << 7)
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    i: usize,
}

/// Sets a field once; a second time is serde's "duplicate field" error.
fn once<T>(slot: &mut Option<T>, value: T) -> R<()> {
    if slot.is_some() {
        return Err(GiveUp);
    }
    *slot = Some(value);
    Ok(())
}

impl<'a> Scanner<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.i) {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes.get(self.i).copied()
    }

    #[inline]
    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// A string without escapes or control characters, borrowed from the line.
    fn string(&mut self) -> R<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let bytes = self.bytes;
        // Eight bytes at a time (as serde_json does): stop at a quote, a backslash or a
        // control character.
        let mut k = start;
        while k + 8 <= bytes.len() {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[k..k + 8]);
            let hit = stops(u64::from_le_bytes(word));
            if hit != 0 {
                return self.string_end(start, k + hit.trailing_zeros() as usize / 8);
            }
            k += 8;
        }
        while k < bytes.len() && !matches!(bytes[k], b'"' | b'\\' | 0..=0x1f) {
            k += 1;
        }
        self.string_end(start, k)
    }

    #[inline]
    fn string_end(&mut self, start: usize, end: usize) -> R<&'a str> {
        if self.bytes.get(end) != Some(&b'"') {
            return Err(GiveUp); // an escape, a control character, or the end of the line
        }
        self.i = end + 1;
        // SAFETY: `text` is valid UTF-8 and both ends sit next to an ASCII quote, which is
        // always a character boundary.
        Ok(unsafe { self.text.get_unchecked(start..end) })
    }

    /// The members of an object: `member(self, key)` reads each value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> R<()>) -> R<()> {
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(GiveUp),
            }
        }
    }

    /// The elements of an array, each read by `item`, with room for `room` of them up
    /// front (a vector grown from empty moved its elements four or five times a span).
    fn array<T>(&mut self, room: usize, mut item: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        self.eat(b'[')?;
        let mut out = Vec::with_capacity(room);
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(out);
                }
                _ => return Err(GiveUp),
            }
        }
    }

    /// The text of a number in strict JSON grammar.
    fn number(&mut self) -> R<&'a str> {
        self.ws();
        let start = self.i;
        let b = self.bytes;
        let digits = |i: &mut usize| {
            let from = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > from
        };
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return Err(GiveUp),
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return Err(GiveUp);
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            if !digits(&mut i) {
                return Err(GiveUp);
            }
        }
        self.i = i;
        self.text.get(start..i).ok_or(GiveUp)
    }

    /// An unknown member's value, which serde skips but still requires to be valid JSON.
    fn skip(&mut self, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        match self.peek() {
            Some(b'{') => self.object(|s, _| s.skip(depth + 1)),
            Some(b'[') => self.array(0, |s| s.skip(depth + 1)).map(drop),
            Some(b'"') => self.string().map(drop),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            _ => self.number().map(drop),
        }
    }

    fn literal(&mut self, word: &str) -> R<()> {
        if self.bytes[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    fn boolean(&mut self) -> R<bool> {
        match self.peek() {
            Some(b't') => self.literal("true").map(|()| true),
            Some(b'f') => self.literal("false").map(|()| false),
            _ => Err(GiveUp),
        }
    }

    /// An integer or a string of one: plain digits only (serde's integer edge cases — a
    /// sign, a fraction, an exponent, beyond `i64` — are serde's to read).
    fn int_or_str(&mut self) -> R<IntOrStr<'a>> {
        if self.peek() == Some(b'"') {
            return Ok(IntOrStr::Str(Cow::Borrowed(self.string()?)));
        }
        let text = self.number()?;
        if text.len() > 18 || !text.bytes().all(|c| c.is_ascii_digit()) {
            return Err(GiveUp);
        }
        text.parse().map(IntOrStr::Int).map_err(|_| GiveUp)
    }

    /// A double: serde_json reads `-0` as the integer 0, so it is left to serde.
    fn double(&mut self) -> R<f64> {
        let text = self.number()?;
        if text == "-0" {
            return Err(GiveUp);
        }
        let x: f64 = text.parse().map_err(|_| GiveUp)?;
        if x.is_finite() {
            Ok(x)
        } else {
            Err(GiveUp) // serde_json: "number out of range"
        }
    }

    fn cow(&mut self) -> R<Cow<'a, str>> {
        self.string().map(Cow::Borrowed)
    }

    fn export(&mut self) -> R<Obj<Export<'a>>> {
        let mut resource_spans = None;
        self.object(|s, key| match key {
            "resourceSpans" => once(&mut resource_spans, s.array(2, Self::resource_spans)?),
            _ => s.skip(1),
        })?;
        Ok(Obj(Export {
            resource_spans: resource_spans.map(Some),
        }))
    }

    fn resource_spans(&mut self) -> R<Obj<ResourceSpans<'a>>> {
        let (mut resource, mut scope_spans, mut library_spans) = (None, None, None);
        self.object(|s, key| match key {
            "resource" => once(&mut resource, s.resource()?),
            "scopeSpans" => once(&mut scope_spans, s.array(2, Self::scope_spans)?),
            "instrumentationLibrarySpans" => {
                once(&mut library_spans, s.array(2, Self::scope_spans)?)
            }
            _ => s.skip(1),
        })?;
        Ok(Obj(ResourceSpans {
            resource,
            scope_spans,
            library_spans,
        }))
    }

    fn resource(&mut self) -> R<Obj<Resource<'a>>> {
        let mut attributes = None;
        self.object(|s, key| match key {
            "attributes" => once(&mut attributes, s.array(8, Self::key_value)?),
            _ => s.skip(1),
        })?;
        Ok(Obj(Resource { attributes }))
    }

    fn scope_spans(&mut self) -> R<Obj<ScopeSpans<'a>>> {
        let mut spans = None;
        self.object(|s, key| match key {
            "spans" => once(&mut spans, s.array(64, Self::span)?),
            _ => s.skip(1),
        })?;
        Ok(Obj(ScopeSpans { spans }))
    }

    fn span(&mut self) -> R<Obj<RawSpan<'a>>> {
        let (mut trace_id, mut span_id, mut name, mut start, mut end) =
            (None, None, None, None, None);
        let (mut parent, mut kind, mut status, mut attributes, mut links) =
            (None, None, None, None, None);
        self.object(|s, key| match key {
            "traceId" => once(&mut trace_id, s.cow()?),
            "spanId" => once(&mut span_id, s.cow()?),
            "name" => once(&mut name, s.cow()?),
            "startTimeUnixNano" => once(&mut start, s.int_or_str()?),
            "endTimeUnixNano" => once(&mut end, s.int_or_str()?),
            "parentSpanId" => once(&mut parent, s.cow()?),
            "kind" => once(&mut kind, s.int_or_str()?),
            "status" => once(&mut status, s.status()?),
            "attributes" => once(&mut attributes, s.array(16, Self::key_value)?),
            "links" => once(&mut links, s.array(32, Self::link)?),
            _ => s.skip(1),
        })?;
        Ok(Obj(RawSpan {
            trace_id: trace_id.ok_or(GiveUp)?,
            span_id: span_id.ok_or(GiveUp)?,
            name: name.ok_or(GiveUp)?,
            start: start.ok_or(GiveUp)?,
            end: end.ok_or(GiveUp)?,
            parent,
            kind,
            status,
            attributes,
            links,
        }))
    }

    fn status(&mut self) -> R<Obj<Status<'a>>> {
        let mut code = None;
        self.object(|s, key| match key {
            "code" => once(&mut code, s.int_or_str()?),
            _ => s.skip(1),
        })?;
        Ok(Obj(Status { code }))
    }

    fn link(&mut self) -> R<Obj<RawLink<'a>>> {
        let (mut trace_id, mut span_id) = (None, None);
        self.object(|s, key| match key {
            "traceId" => once(&mut trace_id, s.cow()?),
            "spanId" => once(&mut span_id, s.cow()?),
            _ => s.skip(1),
        })?;
        Ok(Obj(RawLink {
            trace_id: trace_id.ok_or(GiveUp)?,
            span_id: span_id.ok_or(GiveUp)?,
        }))
    }

    fn key_value(&mut self) -> R<Obj<KeyValue<'a>>> {
        let (mut key, mut value) = (None, None);
        self.object(|s, k| match k {
            "key" => once(&mut key, s.cow()?),
            "value" => once(&mut value, s.value()?),
            _ => s.skip(1),
        })?;
        Ok(Obj(KeyValue {
            key: key.ok_or(GiveUp)?,
            value: value.ok_or(GiveUp)?,
        }))
    }

    fn value(&mut self) -> R<Obj<Value<'a>>> {
        let mut array = None;
        let v = self.any_value(|s| once(&mut array, s.array_value()?))?;
        Ok(Obj(AnyValue { array, ..v }))
    }

    fn element(&mut self) -> R<Obj<Element<'a>>> {
        // A nested array is declined by the decoder anyway: serde's to read.
        self.any_value(|_| Err(GiveUp)).map(Obj)
    }

    /// The scalar members of an `AnyValue`; `array` reads an `arrayValue`.
    fn any_value<A>(&mut self, mut array: impl FnMut(&mut Self) -> R<()>) -> R<AnyValue<'a, A>> {
        let (mut string, mut int, mut double, mut boolean) = (None, None, None, None);
        self.object(|s, key| match key {
            "stringValue" => once(&mut string, s.cow()?),
            "intValue" => once(&mut int, s.int_or_str()?),
            "doubleValue" => once(&mut double, s.double()?),
            "boolValue" => once(&mut boolean, s.boolean()?),
            "arrayValue" => array(s),
            "kvlistValue" | "bytesValue" => Err(GiveUp), // declined by the decoder: serde's
            _ => s.skip(1),
        })?;
        Ok(AnyValue {
            string,
            int,
            double,
            boolean,
            array: None,
            kvlist: None::<IgnoredAny>,
            bytes: None,
        })
    }

    fn array_value(&mut self) -> R<Obj<ArrayValue<'a>>> {
        let mut values = None;
        self.object(|s, key| match key {
            "values" => once(&mut values, s.array(8, Self::element)?),
            _ => s.skip(1),
        })?;
        Ok(Obj(ArrayValue { values }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: &str = r#"{"traceId":"0123456789abcdef0123456789abcdef","spanId":"0123456789abcdef","name":"llm.step","startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;

    fn line(span: &str) -> String {
        format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{span}]}}]}}]}}"#)
    }

    fn spans(text: &str) -> Option<usize> {
        let doc = export(text)?;
        let rss = doc.0.resource_spans.flatten().unwrap_or_default();
        Some(
            rss.iter()
                .flat_map(|rs| rs.scope_spans.iter().flatten())
                .map(|ss| ss.spans.as_ref().map_or(0, Vec::len))
                .sum(),
        )
    }

    #[test]
    fn reads_a_plain_line_with_whitespace_and_trailing_whitespace() {
        assert_eq!(spans(&line(SPAN)), Some(1));
        assert_eq!(spans(&format!(" \t{}\r\n ", line(SPAN))), Some(1));
        assert_eq!(spans(r#"{"resourceSpans": []}"#), Some(0));
    }

    #[test]
    fn skips_unknown_members_but_requires_them_to_be_json() {
        let text = r#"{"x": [1, {"y": -0.5e-3}, "z", null, true], "resourceSpans": []}"#;
        assert_eq!(spans(text), Some(0));
        assert!(export(r#"{"x": [1,, 2], "resourceSpans": []}"#).is_none());
        assert!(export(r#"{"x": tr, "resourceSpans": []}"#).is_none());
    }

    #[test]
    fn gives_up_on_what_serde_must_read() {
        // Trailing content, a duplicate known key, an escape, a null, a missing field.
        assert!(export(r#"{"resourceSpans": []} x"#).is_none());
        assert!(export(r#"{"resourceSpans": [], "resourceSpans": []}"#).is_none());
        assert!(export(&line(&SPAN.replace("llm.step", r"llm.\u0073tep"))).is_none());
        assert!(export(&line(
            &SPAN.replace(r#""name":"llm.step""#, r#""name":null"#)
        ))
        .is_none());
        assert!(export(&line(&SPAN.replace(r#","name":"llm.step""#, ""))).is_none());
        assert!(export(&line(SPAN)[..40]).is_none()); // cut off mid-line
    }

    #[test]
    fn integers_are_plain_digits_and_doubles_strict_json() {
        let time = |t: &str| line(&SPAN.replace(r#""1""#, t));
        assert!(export(&time("170000000000000000")).is_some());
        // A sign, a fraction, an exponent, a leading zero, 19 digits and more: serde's.
        for odd in ["-1", "1.0", "1e3", "01", "1700000000000000000"] {
            assert!(export(&time(odd)).is_none(), "{odd}");
        }
        let double = |d: &str| {
            let attrs = format!(r#","attributes":[{{"key":"d","value":{{"doubleValue":{d}}}}}]}}"#);
            line(&SPAN.replacen('}', &attrs, 1))
        };
        assert!(export(&double("0.25")).is_some());
        for odd in ["-0", "1e999", ".5", "1.", "+1"] {
            assert!(export(&double(odd)).is_none(), "{odd}");
        }
    }

    #[test]
    fn nesting_beyond_the_limit_gives_up() {
        let deep = format!(
            r#"{{"x": {}1{}, "resourceSpans": []}}"#,
            "[".repeat(MAX_DEPTH + 2),
            "]".repeat(MAX_DEPTH + 2)
        );
        assert!(export(&deep).is_none());
        let shallow = format!(
            r#"{{"x": {}1{}, "resourceSpans": []}}"#,
            "[".repeat(8),
            "]".repeat(8)
        );
        assert_eq!(spans(&shallow), Some(0));
    }

    #[test]
    fn stops_finds_quotes_backslashes_and_control_characters() {
        let word = |b: &[u8; 8]| stops(u64::from_le_bytes(*b));
        assert_eq!(word(b"abcdefgh"), 0);
        assert_eq!(word(b"abc\"efgh").trailing_zeros() / 8, 3);
        assert_eq!(word(b"\\bcdefgh").trailing_zeros() / 8, 0);
        assert_eq!(word(b"abcdefg\n").trailing_zeros() / 8, 7);
        assert_eq!(word("é€abc".as_bytes()[..8].try_into().unwrap()), 0); // UTF-8 is not a stop
    }
}
