//! Sorted runs: key-index entries on disk, in key order.
//!
//! A run file (`run-N.keys`) holds fixed-size entries (16-byte key digest, 8-byte packed
//! row) sorted by key, in blocks of [`BLOCK_ENTRIES`]. Its sidecar (`run-N.meta`) holds
//! the first key and the CRC-32 of every block (kept in memory: a lookup reads one
//! block and checks it), the run's Bloom filter, and a CRC-32 of itself. A run never
//! changes once written: merges write a new one.
//!
//! Every read of an entry is checked: a damaged block is an [`io::ErrorKind::InvalidData`]
//! error (see [`is_damage`]), never a wrong answer, so the index is rebuilt from the
//! table instead of deleting another key's row.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::bloom::Bloom;

/// Bytes of one entry: the key digest, then the packed row (both little-endian).
pub const ENTRY_BYTES: usize = 24;
/// Entries per block: a lookup reads one block (4,080 bytes).
pub const BLOCK_ENTRIES: usize = 170;
const BLOCK_BYTES: usize = ENTRY_BYTES * BLOCK_ENTRIES;
const META_MAGIC: &[u8; 8] = b"FLOEKIX2";
/// Read and write buffer of merges.
const STREAM_BUFFER: usize = 1 << 20;

/// The packed row of a key deleted in a newer run than the ones holding it.
pub const TOMBSTONE: u64 = u64::MAX;

/// A sorted run (see the module docs).
#[derive(Debug)]
pub struct Run {
    id: u64,
    file: File,
    len: u64,
    live: u64,
    fences: Vec<u128>,
    /// CRC-32 of each block's bytes.
    crcs: Vec<u32>,
    bloom: Option<Bloom>,
}

fn keys_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("run-{id}.keys"))
}

fn meta_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("run-{id}.meta"))
}

/// The run id of a file name `run-N.keys` / `run-N.meta`.
pub fn run_id_of(file_name: &str) -> Option<u64> {
    let rest = file_name.strip_prefix("run-")?;
    let (id, ext) = rest.split_once('.')?;
    matches!(ext, "keys" | "meta" | "meta.tmp")
        .then(|| id.parse().ok())
        .flatten()
}

/// Deletes the files of run `id` (missing ones are fine).
pub fn remove(dir: &Path, id: u64) -> io::Result<()> {
    for path in [keys_path(dir, id), meta_path(dir, id)] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn corrupt(what: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what}: {}", path.display()),
    )
}

/// Whether `e` says that a file of the index is damaged (a checksum or a length does
/// not match), as opposed to an I/O failure: the index is rebuilt then.
pub fn is_damage(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
}

/// The CRC-32 of a block, checked against the sidecar's.
fn check_block(bytes: &[u8], want: u32, run: u64, block: usize) -> io::Result<()> {
    if crc32fast::hash(bytes) == want {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("key-index run {run}: checksum mismatch in block {block}"),
    ))
}

impl Run {
    /// Its id (file names).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Entries, tombstones included.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Entries that are not tombstones.
    pub fn live(&self) -> u64 {
        self.live
    }

    /// Bytes of memory its fences and filter hold.
    pub fn memory(&self) -> usize {
        self.fences.len() * 20 + self.bloom.as_ref().map_or(0, Bloom::bytes)
    }

    /// Opens run `id` of `dir`, checking its sidecar against the entries file.
    pub fn open(dir: &Path, id: u64) -> io::Result<Run> {
        let meta = meta_path(dir, id);
        let bytes = std::fs::read(&meta)?;
        if bytes.len() < 44 || &bytes[..8] != META_MAGIC {
            return Err(corrupt("not a key-index run sidecar", &meta));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(corrupt("checksum mismatch", &meta));
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8"));
        let len = u64_at(8);
        let live = u64_at(16);
        let fence_count = u64_at(24) as usize;
        if fence_count as u64 != len.div_ceil(BLOCK_ENTRIES as u64) {
            return Err(corrupt("sidecar does not match its entries", &meta));
        }
        let fences_end = 32 + fence_count * 16;
        let crcs_end = fences_end + fence_count * 4;
        if body.len() < crcs_end + 8 {
            return Err(corrupt("truncated sidecar", &meta));
        }
        let fences = body[32..fences_end]
            .chunks_exact(16)
            .map(|c| u128::from_le_bytes(c.try_into().expect("16")))
            .collect();
        let crcs = body[fences_end..crcs_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        let bloom_len = u64_at(crcs_end) as usize;
        let bloom_bytes = &body[crcs_end + 8..];
        if bloom_bytes.len() != bloom_len {
            return Err(corrupt("truncated sidecar", &meta));
        }
        let bloom = match bloom_len {
            0 => None,
            _ => Some(Bloom::from_bytes(bloom_bytes).ok_or_else(|| corrupt("bad filter", &meta))?),
        };
        let path = keys_path(dir, id);
        let file = File::open(&path)?;
        if file.metadata()?.len() != len * ENTRY_BYTES as u64 {
            return Err(corrupt("entries file has the wrong length", &path));
        }
        Ok(Run {
            id,
            file,
            len,
            live,
            fences,
            crcs,
            bloom,
        })
    }

    /// The packed row stored for `key` ([`TOMBSTONE`] if this run deletes it). The store
    /// asks all runs' filters first, then [`Run::get_unfiltered`].
    #[cfg(test)]
    pub fn get(&self, key: u128) -> io::Result<Option<u64>> {
        if !self.may_contain(key) {
            return Ok(None);
        }
        self.get_unfiltered(key)
    }

    /// False when this run surely has no entry for `key` (empty, or its filter says so).
    pub fn may_contain(&self, key: u128) -> bool {
        self.len > 0 && self.bloom.as_ref().is_none_or(|b| b.may_contain(key))
    }

    /// [`Run::get`] without asking the filter: for callers that already did.
    pub fn get_unfiltered(&self, key: u128) -> io::Result<Option<u64>> {
        if self.len == 0 {
            return Ok(None);
        }
        let Some(block) = self.block_of(key) else {
            return Ok(None);
        };
        let start = block * BLOCK_ENTRIES;
        let n = BLOCK_ENTRIES.min(self.len as usize - start);
        let mut buf = [0u8; BLOCK_BYTES];
        let buf = &mut buf[..n * ENTRY_BYTES];
        self.file.read_exact_at(buf, (start * ENTRY_BYTES) as u64)?;
        check_block(buf, self.crcs[block], self.id, block)?;
        let entry = |i: usize| {
            let e = &buf[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES];
            (
                u128::from_le_bytes(e[..16].try_into().expect("16")),
                u64::from_le_bytes(e[16..].try_into().expect("8")),
            )
        };
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, v) = entry(mid);
            match k.cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(v)),
            }
        }
        Ok(None)
    }

    /// The block that holds `key` if any does: the last whose first key is at most
    /// `key`. Digests are uniform, so the position is guessed from the key and the
    /// search gallops out from there.
    fn block_of(&self, key: u128) -> Option<usize> {
        let f = &self.fences;
        let n = f.len();
        let guess = ((((key >> 64) as u64 as u128) * n as u128) >> 64) as usize;
        let guess = guess.min(n - 1);
        // The answer p (fences at most `key`) lies in lo..=hi.
        let (mut lo, mut hi);
        if f[guess] <= key {
            lo = guess + 1;
            let mut step = 1;
            hi = loop {
                let probe = guess + step;
                if probe >= n {
                    break n;
                }
                if f[probe] > key {
                    break probe;
                }
                lo = probe + 1;
                step *= 2;
            };
        } else {
            hi = guess;
            let mut step = 1;
            lo = loop {
                if step > guess {
                    break 0;
                }
                let probe = guess - step;
                if f[probe] <= key {
                    break probe + 1;
                }
                hi = probe;
                step *= 2;
            };
        }
        let p = lo + f[lo..hi].partition_point(|fence| *fence <= key);
        p.checked_sub(1)
    }

    /// Reads every entry in key order (for merges).
    pub fn reader(&self) -> io::Result<RunReader<'_>> {
        Ok(RunReader {
            run: self,
            inner: BufReader::with_capacity(STREAM_BUFFER, self.file.try_clone()?),
            left: self.len,
            block: 0,
            buf: Vec::with_capacity(BLOCK_BYTES),
            at: 0,
        })
    }
}

/// The entries of a run, in key order, each block checked before its entries are
/// handed out.
pub struct RunReader<'a> {
    run: &'a Run,
    inner: BufReader<File>,
    left: u64,
    block: usize,
    buf: Vec<u8>,
    at: usize,
}

impl RunReader<'_> {
    fn fill(&mut self) -> io::Result<()> {
        let n = (BLOCK_ENTRIES as u64).min(self.left) as usize;
        self.buf.resize(n * ENTRY_BYTES, 0);
        self.inner.read_exact(&mut self.buf)?;
        check_block(
            &self.buf,
            self.run.crcs[self.block],
            self.run.id,
            self.block,
        )?;
        self.block += 1;
        self.at = 0;
        Ok(())
    }
}

impl Iterator for RunReader<'_> {
    type Item = io::Result<(u128, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.buf.len() {
            if self.left == 0 {
                return None;
            }
            if let Err(e) = self.fill() {
                // Nothing after a damaged block is handed out.
                self.left = 0;
                self.buf.clear();
                self.at = 0;
                return Some(Err(e));
            }
        }
        let e = &self.buf[self.at..self.at + ENTRY_BYTES];
        self.at += ENTRY_BYTES;
        self.left -= 1;
        Some(Ok((
            u128::from_le_bytes(e[..16].try_into().expect("16")),
            u64::from_le_bytes(e[16..].try_into().expect("8")),
        )))
    }
}

/// Writes a run, entries in ascending key order.
pub struct RunWriter {
    dir: PathBuf,
    id: u64,
    out: BufWriter<File>,
    len: u64,
    live: u64,
    fences: Vec<u128>,
    crcs: Vec<u32>,
    /// The CRC-32 of the block being written.
    block_crc: crc32fast::Hasher,
    bloom: Option<Bloom>,
    last: Option<u128>,
}

impl RunWriter {
    /// Starts run `id` in `dir` for up to `expected` entries, with a Bloom filter of
    /// `bits_per_key` bits per entry (none at 0).
    pub fn create(dir: &Path, id: u64, expected: u64, bits_per_key: u32) -> io::Result<RunWriter> {
        let file = File::create(keys_path(dir, id))?;
        Ok(RunWriter {
            dir: dir.to_path_buf(),
            id,
            out: BufWriter::with_capacity(STREAM_BUFFER, file),
            len: 0,
            live: 0,
            fences: Vec::with_capacity((expected as usize).div_ceil(BLOCK_ENTRIES)),
            crcs: Vec::with_capacity((expected as usize).div_ceil(BLOCK_ENTRIES)),
            block_crc: crc32fast::Hasher::new(),
            bloom: (bits_per_key > 0).then(|| Bloom::new(expected, bits_per_key)),
            last: None,
        })
    }

    /// Appends an entry; keys must strictly ascend.
    pub fn push(&mut self, key: u128, row: u64) -> io::Result<()> {
        if self.last.is_some_and(|last| last >= key) {
            return Err(io::Error::other("key-index run entries out of order"));
        }
        self.last = Some(key);
        if self.len.is_multiple_of(BLOCK_ENTRIES as u64) {
            if self.len > 0 {
                self.end_block();
            }
            self.fences.push(key);
        }
        let (key_bytes, row_bytes) = (key.to_le_bytes(), row.to_le_bytes());
        self.out.write_all(&key_bytes)?;
        self.out.write_all(&row_bytes)?;
        self.block_crc.update(&key_bytes);
        self.block_crc.update(&row_bytes);
        if let Some(b) = &mut self.bloom {
            // Tombstones too: a lookup must find them to stop at this run.
            b.insert(key);
        }
        self.len += 1;
        if row != TOMBSTONE {
            self.live += 1;
        }
        Ok(())
    }

    fn end_block(&mut self) {
        let crc = std::mem::replace(&mut self.block_crc, crc32fast::Hasher::new());
        self.crcs.push(crc.finalize());
    }

    /// Writes the sidecar and makes both files durable.
    pub fn finish(mut self) -> io::Result<Run> {
        if self.len > 0 {
            self.end_block();
        }
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        // The entries are durable, the sidecar not yet: a start deletes such a run.
        crate::failpoint::hit(crate::failpoint::INDEX_RUN_WRITTEN);
        let mut meta = Vec::with_capacity(48 + self.fences.len() * 20);
        meta.extend_from_slice(META_MAGIC);
        meta.extend_from_slice(&self.len.to_le_bytes());
        meta.extend_from_slice(&self.live.to_le_bytes());
        meta.extend_from_slice(&(self.fences.len() as u64).to_le_bytes());
        for f in &self.fences {
            meta.extend_from_slice(&f.to_le_bytes());
        }
        for c in &self.crcs {
            meta.extend_from_slice(&c.to_le_bytes());
        }
        let bloom = self.bloom.as_ref().map(Bloom::to_bytes).unwrap_or_default();
        meta.extend_from_slice(&(bloom.len() as u64).to_le_bytes());
        meta.extend_from_slice(&bloom);
        let crc = crc32fast::hash(&meta);
        meta.extend_from_slice(&crc.to_le_bytes());
        let tmp = self.dir.join(format!("run-{}.meta.tmp", self.id));
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&meta)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, meta_path(&self.dir, self.id))?;
        Ok(Run {
            id: self.id,
            file: File::open(keys_path(&self.dir, self.id))?,
            len: self.len,
            live: self.live,
            fences: self.fences,
            crcs: self.crcs,
            bloom: self.bloom,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(i: u64) -> u128 {
        twox_hash::XxHash3_128::oneshot(&i.to_le_bytes())
    }

    /// The sorted entries (digest of i, i) for i below `n`, and a writer of run `id`
    /// holding them, not finished yet.
    fn digests_written(dir: &Path, id: u64, n: u64) -> (Vec<(u128, u64)>, RunWriter) {
        let mut entries: Vec<(u128, u64)> = (0..n).map(|i| (digest(i), i)).collect();
        entries.sort_unstable();
        let mut w = RunWriter::create(dir, id, n, 10).unwrap();
        for (k, v) in &entries {
            w.push(*k, *v).unwrap();
        }
        (entries, w)
    }

    #[test]
    fn every_entry_is_found_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (entries, mut w) = digests_written(dir.path(), 7, 10_000);
        assert!(w.push(0, 0).is_err(), "out of order");
        let run = w.finish().unwrap();
        let run2 = Run::open(dir.path(), 7).unwrap();
        for r in [&run, &run2] {
            assert_eq!(r.len(), 10_000);
            for (k, v) in &entries {
                assert_eq!(r.get(*k).unwrap(), Some(*v));
            }
            for i in 10_000..11_000 {
                assert_eq!(r.get(digest(i)).unwrap(), None);
            }
            assert_eq!(r.get(0).unwrap(), None, "below the first key");
            assert_eq!(r.get(u128::MAX).unwrap(), None, "above the last key");
        }
        let back: Vec<(u128, u64)> = run2.reader().unwrap().map(Result::unwrap).collect();
        assert_eq!(back, entries);
        assert_eq!(run_id_of("run-7.keys"), Some(7));
        assert_eq!(run_id_of("MANIFEST"), None);
    }

    #[test]
    fn a_damaged_sidecar_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(dir.path(), 1, 1, 10).unwrap();
        w.push(5, 6).unwrap();
        w.finish().unwrap();
        let meta = meta_path(dir.path(), 1);
        let mut bytes = std::fs::read(&meta).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&meta, bytes).unwrap();
        let e = Run::open(dir.path(), 1).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    /// A flipped bit in the entries is an error on every path that reads it, never
    /// another key's row (or a row of a file that does not exist).
    #[test]
    fn a_damaged_block_is_refused_on_lookup_and_on_streaming() {
        let dir = tempfile::tempdir().unwrap();
        let (entries, w) = digests_written(dir.path(), 3, 1_000);
        w.finish().unwrap();
        let keys = keys_path(dir.path(), 3);
        let mut bytes = std::fs::read(&keys).unwrap();
        // The packed row of the first entry of the second block.
        bytes[BLOCK_BYTES + 16] ^= 0x10;
        std::fs::write(&keys, bytes).unwrap();
        let run = Run::open(dir.path(), 3).unwrap();
        let (damaged, _) = entries[BLOCK_ENTRIES];
        let e = run.get(damaged).unwrap_err();
        assert!(is_damage(&e) && e.to_string().contains("checksum"), "{e}");
        assert_eq!(
            run.get(entries[0].0).unwrap(),
            Some(entries[0].1),
            "block 0 is fine"
        );
        let streamed: Vec<_> = run.reader().unwrap().collect();
        assert_eq!(
            streamed.len(),
            BLOCK_ENTRIES + 1,
            "stops at the damaged block"
        );
        assert!(streamed.last().unwrap().as_ref().is_err_and(is_damage));
    }

    #[test]
    fn lookups_work_at_block_edges_without_a_filter() {
        let dir = tempfile::tempdir().unwrap();
        // Evenly spaced keys make the guessed block exact; clustered ones make it wrong.
        for (id, keys) in [
            (1u64, (0..1_000u128).map(|i| i << 118).collect::<Vec<_>>()),
            (2, (0..1_000u128).map(|i| i * 3 + 17).collect()),
        ] {
            let mut w = RunWriter::create(dir.path(), id, keys.len() as u64, 0).unwrap();
            for k in &keys {
                w.push(*k, *k as u64).unwrap();
            }
            let run = w.finish().unwrap();
            for k in &keys {
                assert_eq!(run.get(*k).unwrap(), Some(*k as u64), "key {k}");
                assert_eq!(run.get(k + 1).unwrap(), None);
            }
        }
    }
}
