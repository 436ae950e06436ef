//! Message sizes (`floe-bench --sizes 1KiB,100KiB,1MiB,10MiB`): JSON records whose one
//! text field makes them the given size, through the `floe` binary with one passthrough
//! plugin; MB/s, records/s and peak RSS per size. Each size gets the same volume
//! (`--sizes-total`, at least 20 records).

use anyhow::Result;
use floe_tests::{Broker, Message};
use serde_json::json;

use super::{Figures, PASS, Run, Tuning, floe_run};

/// Parses `1KiB,100KiB,1MiB,10MiB` into bytes.
pub fn parse(list: &str) -> Result<Vec<u64>> {
    list.split(',')
        .map(|s| {
            s.trim()
                .parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| anyhow::anyhow!("--sizes: cannot read {s:?}: {e}"))
        })
        .collect()
}

/// One record of about `size` bytes.
fn record(i: usize, size: u64) -> Vec<u8> {
    let pad = (size as usize).saturating_sub(40);
    let text: String = (0..pad)
        .map(|k| char::from(b'a' + ((k * 7 + i) % 26) as u8))
        .collect();
    json!({"id": i, "doc": text}).to_string().into_bytes()
}

/// Runs every size; returns the figures (one per size).
pub async fn run(
    broker: &Broker,
    sizes: &[u64],
    total: u64,
    tuning: &Tuning,
) -> Result<Vec<Figures>> {
    let mut out = Vec::new();
    for &size in sizes {
        let n = (total / size).max(20) as usize;
        let topic = format!("sizes-{size}");
        broker.create_topic(&topic, 4).await?;
        let mut bytes = 0u64;
        let per_batch = ((8 << 20) / size).clamp(1, 10_000) as usize;
        let mut i = 0;
        while i < n {
            let batch: Vec<Message> = (i..(i + per_batch).min(n))
                .map(|j| {
                    let v = record(j, size);
                    bytes += v.len() as u64;
                    (Some(format!("k{j}").into_bytes()), Some(v))
                })
                .collect();
            i += batch.len();
            broker.produce(&topic, &batch).await?;
        }
        let scenario: &'static str = Box::leak(
            format!("sizes: {} records of {} bytes, 1 passthrough", n, size).into_boxed_str(),
        );
        let run = Run {
            scenario,
            chain: &[PASS],
            kept: &[0, 1, 2, 3, 4],
        };
        let figures = floe_run(
            &format!("sizes-{size}"),
            broker,
            &topic,
            n,
            bytes,
            &run,
            tuning,
        )
        .await?;
        println!(
            "{size:>9} B: {n} records, {:.1} MB/s, {:.0} records/s, peak RSS {:.0} MiB",
            figures.mb_per_s(),
            figures.rate(),
            figures.peak_rss_mib.unwrap_or_default()
        );
        out.push(figures);
    }
    Ok(out)
}
