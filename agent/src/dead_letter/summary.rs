//! One log line per distinct reason and commit interval for the records sent to the
//! dead letters, with how many there were.
//!
//! A reason's *kind* is its text with what differs from record to record masked: runs of
//! digits become `#`, text in backticks or double quotes becomes `…`. Records with the
//! same stage and kind share a line, which names where the first of them was read (the
//! dead-letter file has the full reason). The line shows no part of a record's value
//! that a reason quotes. At most [`MAX_REASONS`] kinds are kept per interval; records of
//! further kinds are counted together.

use crate::record::Message;

/// Distinct stage and reason kinds kept per interval.
pub const MAX_REASONS: usize = 16;

/// Characters of a reason kind kept (the rest is cut, ending in `…`).
const MAX_KIND_CHARS: usize = 160;

/// The records of one stage and reason kind in an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// The stage that rejected them (`decode`, `transform`, `schema`, `key`).
    pub stage: &'static str,
    /// The reason with what differs per record masked ([`reason_kind`]).
    pub kind: String,
    /// How many records.
    pub records: u64,
    /// Where the first of them was read: `topic/partition@offset`.
    pub first: String,
}

/// The dead letters of the current interval, by stage and reason kind.
#[derive(Debug, Default)]
pub struct Summary {
    reasons: Vec<Reason>,
    /// Records whose kind found no room in `reasons`.
    others: u64,
}

impl Summary {
    /// Counts one record sent to the dead letters by `stage` for `reason`.
    pub fn add(&mut self, stage: &'static str, reason: &str, record: &Message) {
        let kind = reason_kind(reason);
        if let Some(r) = self
            .reasons
            .iter_mut()
            .find(|r| r.stage == stage && r.kind == kind)
        {
            r.records += 1;
        } else if self.reasons.len() < MAX_REASONS {
            self.reasons.push(Reason {
                stage,
                kind,
                records: 1,
                first: format!("{}/{}@{}", record.topic, record.partition, record.offset),
            });
        } else {
            self.others += 1;
        }
    }

    /// The interval's reasons in the order they first came, and the number of records
    /// of reasons that found no room; the summary starts over.
    pub fn take(&mut self) -> (Vec<Reason>, u64) {
        (
            std::mem::take(&mut self.reasons),
            std::mem::take(&mut self.others),
        )
    }

    /// Logs a warning per reason of the interval (none without dead letters) and starts
    /// over.
    pub fn log(&mut self, pipeline: &str) {
        let (reasons, others) = self.take();
        for r in reasons {
            tracing::warn!(
                pipeline = %pipeline,
                stage = %r.stage,
                reason = ?r.kind,
                first = %r.first,
                "dead-lettered {}",
                records(r.records)
            );
        }
        if others > 0 {
            tracing::warn!(
                pipeline = %pipeline,
                "dead-lettered {} for more than {MAX_REASONS} other reasons",
                records(others)
            );
        }
    }
}

fn records(n: u64) -> String {
    if n == 1 {
        "1 record".into()
    } else {
        format!("{n} records")
    }
}

/// `reason` with the parts that differ from record to record masked: digit runs become
/// `#`, text in backticks or double quotes becomes `…`; cut at 160 characters.
pub fn reason_kind(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_KIND_CHARS + 4));
    let mut chars = reason.chars().peekable();
    let mut kept = 0;
    while let Some(c) = chars.next() {
        if kept >= MAX_KIND_CHARS {
            out.push('…');
            break;
        }
        match c {
            '0'..='9' => {
                while chars.next_if(char::is_ascii_digit).is_some() {}
                out.push('#');
            }
            '`' | '"' => {
                // An unclosed quote masks the rest.
                while chars.next_if(|&n| n != c).is_some() {}
                out.push(c);
                out.push('…');
                if chars.next().is_some() {
                    out.push(c);
                }
            }
            c => out.push(c),
        }
        kept += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn message(offset: i64) -> Message {
        Message {
            topic: Arc::from("events"),
            partition: 3,
            offset,
            timestamp_ms: None,
            key: None,
            value: Some(b"{".to_vec()),
            headers: Vec::new(),
        }
    }

    #[test]
    fn kinds_mask_what_differs_per_record() {
        assert_eq!(
            reason_kind("value is not valid JSON: expected ':' after a key at byte 17"),
            "value is not valid JSON: expected ':' after a key at byte #"
        );
        assert_eq!(
            reason_kind("key field `user_id` is missing or null"),
            "key field `…` is missing or null"
        );
        assert_eq!(
            reason_kind(r#"routed to stream "audit", which has no table"#),
            r#"routed to stream "…", which has no table"#
        );
        assert_eq!(reason_kind("unclosed `quote 12"), "unclosed `…");
        let long = reason_kind(&"x".repeat(1000));
        assert_eq!(long.chars().count(), MAX_KIND_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn records_group_by_stage_and_kind_in_order_of_arrival() {
        let mut s = Summary::default();
        s.add(
            "decode",
            "value is not valid JSON: invalid literal at byte 0",
            &message(7),
        );
        s.add("schema", "field `a` is a string", &message(8));
        s.add(
            "decode",
            "value is not valid JSON: invalid literal at byte 12",
            &message(9),
        );
        s.add("key", "field `a` is a string", &message(10));
        let (reasons, others) = s.take();
        assert_eq!(others, 0);
        let seen: Vec<(&str, &str, u64, &str)> = reasons
            .iter()
            .map(|r| (r.stage, r.kind.as_str(), r.records, r.first.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "decode",
                    "value is not valid JSON: invalid literal at byte #",
                    2,
                    "events/3@7"
                ),
                ("schema", "field `…` is a string", 1, "events/3@8"),
                ("key", "field `…` is a string", 1, "events/3@10"),
            ]
        );
        // Taken: the next interval starts empty.
        assert_eq!(s.take(), (Vec::new(), 0));
    }

    #[test]
    fn distinct_reasons_are_capped_per_interval() {
        let mut s = Summary::default();
        for i in 0..(MAX_REASONS + 5) {
            // A letter per reason: digits would be masked into one kind.
            let reason = format!("plugin p{}: failed", char::from(b'a' + i as u8));
            s.add("transform", &reason, &message(i as i64));
            s.add("transform", &reason, &message(i as i64));
        }
        let (reasons, others) = s.take();
        assert_eq!(reasons.len(), MAX_REASONS);
        assert!(reasons.iter().all(|r| r.records == 2));
        assert_eq!(others, 10);
    }

    /// A writer that keeps what the log subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn one_warning_per_reason_with_its_count() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let mut s = Summary::default();
            for offset in 0..12 {
                s.add(
                    "decode",
                    &format!("value is not valid JSON: at byte {offset}"),
                    &message(offset),
                );
            }
            s.add("schema", "field `a` is a string", &message(12));
            s.log("p");
            // Nothing since: nothing logged.
            s.log("p");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with(" WARN"), "{text}");
        assert!(
            lines[0].contains(
                "dead-lettered 12 records pipeline=p stage=decode \
                 reason=\"value is not valid JSON: at byte #\" first=events/3@0"
            ),
            "{text}"
        );
        assert!(lines[1].contains("dead-lettered 1 record "), "{text}");
    }
}
