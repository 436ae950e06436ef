//! The JSON text of Iceberg values that JSON has no type for (dates, times, timestamps,
//! decimals, uuids, binary), as documented in `docs/types.md`.
//!
//! The schema stage decides whether a value fits a column with these functions, and the
//! batch stage encodes it with the same functions, so a value that is admitted always
//! encodes: there is no second opinion that could fail a batch at flush.

use chrono::{NaiveDate, NaiveTime};

/// Days since 1970-01-01 of `YYYY-MM-DD` (four-digit year, nothing else around it).
pub fn parse_date(s: &str) -> Option<i32> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(
        digits(&b[0..4])? as i32,
        digits(&b[5..7])?,
        digits(&b[8..10])?,
    )?;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from(date.signed_duration_since(epoch).num_days()).ok()
}

/// Microseconds since midnight of `HH:MM:SS` with an optional fraction of 1 to 9 digits
/// (digits past the sixth are dropped: Iceberg times are microseconds).
pub fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let (h, m, sec) = (digits(&b[0..2])?, digits(&b[3..5])?, digits(&b[6..8])?);
    let micros = fraction_micros(&s[8..])?;
    NaiveTime::from_hms_opt(h, m, sec)?;
    Some(((h as i64 * 60 + m as i64) * 60 + sec as i64) * 1_000_000 + micros)
}

/// The shape of an ISO-8601 date-time string: `Some(true)` with an offset (`Z`,
/// `+02:00`, `+0200`), `Some(false)` without one, `None` if it is not a valid date-time
/// (`YYYY-MM-DD` then `T` or a space, `HH:MM:SS`, an optional fraction of 1 to 9 digits).
pub fn timestamp_shape(s: &str) -> Option<bool> {
    parse_timestamp_parts(s).map(|(_, offset)| offset.is_some())
}

/// Microseconds since the epoch (UTC) of an ISO-8601 date-time; `with_offset` says
/// whether the text must carry an offset (timestamptz) or must not (timestamp).
pub fn parse_timestamp(s: &str, with_offset: bool) -> Option<i64> {
    let (local_micros, offset) = parse_timestamp_parts(s)?;
    if offset.is_some() != with_offset {
        return None;
    }
    local_micros.checked_sub(offset.unwrap_or(0) * 1_000_000)
}

/// Like [`parse_timestamp`], in nanoseconds (for `timestamp_ns` columns).
pub fn parse_timestamp_nanos(s: &str, with_offset: bool) -> Option<i64> {
    let (local_micros, offset) = parse_timestamp_parts(s)?;
    if offset.is_some() != with_offset {
        return None;
    }
    let frac = s[19..]
        .strip_prefix('.')
        .map(|f| {
            f.bytes()
                .take_while(u8::is_ascii_digit)
                .collect::<Vec<u8>>()
        })
        .unwrap_or_default();
    let nanos_below_micro = frac
        .get(6..9)
        .map(|d| {
            let mut v = 0i64;
            for (i, c) in d.iter().enumerate() {
                v += i64::from(c - b'0') * 10i64.pow(2 - i as u32);
            }
            v
        })
        .unwrap_or(0);
    local_micros
        .checked_sub(offset.unwrap_or(0) * 1_000_000)?
        .checked_mul(1000)?
        .checked_add(nanos_below_micro)
}

/// Local microseconds since the epoch and the offset in seconds, if any.
fn parse_timestamp_parts(s: &str) -> Option<(i64, Option<i64>)> {
    let b = s.as_bytes();
    // Byte 19 must start a character: text such as `2024-01-01T23:59:6Н` would
    // otherwise be cut inside a character, which panics (and a record that panics the
    // intake is read again at every restart).
    if b.len() < 19 || !matches!(b[10], b'T' | b' ') || !s.is_char_boundary(19) {
        return None;
    }
    let days = parse_date(&s[0..10])? as i64;
    let time = parse_time_of_day(&s[11..19])?;
    let rest = &s[19..];
    let (frac, tail) = match rest.strip_prefix('.') {
        Some(f) => {
            let n = f.bytes().take_while(u8::is_ascii_digit).count();
            (&rest[..n + 1], &f[n..])
        }
        None => ("", rest),
    };
    let micros = fraction_micros(frac)?;
    let offset = match tail.as_bytes() {
        [] => None,
        [b'Z' | b'z'] => Some(0),
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] | [sign @ (b'+' | b'-'), h1, h2, m1, m2] => {
            let h = digits(&[*h1, *h2])? as i64;
            let m = digits(&[*m1, *m2])? as i64;
            if h >= 24 || m >= 60 {
                return None;
            }
            let seconds = h * 3600 + m * 60;
            Some(if *sign == b'-' { -seconds } else { seconds })
        }
        _ => return None,
    };
    let local = (days * 86_400 + time) * 1_000_000 + micros;
    Some((local, offset))
}

/// Seconds since midnight of exactly `HH:MM:SS` (no leap second).
fn parse_time_of_day(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let (h, m, sec) = (digits(&b[0..2])?, digits(&b[3..5])?, digits(&b[6..8])?);
    NaiveTime::from_hms_opt(h, m, sec)?;
    Some((h as i64 * 60 + m as i64) * 60 + sec as i64)
}

/// `""` or `.` followed by 1 to 9 digits -> microseconds (digits past six dropped).
fn fraction_micros(f: &str) -> Option<i64> {
    if f.is_empty() {
        return Some(0);
    }
    let d = f.strip_prefix('.')?.as_bytes();
    if d.is_empty() || d.len() > 9 || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut micros = 0i64;
    for i in 0..6 {
        micros = micros * 10 + d.get(i).map_or(0, |c| i64::from(c - b'0'));
    }
    Some(micros)
}

/// ASCII digits as a number (no sign, no spaces).
fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The unscaled value of a decimal written as a JSON number or string (`-12.50`,
/// `1.5e2`), if it has at most `scale` fraction digits and fits `precision` digits.
pub fn parse_decimal(text: &str, precision: u32, scale: u32) -> Option<i128> {
    let (negative, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], body[at + 1..].parse::<i32>().ok()?),
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // All digits, and how many of them are after the point once the exponent applies.
    let mut digits_all: String = int.chars().chain(frac.chars()).collect();
    let mut frac_digits = frac.len() as i64 - exponent as i64;
    // Trailing zeros past the scale do not change the value.
    while frac_digits > scale as i64 && digits_all.ends_with('0') {
        digits_all.pop();
        frac_digits -= 1;
    }
    let digits_all = digits_all.trim_start_matches('0');
    if frac_digits > scale as i64 {
        return None;
    }
    // Scale up to exactly `scale` fraction digits.
    let pad = (scale as i64 - frac_digits) as usize;
    if digits_all.len() + pad > precision as usize {
        return (digits_all.is_empty()).then_some(0);
    }
    let mut unscaled: i128 = 0;
    for c in digits_all.bytes() {
        unscaled = unscaled
            .checked_mul(10)?
            .checked_add(i128::from(c - b'0'))?;
    }
    for _ in 0..pad {
        unscaled = unscaled.checked_mul(10)?;
    }
    Some(if negative { -unscaled } else { unscaled })
}

/// The 16 bytes of a uuid in its canonical hyphenated form (36 characters).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    if s.len() != 36 {
        return None;
    }
    uuid::Uuid::try_parse(s).ok().map(|u| *u.as_bytes())
}

/// Bytes of an even-length hex string (either case).
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            Some((hi * 16 + lo) as u8)
        })
        .collect()
}

/// The floats JSON has no number for, written as strings: `NaN`, `inf`, `-inf`.
pub fn special_float(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Microseconds since the epoch from milliseconds, `None` when it does not fit
/// (a hostile or broken timestamp must not overflow).
pub fn millis_to_micros(ms: i64) -> Option<i64> {
    ms.checked_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_with_a_multibyte_character_where_the_seconds_end_is_not_a_timestamp() {
        // Slicing at byte 19 would cut inside `Н` (the input of
        // `fuzz/seeds/json_admission/crash-timestamp-char-boundary.ndjson`).
        for s in [
            "2024-01-01T23:59:6\u{41d}",
            "2024-01-01T23:59:\u{41d}Z",
            "2024-01-01T23:5\u{e9}",
        ] {
            assert_eq!(timestamp_shape(s), None, "{s}");
            assert_eq!(parse_timestamp(s, true), None, "{s}");
            assert_eq!(parse_timestamp_nanos(s, false), None, "{s}");
        }
    }

    #[test]
    fn dates_are_strict() {
        assert_eq!(parse_date("1970-01-02"), Some(1));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        for bad in [
            "70-01-01",
            " 1970-01-01",
            "1970-1-01",
            "1970-02-30",
            "1970-01-01T",
            "+970-01-01",
        ] {
            assert_eq!(parse_date(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn times_and_timestamps() {
        assert_eq!(parse_time("00:00:01.5"), Some(1_500_000));
        assert_eq!(parse_time("23:59:59.123456789"), Some(86_399_123_456));
        for bad in [
            "24:00:00",
            "12:00:60",
            "1:00:00",
            "12:00:00.",
            "12:00:00.1234567890",
            " 12:00:00",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:01Z", true),
            Some(1_000_000)
        );
        assert_eq!(parse_timestamp("1970-01-01 01:00:00+01:00", true), Some(0));
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:00-0130", true),
            Some(5_400_000_000)
        );
        assert_eq!(
            parse_timestamp("2024-01-02T03:04:05.123456", false),
            Some(1_704_164_645_123_456)
        );
        assert_eq!(
            parse_timestamp("2024-01-02T03:04:05", true),
            None,
            "no offset"
        );
        assert_eq!(
            parse_timestamp("2024-01-02T03:04:05Z", false),
            None,
            "offset"
        );
        for bad in [
            "2024-01-02T03:04:60Z",
            "2024-01-02T24:00:00Z",
            "2024-01-02T03:04:05+24:00",
            " 2024-01-02T03:04:05Z",
            "2024-01-02T03:04:05ZZ",
            "2024-01-02X03:04:05Z",
            "999-01-02T03:04:05Z",
        ] {
            assert_eq!(timestamp_shape(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_timestamp_nanos("1970-01-01T00:00:00.000000123Z", true),
            Some(123)
        );
        assert_eq!(millis_to_micros(i64::MAX), None);
    }

    #[test]
    fn decimals_fit_or_not() {
        assert_eq!(parse_decimal("12.50", 18, 2), Some(1250));
        assert_eq!(parse_decimal("-0.5", 3, 2), Some(-50));
        assert_eq!(parse_decimal("3.1", 18, 2), Some(310));
        assert_eq!(parse_decimal("1.5e2", 5, 2), Some(15000));
        assert_eq!(
            parse_decimal("1.230", 5, 2),
            Some(123),
            "trailing zeros past the scale"
        );
        assert_eq!(
            parse_decimal("1.999", 18, 2),
            None,
            "too many fraction digits"
        );
        assert_eq!(parse_decimal("1000", 5, 2), None, "too many integer digits");
        assert_eq!(parse_decimal("999.99", 5, 2), Some(99999));
        assert_eq!(parse_decimal("0", 1, 0), Some(0));
        assert_eq!(parse_decimal("0.00", 1, 0), Some(0));
        for bad in ["", "-", ".", "1.2.3", "abc", "1e", "0x10", " 1"] {
            assert_eq!(parse_decimal(bad, 10, 2), None, "{bad:?}");
        }
    }

    #[test]
    fn uuid_and_hex() {
        assert!(parse_uuid("5f0c6f2e-8d7a-4a1b-9c3e-0b1d2e3f4a5b").is_some());
        assert!(parse_uuid("5f0c6f2e8d7a4a1b9c3e0b1d2e3f4a5b").is_none());
        assert_eq!(parse_hex("00fF10"), Some(vec![0, 255, 16]));
        assert_eq!(parse_hex("0"), None);
        assert_eq!(parse_hex("zz"), None);
    }
}
