//! Writing the JSON text of decoded records directly into a byte buffer (no DOM), with
//! the value conventions of the Avro path (`decode/avro/`, `docs/types.md`): bytes as
//! lowercase hex, timestamps as ISO-8601 UTC with `Z` and 6 fraction digits, exact
//! decimals as strings, NaN and infinities as the strings `"NaN"`, `"inf"`, `"-inf"`.

use chrono::DateTime;

/// Appends `s` as a JSON string (quoted and escaped).
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing JSON into a Vec cannot fail");
}

/// Appends an integer.
pub(crate) fn int(out: &mut Vec<u8>, n: impl itoa_like::Int) {
    n.write(out);
}

/// Appends a double; NaN and infinities as strings (JSON has no such numbers).
pub(crate) fn double(out: &mut Vec<u8>, f: f64) {
    if f.is_finite() {
        serde_json::to_writer(&mut *out, &f).expect("writing JSON into a Vec cannot fail");
    } else {
        non_finite(out, f.is_nan(), f > 0.0);
    }
}

/// Appends a float with its shortest round-trip text; NaN and infinities as strings.
pub(crate) fn float(out: &mut Vec<u8>, f: f32) {
    if f.is_finite() {
        serde_json::to_writer(&mut *out, &f).expect("writing JSON into a Vec cannot fail");
    } else {
        non_finite(out, f.is_nan(), f > 0.0);
    }
}

fn non_finite(out: &mut Vec<u8>, nan: bool, positive: bool) {
    out.extend_from_slice(match (nan, positive) {
        (true, _) => b"\"NaN\"",
        (false, true) => b"\"inf\"",
        (false, false) => b"\"-inf\"",
    });
}

/// Appends bytes as a lowercase hex JSON string.
pub(crate) fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2 + 2);
    out.push(b'"');
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize]);
        out.push(DIGITS[(b & 15) as usize]);
    }
    out.push(b'"');
}

/// Appends an instant (microseconds since the epoch) as `"YYYY-MM-DDTHH:MM:SS.ffffffZ"`;
/// `false` when it is out of chrono's range.
pub(crate) fn timestamp_micros(out: &mut Vec<u8>, us: i64) -> bool {
    let Some(t) = DateTime::from_timestamp_micros(us) else {
        return false;
    };
    use std::io::Write;
    write!(
        out,
        "\"{}Z\"",
        t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f")
    )
    .expect("writing into a Vec cannot fail");
    true
}

/// Integers that write their decimal text.
pub(crate) mod itoa_like {
    /// An integer type [`super::int`] accepts.
    pub trait Int {
        /// Appends the decimal text.
        fn write(self, out: &mut Vec<u8>);
    }

    macro_rules! ints {
        ($($t:ty),*) => {$(
            impl Int for $t {
                fn write(self, out: &mut Vec<u8>) {
                    serde_json::to_writer(&mut *out, &self).expect("writing JSON into a Vec cannot fail");
                }
            }
        )*};
    }
    ints!(i32, i64, u32, u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_follow_the_avro_conventions() {
        assert_eq!(text(|o| string(o, "a\"b\n")), r#""a\"b\n""#);
        assert_eq!(text(|o| hex(o, &[0, 255, 16])), r#""00ff10""#);
        assert_eq!(text(|o| double(o, 2.25)), "2.25");
        assert_eq!(text(|o| double(o, f64::NAN)), r#""NaN""#);
        assert_eq!(text(|o| double(o, f64::NEG_INFINITY)), r#""-inf""#);
        assert_eq!(text(|o| float(o, 1.1)), "1.1");
        assert_eq!(text(|o| float(o, f32::INFINITY)), r#""inf""#);
        assert_eq!(text(|o| int(o, -5i64)), "-5");
        assert_eq!(text(|o| int(o, u64::MAX)), "18446744073709551615");
        assert_eq!(
            text(|o| assert!(timestamp_micros(o, 1_704_164_645_123_456))),
            r#""2024-01-02T03:04:05.123456Z""#
        );
        assert!(!timestamp_micros(&mut Vec::new(), i64::MAX));
    }
}
