//! The key store: key digest -> packed row, in bounded memory, the rest on local disk.
//!
//! Recent changes live in a memory table: 256 hash maps by the digest's first byte, so
//! none grows in one big step and writing them out in key order needs no big sort. When
//! the table passes half the memory budget it is written out as a sorted run
//! ([`super::run`]); runs are merged so that each is at least three times the size of
//! the next newer one, which keeps their number logarithmic in the key count. A lookup
//! checks the memory table, then each run from newest to oldest: its Bloom filter, then
//! the one block its fences point to. The other half of the budget holds the runs'
//! fences and filters (bits per key shrink when the key count outgrows it).
//!
//! Merges run on a thread of their own, one at a time: lookups keep reading the runs
//! being merged until the merged run replaces them at the next [`KeyStore::maintain`],
//! so merging the largest run (gigabytes at a hundred million keys) does not hold up
//! commits.
//!
//! With a directory to persist in, a spill also writes `MANIFEST` (the runs and the
//! table snapshot the caller says they reflect) after the runs are durable, so a restart
//! can start from them instead of reading the table again. Its invariant
//! (`docs/reliability.md`, "Invariants"): **every key of the snapshot a manifest names is
//! in a run it names.** So a manifest is written only when the memory table was just
//! spilled (nothing of that snapshot is in memory alone), and installing a merge rewrites
//! the last such manifest with the new run list, keeping the snapshot it named. A manifest
//! and every block of every run carry a CRC-32; a start that finds one wrong does not
//! open the store.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use foldhash::fast::RandomState;
use serde::{Deserialize, Serialize};

use super::run::{self, Run, RunWriter, TOMBSTONE};

const SHARDS: usize = 256;
/// A run is merged into the next older one once it is at least a third of its size.
const MERGE_RATIO: u64 = 3;
/// Past this many runs a spill waits for the running merge: when spills outpace merging
/// (a slow disk, a busy machine) runs would pile up, and every lookup checks them all.
const MAX_RUNS: usize = 10;
/// Bits per key of the runs' Bloom filters when the budget allows (about 1 % false
/// positives).
const MAX_BITS_PER_KEY: u32 = 10;
/// Below this many bits per key a filter saves too little to be worth its memory.
const MIN_BITS_PER_KEY: u32 = 4;
/// Batches of lookups at least this big are split across threads (see
/// [`KeyStore::get_many`]); below it a thread costs more than it saves.
const PARALLEL_LOOKUPS_FROM: usize = 4096;
/// Version of the manifest and run layout.
pub const FORMAT: u32 = 2;
const MANIFEST: &str = "MANIFEST";

/// Threads for a big batch of lookups: one per core, at most four.
fn lookup_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// What a persisted store reflects, written with its runs (see the module docs).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`] when written.
    pub format: u32,
    /// The table the entries belong to.
    pub table_uuid: String,
    /// Field ids of the key columns the digests were computed from.
    pub key_field_ids: Vec<i32>,
    /// The table snapshot the entries reflect.
    pub snapshot: Option<i64>,
    /// Data file paths by file id (the id is the high half of a packed row): the files
    /// some live key of the snapshot is in.
    pub files: std::collections::BTreeMap<u32, String>,
    /// The next file id to use (ids are never reused).
    pub next_file: u32,
    /// Run ids, newest first.
    pub runs: Vec<u64>,
    /// The next run id to use.
    pub next_run: u64,
}

/// The key store (see the module docs).
#[derive(Debug)]
pub struct KeyStore {
    shards: Vec<HashMap<u128, u64, RandomState>>,
    /// Entries of the memory table that are not tombstones.
    mem_live: usize,
    /// Runs, newest first.
    runs: Vec<Arc<Run>>,
    /// The merge in progress, if any.
    merge: Option<Merge>,
    /// Runs a persisted manifest still names although their entries are in memory now
    /// (loaded at open): deleted once a newer manifest is written.
    retained: Vec<u64>,
    /// The manifest the runs on disk reflect: the one written at the last spill (or read
    /// at open). A merge installed later rewrites it with the new runs.
    durable: Option<Manifest>,
    dir: PathBuf,
    memory: u64,
    next_run: u64,
}

fn shard_of(key: u128) -> usize {
    (key >> 120) as usize
}

impl KeyStore {
    /// An empty store spilling to `dir` (which must exist), holding about `memory`
    /// bytes in memory.
    pub fn new(dir: &Path, memory: u64) -> KeyStore {
        KeyStore {
            shards: (0..SHARDS).map(|_| HashMap::default()).collect(),
            mem_live: 0,
            runs: Vec::new(),
            merge: None,
            retained: Vec::new(),
            durable: None,
            dir: dir.to_path_buf(),
            memory,
            next_run: 0,
        }
    }

    /// Opens the store persisted in `dir`, if there is one in this format. Runs that
    /// fit in the memory table are read back into it. Files of runs the manifest does
    /// not name (a spill cut short) are deleted. A damaged manifest or run is an
    /// [`io::ErrorKind::InvalidData`] error.
    pub fn open(dir: &Path, memory: u64) -> io::Result<Option<(KeyStore, Manifest)>> {
        let bytes = match std::fs::read(dir.join(MANIFEST)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(manifest) = read_manifest(&bytes)? else {
            return Ok(None);
        };
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            if let Some(id) = name.to_str().and_then(run::run_id_of)
                && !manifest.runs.contains(&id)
            {
                run::remove(dir, id)?;
            }
        }
        let mut store = KeyStore::new(dir, memory);
        store.next_run = manifest.next_run;
        for id in &manifest.runs {
            store.runs.push(Arc::new(Run::open(dir, *id)?));
        }
        let total: u64 = store.runs.iter().map(|r| r.len()).sum();
        if total <= store.mem_capacity() as u64 {
            // Small enough to serve from memory: oldest first, so newer entries win.
            let runs = std::mem::take(&mut store.runs);
            for r in runs.iter().rev() {
                for entry in r.reader()? {
                    let (key, row) = entry?;
                    if row == TOMBSTONE {
                        store.remove_in_memory(key);
                    } else {
                        store.put(key, row);
                    }
                }
                store.retained.push(r.id());
            }
        }
        store.durable = Some(manifest.clone());
        Ok(Some((store, manifest)))
    }

    /// Entries the memory table may hold before it is spilled.
    fn mem_capacity(&self) -> usize {
        // A hash-map entry costs about 29 to 57 bytes (24 plus a control byte, at 7/8 to
        // 7/16 load).
        (self.memory / 2 / 40) as usize
    }

    /// The packed row of `key`: `None` when the store has none (or a tombstone).
    pub fn get(&self, key: u128) -> io::Result<Option<u64>> {
        if let Some(row) = self.shards[shard_of(key)].get(&key) {
            return Ok((*row != TOMBSTONE).then_some(*row));
        }
        // Ask every run's filter before reading any run: the filters' cache misses are
        // independent, so the CPU overlaps them, and most keys looked up are in no run.
        // (Runs are newest first and at most MAX_RUNS + 1, so one group of 64 in practice.)
        for group in self.runs.chunks(64) {
            let mut maybe = 0u64;
            for (i, r) in group.iter().enumerate() {
                maybe |= u64::from(r.may_contain(key)) << i;
            }
            while maybe != 0 {
                let i = maybe.trailing_zeros() as usize;
                maybe &= maybe - 1;
                if let Some(row) = group[i].get_unfiltered(key)? {
                    return Ok((row != TOMBSTONE).then_some(row));
                }
            }
        }
        Ok(None)
    }

    /// [`KeyStore::get`] of each of `keys`, in order. With runs on disk a big batch is
    /// split across threads: a key that misses memory costs filter probes and a block
    /// read, and one thread doing them all leaves the other cores idle.
    pub fn get_many(&self, keys: &[u128]) -> io::Result<Vec<Option<u64>>> {
        let threads = if self.runs.is_empty() || keys.len() < PARALLEL_LOOKUPS_FROM {
            1
        } else {
            lookup_threads()
        };
        if threads == 1 {
            return keys.iter().map(|k| self.get(*k)).collect();
        }
        std::thread::scope(|scope| {
            let parts: Vec<_> = keys
                .chunks(keys.len().div_ceil(threads))
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|k| self.get(*k))
                            .collect::<io::Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(keys.len());
            for part in parts {
                match part.join() {
                    Ok(rows) => out.extend(rows?),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Ok(out)
        })
    }

    /// Whether the memory table holds an entry for `key`.
    pub fn in_memory(&self, key: u128) -> bool {
        self.shards[shard_of(key)].contains_key(&key)
    }

    /// Stores `row` for `key`.
    pub fn put(&mut self, key: u128, row: u64) {
        debug_assert_ne!(row, TOMBSTONE);
        match self.shards[shard_of(key)].insert(key, row) {
            Some(old) if old != TOMBSTONE => {}
            _ => self.mem_live += 1,
        }
    }

    /// Forgets `key`.
    pub fn delete(&mut self, key: u128) {
        if self.runs.is_empty() {
            self.remove_in_memory(key);
        } else if let Some(old) = self.shards[shard_of(key)].insert(key, TOMBSTONE)
            && old != TOMBSTONE
        {
            self.mem_live -= 1;
        }
    }

    fn remove_in_memory(&mut self, key: u128) {
        if let Some(old) = self.shards[shard_of(key)].remove(&key)
            && old != TOMBSTONE
        {
            self.mem_live -= 1;
        }
    }

    fn mem_entries(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Live keys, about: memory-table keys plus every run's, so a key in several runs
    /// counts more than once until they are merged.
    pub fn approx_len(&self) -> u64 {
        self.mem_live as u64 + self.runs.iter().map(|r| r.live()).sum::<u64>()
    }

    /// Whether the memory table should be spilled ([`KeyStore::spill`]).
    pub fn needs_spill(&self) -> bool {
        self.mem_entries() >= self.mem_capacity().max(1)
    }

    /// Bytes of memory held: the memory table's maps, the runs' fences and filters.
    pub fn memory(&self) -> usize {
        let maps: usize = self
            .shards
            .iter()
            .map(|s| s.capacity() * 25 * 8 / 7 + 64)
            .sum();
        maps + self.runs.iter().map(|r| r.memory()).sum::<usize>()
    }

    /// Runs on disk.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Bits per key of a run's filter when the runs will hold `entries` in all, so
    /// that their fences and filters stay within half of the budget.
    fn bits_for(&self, entries: u64) -> u32 {
        let fences = entries / run::BLOCK_ENTRIES as u64 * 16;
        let budget = (self.memory / 2).saturating_sub(fences);
        let bits = (budget.saturating_mul(8) / entries.max(1)).min(u64::from(MAX_BITS_PER_KEY));
        if bits < u64::from(MIN_BITS_PER_KEY) {
            0
        } else {
            bits as u32
        }
    }

    fn disk_entries(&self) -> u64 {
        self.runs.iter().map(|r| r.len()).sum()
    }

    fn new_run_id(&mut self) -> u64 {
        let id = self.next_run;
        self.next_run += 1;
        id
    }

    /// Whether [`KeyStore::maintain`] has work: a memory table to spill, or a merge
    /// that finished.
    pub fn has_work(&self) -> bool {
        self.needs_spill() || self.merge.as_ref().is_some_and(|m| m.handle.is_finished())
    }

    /// Writes the memory table out as a run when it is past its budget (or, with
    /// `force`, always), puts a finished merge in place of its inputs, starts the next
    /// merge the size rule asks for, and persists the result: after a spill, `manifest`
    /// (what the caller's entries reflect, `None`: nothing to keep) is written once every
    /// run it names is durable; after a merge alone, the manifest of the last spill with
    /// the new runs. Runs no manifest names any more are deleted after it. Blocking: call
    /// off the async workers.
    pub fn maintain(&mut self, manifest: Option<Manifest>, force: bool) -> io::Result<()> {
        let mut obsolete = Vec::new();
        let entries = self.mem_entries();
        let spill = force || (entries > 0 && self.needs_spill());
        if spill && entries > 0 {
            let id = self.new_run_id();
            let bits = self.bits_for(self.disk_entries() + entries as u64);
            let mut w = RunWriter::create(&self.dir, id, entries as u64, bits)?;
            let drop_tombstones = self.runs.is_empty();
            let mut sorted: Vec<(u128, u64)> = Vec::new();
            for shard in &mut self.shards {
                sorted.clear();
                sorted.extend(shard.drain());
                *shard = HashMap::default();
                sorted.sort_unstable_by_key(|e| e.0);
                for (key, row) in &sorted {
                    if row == &TOMBSTONE && drop_tombstones {
                        continue;
                    }
                    w.push(*key, *row)?;
                }
            }
            self.mem_live = 0;
            self.runs.insert(0, Arc::new(w.finish()?));
        }
        let backlog = self.runs.len() > MAX_RUNS;
        if self
            .merge
            .as_ref()
            .is_some_and(|m| backlog || m.handle.is_finished())
        {
            let merge = self.merge.take().expect("a merge");
            let merged = merge
                .handle
                .join()
                .map_err(|_| io::Error::other("the key-index merge thread panicked"))??;
            let at = self
                .runs
                .iter()
                .position(|r| r.id() == merge.newer)
                .filter(|i| self.runs.get(i + 1).is_some_and(|r| r.id() == merge.older))
                .ok_or_else(|| io::Error::other("merged key-index runs are not in place"))?;
            crate::failpoint::hit(crate::failpoint::INDEX_MERGE_INSTALL);
            self.runs.splice(at..at + 2, [Arc::new(merged)]);
            obsolete.extend([merge.newer, merge.older]);
        }
        if self.merge.is_none() {
            self.start_merge()?;
        }
        if spill {
            // Everything the caller holds is in the runs now.
            self.durable = manifest;
            obsolete.append(&mut self.retained);
        } else if obsolete.is_empty() {
            return Ok(());
        }
        match &mut self.durable {
            Some(m) => {
                m.format = FORMAT;
                m.runs = self.runs.iter().map(|r| r.id()).collect();
                m.next_run = self.next_run;
                crate::failpoint::hit(crate::failpoint::INDEX_BEFORE_MANIFEST);
                write_manifest(&self.dir, m)?;
                if !spill {
                    crate::failpoint::hit(crate::failpoint::INDEX_MERGE_INSTALLED);
                }
            }
            // Nothing to keep (a temporary index, a rebuild in progress): no manifest may
            // name these runs.
            None => remove_manifest(&self.dir)?,
        }
        for id in obsolete {
            run::remove(&self.dir, id)?;
        }
        Ok(())
    }

    /// Starts merging the newest pair of runs the size rule picks: a run at least a
    /// third of the size of the next older one goes into it.
    fn start_merge(&mut self) -> io::Result<()> {
        let Some(at) = (0..self.runs.len().saturating_sub(1))
            .find(|i| self.runs[*i].len() * MERGE_RATIO >= self.runs[i + 1].len())
        else {
            return Ok(());
        };
        let newer = self.runs[at].clone();
        let older = self.runs[at + 1].clone();
        let drop_tombstones = at + 2 == self.runs.len();
        let id = self.new_run_id();
        let bits = self.bits_for(self.disk_entries());
        let dir = self.dir.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("floe-index-merge".into())
            .spawn(move || merge_runs(&dir, id, &newer, &older, drop_tombstones, bits, &stop))?;
        self.merge = Some(Merge {
            newer: self.runs[at].id(),
            older: self.runs[at + 1].id(),
            cancel,
            handle,
        });
        Ok(())
    }

    /// Waits for the merges the size rule asks for (tests, and rebuilds that want the
    /// fewest runs).
    #[cfg(test)]
    pub fn settle(&mut self) -> io::Result<()> {
        while let Some(m) = &self.merge {
            while !m.handle.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.maintain(None, false)?;
        }
        Ok(())
    }
}

impl Drop for KeyStore {
    fn drop(&mut self) {
        // An unfinished merge's output is named by no manifest: stop it, it is deleted
        // at the next open.
        if let Some(m) = self.merge.take() {
            m.cancel.store(true, Ordering::Relaxed);
            let _ = m.handle.join();
        }
    }
}

/// A merge on its own thread.
#[derive(Debug)]
struct Merge {
    newer: u64,
    older: u64,
    cancel: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<io::Result<Run>>,
}

/// One run `id` of `newer` over `older` (newer entries win); tombstones are dropped when
/// nothing older is left for them to hide.
fn merge_runs(
    dir: &Path,
    id: u64,
    newer: &Run,
    older: &Run,
    drop_tombstones: bool,
    bits: u32,
    cancel: &AtomicBool,
) -> io::Result<Run> {
    let total = newer.len() + older.len();
    let mut w = RunWriter::create(dir, id, total, bits)?;
    let (mut a, mut b) = (newer.reader()?, older.reader()?);
    let (mut x, mut y) = (a.next().transpose()?, b.next().transpose()?);
    let mut n = 0u64;
    loop {
        n += 1;
        if n.is_multiple_of(1 << 16) && cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("merge cancelled"));
        }
        let (key, row) = match (x, y) {
            (None, None) => break,
            (Some(p), None) => {
                x = a.next().transpose()?;
                p
            }
            (None, Some(q)) => {
                y = b.next().transpose()?;
                q
            }
            (Some(p), Some(q)) => match p.0.cmp(&q.0) {
                std::cmp::Ordering::Less => {
                    x = a.next().transpose()?;
                    p
                }
                std::cmp::Ordering::Greater => {
                    y = b.next().transpose()?;
                    q
                }
                std::cmp::Ordering::Equal => {
                    x = a.next().transpose()?;
                    y = b.next().transpose()?;
                    p
                }
            },
        };
        if row == TOMBSTONE && drop_tombstones {
            continue;
        }
        w.push(key, row)?;
    }
    w.finish()
}

/// The manifest file: its JSON, then a line `crc32 <hex>` of the JSON's bytes.
fn write_manifest(dir: &Path, m: &Manifest) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(m).map_err(io::Error::other)?;
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(format!("\ncrc32 {crc:08x}\n").as_bytes());
    let tmp = dir.join("MANIFEST.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, &bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(MANIFEST))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes `MANIFEST` durably (a store that claims nothing).
pub fn remove_manifest(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(MANIFEST)) {
        Ok(()) => std::fs::File::open(dir)?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A manifest's contents: `None` for another format, an error when damaged.
fn read_manifest(bytes: &[u8]) -> io::Result<Option<Manifest>> {
    let damaged = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("key-index MANIFEST: {what}"),
        )
    };
    let text = std::str::from_utf8(bytes).map_err(|_| damaged("not text"))?;
    let Some((json, trailer)) = text.trim_end().rsplit_once('\n') else {
        // Format 1 had no checksum line.
        return Ok(None);
    };
    let Some(crc) = trailer
        .strip_prefix("crc32 ")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
    else {
        return Ok(None);
    };
    if crc32fast::hash(json.as_bytes()) != crc {
        return Err(damaged("checksum mismatch"));
    }
    let manifest: Manifest = serde_json::from_str(json).map_err(|e| damaged(&e.to_string()))?;
    Ok((manifest.format == FORMAT).then_some(manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(i: u64) -> u128 {
        twox_hash::XxHash3_128::oneshot(&i.to_le_bytes())
    }

    /// Against a hash map: puts, overwrites and deletes across many spills and merges.
    #[test]
    fn the_store_answers_like_a_map_through_spills_and_merges() {
        let dir = tempfile::tempdir().unwrap();
        // 2,000 entries in memory at most.
        let mut store = KeyStore::new(dir.path(), 2 * 40 * 2_000);
        let mut model: HashMap<u128, u64> = HashMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..60_000u64 {
            let key = digest(next() % 20_000);
            if next() % 5 == 0 {
                store.delete(key);
                model.remove(&key);
            } else {
                store.put(key, step);
                model.insert(key, step);
            }
            if store.has_work() {
                store.maintain(None, false).unwrap();
                assert!(store.runs() <= MAX_RUNS + 1, "{} runs", store.runs());
            }
        }
        store.settle().unwrap();
        assert!(store.runs() <= 6, "{} runs after merging", store.runs());
        for i in 0..20_000 {
            let key = digest(i);
            assert_eq!(store.get(key).unwrap(), model.get(&key).copied(), "key {i}");
        }
        // A batch big enough for several threads answers the same, in order.
        let keys: Vec<u128> = (0..20_000).map(digest).collect();
        assert!(keys.len() >= PARALLEL_LOOKUPS_FROM && store.runs() > 0);
        let expected: Vec<Option<u64>> = keys.iter().map(|k| model.get(k).copied()).collect();
        assert_eq!(store.get_many(&keys).unwrap(), expected);
        assert_eq!(store.get_many(&keys[..10]).unwrap(), expected[..10]);
        assert!(store.approx_len() >= model.len() as u64);
    }

    fn manifest_at(snapshot: i64) -> Option<Manifest> {
        Some(Manifest {
            table_uuid: "t".into(),
            snapshot: Some(snapshot),
            ..Default::default()
        })
    }

    /// Item 1 of the crash-safety review: a merge installed between two spills must not
    /// make the manifest name a snapshot whose newest keys are in memory only. The store
    /// is dropped without `persist` (what a SIGKILL leaves) and opened again.
    #[test]
    fn a_merge_installed_after_a_spill_keeps_the_snapshot_of_that_spill() {
        let dir = tempfile::tempdir().unwrap();
        let memory = 2 * 40 * 1_000;
        let mut store = KeyStore::new(dir.path(), memory);
        let mut snapshot = 0;
        // Spills until a merge is under way (two runs of about the same size).
        let mut next_key = 0u64;
        while store.merge.is_none() {
            snapshot += 1;
            while !store.needs_spill() {
                store.put(digest(next_key), next_key);
                next_key += 1;
            }
            store.maintain(manifest_at(snapshot), false).unwrap();
        }
        let spilled = next_key;
        // A commit whose keys stay in memory (no spill), then the merge lands.
        for k in spilled..spilled + 100 {
            store.put(digest(k), k);
        }
        while !store.merge.as_ref().unwrap().handle.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!store.needs_spill());
        store.maintain(manifest_at(snapshot + 1), false).unwrap();
        assert!(
            store.merge.is_none() || store.runs() == 1,
            "the merge was installed"
        );
        drop(store);

        let (store, m) = KeyStore::open(dir.path(), memory).unwrap().unwrap();
        assert_eq!(
            m.snapshot,
            Some(snapshot),
            "the manifest names the last spilled snapshot, not the one whose keys were in memory"
        );
        for k in 0..spilled {
            assert_eq!(store.get(digest(k)).unwrap(), Some(k), "key {k}");
        }
    }

    /// Item 2: a store given no manifest (a rebuild in progress) leaves none on disk,
    /// even where an earlier one was: a start after a crash rebuilds.
    #[test]
    fn spills_without_a_manifest_leave_none_behind() {
        let dir = tempfile::tempdir().unwrap();
        let memory = 2 * 40 * 1_000;
        let mut store = KeyStore::new(dir.path(), memory);
        store.put(digest(1), 1);
        store.maintain(manifest_at(1), true).unwrap();
        assert!(KeyStore::open(dir.path(), memory).unwrap().is_some());
        for k in 0..5_000 {
            store.put(digest(k), k);
            if store.has_work() {
                store.maintain(None, false).unwrap();
            }
        }
        assert!(store.runs() > 1);
        drop(store);
        assert!(KeyStore::open(dir.path(), memory).unwrap().is_none());
    }

    /// Item 3: a flipped bit in the manifest or in a run is refused at open.
    #[test]
    fn a_damaged_manifest_or_run_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let memory = 2 * 40 * 100;
        let mut store = KeyStore::new(dir.path(), memory);
        for k in 0..1_000 {
            store.put(digest(k), k);
        }
        store.maintain(manifest_at(77), true).unwrap();
        drop(store);
        let path = dir.path().join(MANIFEST);
        let good = std::fs::read(&path).unwrap();
        let text = String::from_utf8(good.clone()).unwrap();
        let at = text.find("77").unwrap();
        let mut bad = good.clone();
        bad[at] = b'6';
        std::fs::write(&path, &bad).unwrap();
        let e = KeyStore::open(dir.path(), memory).unwrap_err();
        assert!(run::is_damage(&e), "{e}");
        std::fs::write(&path, &good).unwrap();
        // Memory for 1,000 entries does not hold the run: it is read block by block on
        // lookup, and a block read is checked.
        let keys = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "keys"))
            .unwrap();
        let mut bytes = std::fs::read(&keys).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&keys, bytes).unwrap();
        let (store, _) = KeyStore::open(dir.path(), memory).unwrap().unwrap();
        let damaged = (0..1_000)
            .filter(|k| store.get(digest(*k)).is_err())
            .count();
        assert!(damaged > 0, "the damaged block is refused");
    }

    #[test]
    fn a_persisted_store_opens_with_what_it_held() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = KeyStore::new(dir.path(), 2 * 40 * 1_000);
        for i in 0..5_000 {
            store.put(digest(i), i);
        }
        store.delete(digest(3));
        let manifest = Manifest {
            table_uuid: "t".into(),
            snapshot: Some(42),
            files: [(0, "a.parquet".to_string())].into(),
            ..Default::default()
        };
        store.maintain(Some(manifest), true).unwrap();
        // A run left by a spill cut short is removed at open.
        std::fs::write(dir.path().join("run-999.keys"), b"x").unwrap();
        drop(store);
        let (store, m) = KeyStore::open(dir.path(), 2 * 40 * 1_000).unwrap().unwrap();
        assert_eq!(m.snapshot, Some(42));
        assert_eq!(m.files, [(0, "a.parquet".to_string())].into());
        assert!(!dir.path().join("run-999.keys").exists());
        for i in 0..5_000 {
            let want = (i != 3).then_some(i);
            assert_eq!(store.get(digest(i)).unwrap(), want, "key {i}");
        }
        // Small enough: back in memory, and the old runs go with the next manifest.
        let dir2 = tempfile::tempdir().unwrap();
        let mut small = KeyStore::new(dir2.path(), 2 * 40 * 1_000_000);
        small.put(digest(1), 1);
        small.maintain(Some(Manifest::default()), true).unwrap();
        let (mut small, _) = KeyStore::open(dir2.path(), 2 * 40 * 1_000_000)
            .unwrap()
            .unwrap();
        assert_eq!(small.runs(), 0);
        assert_eq!(small.get(digest(1)).unwrap(), Some(1));
        small.put(digest(2), 2);
        small.maintain(Some(Manifest::default()), true).unwrap();
        let runs: Vec<_> = std::fs::read_dir(dir2.path())
            .unwrap()
            .filter_map(|e| run::run_id_of(e.unwrap().file_name().to_str().unwrap()))
            .collect();
        assert_eq!(runs.len(), 2, "one run: its keys and meta files ({runs:?})");
        assert!(
            KeyStore::open(tempfile::tempdir().unwrap().path(), 1)
                .unwrap()
                .is_none()
        );
    }
}
