//! The JSON text the Chrome trace writer produces, byte for byte as the Python writer
//! (`llmtrace.analysis.perfetto`) produces it: two string escapings (`json.dumps`, ASCII
//! only, for names; msgspec's, UTF-8 kept, for attribute values), two float styles
//! (msgspec's for attribute values, Python's `repr` for the queue and KV counters) and the
//! exact microsecond timestamps.

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `s` escaped as `json.dumps(s)` escapes it (`ensure_ascii`), without the quotes.
pub(crate) fn push_ascii_escaped(out: &mut Vec<u8>, s: &str) {
    push_ascii_escaped_code_points(out, s.chars().map(u32::from));
}

/// Code points escaped as `json.dumps` escapes a string (`ensure_ascii`), without the
/// quotes: `"` and `\` and the short escapes, every other code point outside space..`~` as
/// `\uXXXX` (UTF-16 surrogate pairs above the BMP; a lone surrogate, which a Python string
/// may hold, as itself).
pub(crate) fn push_ascii_escaped_code_points(
    out: &mut Vec<u8>,
    code_points: impl Iterator<Item = u32>,
) {
    for c in code_points {
        match c {
            0x22 => out.extend_from_slice(b"\\\""),
            0x5c => out.extend_from_slice(b"\\\\"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0d => out.extend_from_slice(b"\\r"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x20..=0x7e => out.push(c as u8),
            0x10000.. => {
                let v = c - 0x10000;
                push_u_escape(out, 0xd800 | (v >> 10) as u16);
                push_u_escape(out, 0xdc00 | (v & 0x3ff) as u16);
            }
            _ => push_u_escape(out, c as u16),
        }
    }
}

/// `s` as msgspec's JSON encoder writes a string: quoted, `"` `\` and the control
/// characters escaped (the short forms where JSON has them), everything else as it is.
pub(crate) fn push_utf8_quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => push_u_escape(out, u16::from(b)),
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn push_u_escape(out: &mut Vec<u8>, unit: u16) {
    out.extend_from_slice(b"\\u");
    for shift in [12, 8, 4, 0] {
        out.push(HEX[usize::from((unit >> shift) & 0xf)]);
    }
}

/// `v` as `digits` lowercase hex digits (zero-padded; `v` fits them).
pub(crate) fn push_hex(out: &mut Vec<u8>, v: u128, digits: u32) {
    for shift in (0..digits).rev() {
        out.push(HEX[((v >> (shift * 4)) & 0xf) as usize]);
    }
}

/// An unsigned integer in decimal.
pub(crate) fn push_u128(out: &mut Vec<u8>, mut v: u128) {
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A signed integer in decimal.
pub(crate) fn push_i128(out: &mut Vec<u8>, v: i128) {
    if v < 0 {
        out.push(b'-');
    }
    push_u128(out, v.unsigned_abs());
}

/// Nanoseconds as microseconds with three decimals, every digit exact (`perfetto._us`).
pub(crate) fn push_us(out: &mut Vec<u8>, ns: i128) {
    if ns < 0 {
        out.push(b'-');
    }
    let v = ns.unsigned_abs();
    push_u128(out, v / 1000);
    let frac = (v % 1000) as u16;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// The shortest decimal digits that read back as `x` (finite, not zero, sign ignored) and
/// the position of the decimal point: `x = 0.DIGITS * 10^point`. From ryu, as msgspec's
/// own ryu and Python's `repr` choose them (on an exact tie, the even digit).
fn shortest(x: f64) -> ([u8; 24], usize, i32) {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(x.abs()).as_bytes();
    let (mantissa, exp) = match text.iter().position(|&b| b == b'e') {
        Some(e) => {
            let exp = std::str::from_utf8(&text[e + 1..])
                .ok()
                .and_then(|t| t.parse::<i32>().ok())
                .unwrap_or(0);
            (&text[..e], exp)
        }
        None => (text, 0),
    };
    let mut digits = [0u8; 24];
    let mut n = 0;
    let mut point = None;
    let mut lead = 0; // leading zeros after the point (0.0001 -> 3)
    for &b in mantissa {
        if b == b'.' {
            point = Some(n as i32);
        } else if n == 0 && b == b'0' {
            if point.is_some() {
                lead += 1;
            }
        } else if n < digits.len() {
            digits[n] = b;
            n += 1;
        }
    }
    let point = point.unwrap_or(n as i32);
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1; // "100.0" -> digits 1, point 3
    }
    (digits, n, point - lead + exp)
}

/// A double as msgspec's JSON encoder writes it (`msgspec/ryu.h`, `format_double`):
/// non-finite as `null`, integral values with `.0`, plain decimals for exponents -5..16,
/// else `1.5e-7` / `1e22` (no `+`, no padding).
pub(crate) fn push_msgspec_f64(out: &mut Vec<u8>, x: f64) {
    if !x.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    let Some((digits, length, point)) = sign_and_digits(out, x) else {
        return;
    };
    let d = &digits[..length];
    if (0..=16).contains(&point) && point as usize >= length {
        push_integral(out, d, point as usize - length);
    } else if 0 < point && point <= 16 {
        push_split(out, d, point as usize);
    } else if -5 < point && point <= 0 {
        push_below_one(out, d, (-point) as usize);
    } else {
        push_scientific_digits(out, d);
        push_i128(out, i128::from(point - 1));
    }
}

/// A finite double as Python's `repr` writes it: plain decimals for a decimal point
/// position -3..16, else `1e-05` / `1e+16` (sign always, two exponent digits at least).
pub(crate) fn push_repr_f64(out: &mut Vec<u8>, x: f64) {
    let Some((digits, length, point)) = sign_and_digits(out, x) else {
        return;
    };
    let d = &digits[..length];
    if point <= -4 || point > 16 {
        push_scientific_digits(out, d);
        let exp = point - 1;
        out.push(if exp < 0 { b'-' } else { b'+' });
        if exp.abs() < 10 {
            out.push(b'0');
        }
        push_u128(out, u128::from(exp.unsigned_abs()));
    } else if point <= 0 {
        push_below_one(out, d, (-point) as usize);
    } else if point as usize >= length {
        push_integral(out, d, point as usize - length);
    } else {
        push_split(out, d, point as usize);
    }
}

/// The sign of a finite `x`, then its [`shortest`] digits; a zero is written whole here
/// (`0.0`, `-0.0`, as both styles write it) and gives `None`.
fn sign_and_digits(out: &mut Vec<u8>, x: f64) -> Option<([u8; 24], usize, i32)> {
    if x.is_sign_negative() {
        out.push(b'-');
    }
    if x == 0.0 {
        out.extend_from_slice(b"0.0");
        return None;
    }
    Some(shortest(x))
}

/// `DDD000.0`: the digits, `zeros` zeros, `.0`.
fn push_integral(out: &mut Vec<u8>, d: &[u8], zeros: usize) {
    out.extend_from_slice(d);
    out.resize(out.len() + zeros, b'0');
    out.extend_from_slice(b".0");
}

/// `DD.DDD`: the point after `at` digits.
fn push_split(out: &mut Vec<u8>, d: &[u8], at: usize) {
    out.extend_from_slice(&d[..at]);
    out.push(b'.');
    out.extend_from_slice(&d[at..]);
}

/// `0.000DDD`: `zeros` zeros after the point, then the digits.
fn push_below_one(out: &mut Vec<u8>, d: &[u8], zeros: usize) {
    out.extend_from_slice(b"0.");
    out.resize(out.len() + zeros, b'0');
    out.extend_from_slice(d);
}

/// `D.DDDe` (`De` for one digit): scientific notation up to its exponent.
fn push_scientific_digits(out: &mut Vec<u8>, d: &[u8]) {
    out.push(d[0]);
    if d.len() > 1 {
        out.push(b'.');
        out.extend_from_slice(&d[1..]);
    }
    out.push(b'e');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl Fn(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_as_msgspec_writes_them() {
        let cases = [
            (1e-05, "0.00001"),
            (1e16, "1e16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e17"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e308"),
            (1e-7, "1e-7"),
            (12345.678, "12345.678"),
            (f64::NAN, "null"),
            (f64::INFINITY, "null"),
        ];
        for (x, want) in cases {
            assert_eq!(want, text(|o| push_msgspec_f64(o, x)), "{x}");
        }
    }

    #[test]
    fn floats_as_python_repr_writes_them() {
        let cases = [
            (1e-05, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.1, "0.1"),
            (3.0, "3.0"),
            (-2.5e-300, "-2.5e-300"),
            (1e22, "1e+22"),
            (0.0, "0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(want, text(|o| push_repr_f64(o, x)), "{x}");
        }
    }

    #[test]
    fn strings_escaped_both_ways() {
        let s = "é\u{7f}\u{2028}\0\n\"\\\u{1F600}";
        assert_eq!(
            r#""\u00e9\u007f\u2028\u0000\n\"\\\ud83d\ude00""#,
            text(|o| {
                o.push(b'"');
                push_ascii_escaped(o, s);
                o.push(b'"');
            })
        );
        assert_eq!(
            "\"é\u{7f}\u{2028}\\u0000\\n\\\"\\\\\u{1F600}\"",
            text(|o| push_utf8_quoted(o, s))
        );
    }

    #[test]
    fn microseconds_keep_every_digit() {
        assert_eq!("1.005", text(|o| push_us(o, 1005)));
        assert_eq!("-0.002", text(|o| push_us(o, -2)));
        assert_eq!("18446744073709551.616", text(|o| push_us(o, 1i128 << 64)));
    }
}
