use super::*;

fn rec(offset: i64, value: &[u8]) -> Message {
    Message {
        topic: Arc::from("t"),
        partition: 2,
        offset,
        timestamp_ms: Some(5),
        key: Some(b"k".to_vec()),
        value: Some(value.to_vec()),
        headers: Vec::new(),
    }
}

fn resume(offset: i64) -> PartitionMap<i64> {
    PartitionMap::from_iter([((Arc::from("t"), 2), offset)])
}

/// A file in `dir` rotated past 4 KiB, with at most `max_files` rotated files.
fn rotating(dir: &Path, max_files: u32) -> DeadLetterConfig {
    DeadLetterConfig {
        max_file_size: 4096,
        max_files,
        ..DeadLetterConfig::at(dir.join("p.ndjson"))
    }
}

/// The permission bits of `path`.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn keeps_original_bytes_and_skips_redeliveries_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("dl/p.ndjson"));
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(w.write(&rec(7, b"\xff{bad"), "decode", "not JSON").unwrap());
    w.sync().unwrap();
    drop(w);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(
        !w.write(&rec(7, b"\xff{bad"), "decode", "not JSON").unwrap(),
        "same offset is not written twice"
    );
    assert!(w.write(&rec(9, b"[]"), "decode", "array").unwrap());
    w.sync().unwrap();
    assert!(
        w.write(&rec(3, b"{"), "decode", "torn").unwrap(),
        "an earlier offset that is not in the file is written"
    );
    w.forget_below(&resume(8));
    assert!(
        w.write(&rec(7, b"x"), "decode", "again").unwrap(),
        "forgotten below the resume point"
    );
    w.sync().unwrap();
    let all = DeadLetterWriter::read_all(&config.path).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(
        B64.decode(all[0].value_base64.as_ref().unwrap()).unwrap(),
        b"\xff{bad"
    );
    assert_eq!((all[0].partition, all[0].offset, all[1].offset), (2, 7, 9));
    assert_eq!(all[0].reason, "not JSON");
}

#[test]
fn a_torn_last_line_is_cut_back_so_the_next_line_stands_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    w.write(&rec(1, b"one"), "decode", "bad").unwrap();
    w.sync().unwrap();
    drop(w);
    // A crash (or a full disk) in the middle of the next line: half of it reached the file.
    let whole = std::fs::read(&config.path).unwrap();
    let mut f = OpenOptions::new().append(true).open(&config.path).unwrap();
    f.write_all(&whole[..whole.len() / 2]).unwrap();
    drop(f);

    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(
        w.write(&rec(2, b"two"), "decode", "bad").unwrap(),
        "the torn record was never complete: it is written again"
    );
    w.sync().unwrap();
    let text = std::fs::read_to_string(&config.path).unwrap();
    for line in text.lines() {
        serde_json::from_str::<DeadLetter>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    let offsets: Vec<i64> = DeadLetterWriter::read_all(&config.path)
        .unwrap()
        .iter()
        .map(|l| l.offset)
        .collect();
    assert_eq!(offsets, [1, 2]);
}

#[test]
fn a_file_that_is_all_torn_line_is_emptied_and_read_all_skips_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    std::fs::write(&config.path, br#"{"pipeline":"p","topic":"t","parti"#).unwrap();
    assert!(DeadLetterWriter::read_all(&config.path).unwrap().is_empty());
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    w.write(&rec(4, b"x"), "decode", "bad").unwrap();
    w.sync().unwrap();
    assert_eq!(DeadLetterWriter::read_all(&config.path).unwrap().len(), 1);
}

#[test]
fn the_file_is_readable_by_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    let w = DeadLetterWriter::open("p", &config).unwrap();
    drop(w);
    assert_eq!(mode(&config.path), 0o600, "{:o}", mode(&config.path));
    // A file left world-readable by an older version is narrowed.
    std::fs::set_permissions(&config.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let w = DeadLetterWriter::open("p", &config).unwrap();
    drop(w);
    assert_eq!(mode(&config.path), 0o600, "{:o}", mode(&config.path));
}

#[test]
fn rotates_past_the_size_limit_and_keeps_max_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = rotating(dir.path(), 2);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    let payload = vec![b'x'; 1000];
    for offset in 0..40 {
        w.write(&rec(offset, &payload), "decode", "bad").unwrap();
        w.sync().unwrap();
        w.forget_below(&resume(offset + 1));
    }
    drop(w);
    let sizes: Vec<u64> = [config.path.clone(), config.rotated(1), config.rotated(2)]
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert!(
        sizes.iter().all(|s| *s < 4096 + 2000),
        "every file stays near the limit: {sizes:?}"
    );
    assert!(
        !config.rotated(3).exists(),
        "at most max_files rotated files"
    );
    // What is kept is whole and in order: the newest records, none torn or doubled.
    let mut offsets = Vec::new();
    for p in [config.rotated(2), config.rotated(1), config.path.clone()] {
        offsets.extend(
            DeadLetterWriter::read_all(&p)
                .unwrap()
                .iter()
                .map(|l| l.offset),
        );
    }
    let last = *offsets.last().unwrap();
    assert_eq!(last, 39);
    assert_eq!(
        offsets,
        ((last + 1 - offsets.len() as i64)..=last).collect::<Vec<_>>()
    );
    for p in [config.rotated(1), config.rotated(2)] {
        assert_eq!(mode(&p), 0o600);
    }
}

#[test]
fn only_the_re_deliverable_tail_is_read_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    for offset in 0..100 {
        w.write(&rec(offset, b"old"), "decode", "bad").unwrap();
    }
    w.sync().unwrap();
    // The table now stores offset 100: none of them can come back.
    w.forget_below(&resume(100));
    w.write(&rec(100, b"new"), "decode", "bad").unwrap();
    w.sync().unwrap();
    w.forget_below(&resume(100));
    drop(w);
    let before = std::fs::read(&config.path).unwrap();
    let head = before.iter().filter(|b| **b == b'\n').count();
    assert_eq!(head, 101);
    let sidecar = read_sidecar(&with_suffix(&config.path, ".idx"));
    let first_live = before
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(99)
        .map(|(i, _)| i as u64 + 1)
        .unwrap();
    assert_eq!(sidecar.start, first_live, "{sidecar:?}");
    // Scribble over the head: it is not read any more (it would index offsets 0..99).
    let mut f = OpenOptions::new().write(true).open(&config.path).unwrap();
    f.write_all(&vec![b'#'; first_live as usize - 1]).unwrap();
    drop(f);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert_eq!(w.written.len(), 1, "only offset 100 is indexed");
    assert!(!w.write(&rec(100, b"new"), "decode", "bad").unwrap());
}

#[test]
fn re_deliverable_records_of_a_rotated_file_are_still_known() {
    let dir = tempfile::tempdir().unwrap();
    let config = rotating(dir.path(), 3);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    let payload = vec![b'y'; 5000];
    w.write(&rec(50, &payload), "decode", "bad").unwrap();
    w.sync().unwrap();
    // A commit that stores offset 40 only: offset 50 may come back, and the file rotates.
    w.forget_below(&resume(40));
    assert!(config.rotated(1).exists());
    drop(w);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(
        !w.write(&rec(50, &payload), "decode", "bad").unwrap(),
        "known from the sidecar after rotation"
    );
    w.forget_below(&resume(51));
    drop(w);
    let w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(w.written.is_empty());
}

#[test]
fn a_full_disk_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.ndjson");
    std::os::unix::fs::symlink("/dev/full", &path).unwrap();
    let mut w = DeadLetterWriter::open("p", &DeadLetterConfig::at(path)).unwrap();
    w.write(&rec(1, b"x"), "decode", "bad").unwrap();
    let e = w.sync().unwrap_err();
    assert!(matches!(e, DeadLetterError::DiskFull { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("no space left") && text.contains("free space and restart"),
        "{text}"
    );
}

#[test]
fn rotation_settings_are_checked() {
    let c: DeadLetterConfig =
        toml::from_str("path = \"x\"\nmax_file_size = \"1KiB\"\nmax_files = 0").unwrap();
    let fields: Vec<_> = c.problems().into_iter().map(|p| p.0).collect();
    assert_eq!(fields, ["max_file_size", "max_files"]);
    let c: DeadLetterConfig = toml::from_str("path = \"x\"").unwrap();
    assert_eq!(
        (c.max_file_size, c.max_files),
        (DEFAULT_MAX_FILE_SIZE, DEFAULT_MAX_FILES)
    );
}

/// A message whose plugin outputs are rejected for two reasons keeps both lines, and a
/// re-read (after a restart, or across a rotation) writes neither again.
#[test]
fn two_rejections_of_one_message_are_both_kept_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig {
        max_file_size: 4096,
        ..DeadLetterConfig::at(dir.path().join("p.ndjson"))
    };
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    let m = rec(7, b"{\"a\":[1,2]}");
    // Whether each of the two rejections of `m` is written (again).
    let rewrite_both = |w: &mut DeadLetterWriter| {
        [
            w.write(&m, "transform", "plugin split: output 1 bad")
                .unwrap(),
            w.write(&m, "schema", "field `a`: column is long, value is string")
                .unwrap(),
        ]
    };
    assert_eq!(
        rewrite_both(&mut w),
        [true, true],
        "a second reason for the same message is a second line"
    );
    assert_eq!(rewrite_both(&mut w), [false, false], "each written once");
    w.sync().unwrap();
    drop(w);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert_eq!(rewrite_both(&mut w), [false, false], "both known");
    // Push the file past its size so it rotates: both stay known through the sidecar.
    for i in 0..40 {
        w.write(&rec(100 + i, &[b'x'; 200]), "decode", "filler")
            .unwrap();
    }
    w.sync().unwrap();
    w.forget_below(&resume(0));
    drop(w);
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert_eq!(rewrite_both(&mut w), [false, false], "both known");
    let mut all = DeadLetterWriter::read_all(&config.rotated(1)).unwrap();
    all.extend(DeadLetterWriter::read_all(&config.path).unwrap());
    let sevens: Vec<&str> = all
        .iter()
        .filter(|l| l.offset == 7)
        .map(|l| l.stage.as_str())
        .collect();
    assert_eq!(sevens, ["transform", "schema"]);
}

/// After a rewind the lines written since the last commit are dropped: their records
/// are judged again, and may be rows this time.
#[test]
fn lines_after_a_position_are_discarded_and_can_be_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(w.write(&rec(1, b"{bad"), "decode", "not JSON").unwrap());
    w.sync().unwrap();
    let committed = w.position();
    assert!(
        w.write(&rec(2, b"{\"x\":1}"), "schema", "x is struct")
            .unwrap()
    );
    w.sync().unwrap();
    assert!(
        w.write(&rec(3, b"{\"x\":2}"), "schema", "x is struct")
            .unwrap()
    );
    w.discard_after(committed).unwrap();
    let all = DeadLetterWriter::read_all(&config.path).unwrap();
    assert_eq!(all.iter().map(|l| l.offset).collect::<Vec<_>>(), [1]);
    assert!(
        w.write(&rec(2, b"{\"x\":1}"), "schema", "x is struct")
            .unwrap(),
        "a discarded line can be written again"
    );
    assert!(!w.write(&rec(1, b"{bad"), "decode", "not JSON").unwrap());
    w.sync().unwrap();
    drop(w);
    let all = DeadLetterWriter::read_all(&config.path).unwrap();
    assert_eq!(all.iter().map(|l| l.offset).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn without_a_file_nothing_is_written_to_disk_and_a_topic_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DeadLetterConfig::at(dir.path().join("p.ndjson"));
    config.file = false;
    assert_eq!(config.problems()[0].0, "file");
    config.topic = Some("p.dlq".into());
    assert!(config.problems().is_empty());
    let mut w = DeadLetterWriter::open("p", &config).unwrap();
    assert!(w.write(&rec(3, b"bad"), "decode", "not JSON").unwrap());
    w.sync().unwrap();
    // A re-delivery in the same run is not sent again.
    assert!(!w.write(&rec(3, b"bad"), "decode", "not JSON").unwrap());
    w.discard_after(w.position()).unwrap();
    w.forget_below(&resume(0));
    assert!(!w.write(&rec(3, b"bad"), "decode", "not JSON").unwrap());
    w.forget_below(&resume(4));
    assert!(w.write(&rec(3, b"bad"), "decode", "not JSON").unwrap());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
