#!/usr/bin/env python3
"""Upsert at scale: the key index with 1M, 10M and 100M live keys (run through
scripts/scale-bench.sh --keys).

For each entry of --keys (N) it starts a fresh Tansu broker and an embedded catalog,
lets the agent create an upsert table (key `id`), seeds it with N rows directly through
PyIceberg (in appends of --seed-chunk rows, no Kafka), produces --updates JSON records of
about 60 bytes over 8 partitions (--existing of them update a uniformly chosen seeded
key, the rest add new keys), then runs `$FLOE_BIN run` with default index settings (or `index_memory` =
--index-memory: a budget larger than the keys need keeps the whole index in memory, the
alternative to the bounded store) and measures:

  start-up    seconds from the agent's start until its first record is read: the key
              index is rebuilt from the table (no index on disk yet), and the log's
              "upsert index rebuilt" line gives the rebuild alone (`rebuild_s`)
  records/s   updates over the time from the first record read to the last commit
              (a SIGTERM once every record is read, as floe-bench does)
  CPU         user + system seconds of the agent over that same stretch
  peak RSS    the agent's largest resident set over its whole run (start-up included)

then starts the agent again on the same index directory with nothing to read and
reports how long opening the kept index took (`reopen_s`). Prints a markdown table and
writes every figure to --out.

Environment: FLOE_BIN, FLOE_TANSU (scripts/env.sh).
"""

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

import scale_bench as sb

from confluent_kafka import Producer

TOPIC = "keys"
PARTITIONS = 8


def write_config(workdir, bootstrap, port, interval, index_memory=None):
    text = f"""\
[metrics]
listen = "127.0.0.1:{port}"

[catalogs.local]
type = "embedded"
path = {sb.toml_str(os.path.join(workdir, "catalog.db"))}
warehouse = {sb.toml_str(os.path.join(workdir, "warehouse"))}

[[pipelines]]
name = "keys"

[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "floe-keys"
topics = ["{TOPIC}"]
start = "earliest"

[pipelines.source.properties]
"session.timeout.ms" = "6000"

[pipelines.dead_letter]
path = {sb.toml_str(os.path.join(workdir, "dead-letter.ndjson"))}

[pipelines.sink]
catalog = "local"
namespace = "bench"
table = "kv"
create_table = true
mode = "upsert"
key = ["id"]
commit_interval = {sb.toml_str(interval)}
index_dir = {sb.toml_str(os.path.join(workdir, "index"))}
"""
    if index_memory:
        text += f"index_memory = {sb.toml_str(index_memory)}\n"
    path = os.path.join(workdir, "floe.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def value(i, rng):
    return json.dumps({"id": i, "v": rng.randrange(1 << 40), "s": f"s{i % 1000:03d}"},
                      separators=(",", ":")).encode()


def produce_records(bootstrap, records, deadline):
    """Produces `records` ((key id, value bytes)) with the id as the message key."""
    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err)

    producer = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True,
        "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none",
    })
    for n, (key, val) in enumerate(records):
        while True:
            try:
                producer.produce(TOPIC, val, key=str(key).encode(),
                                 partition=key % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 100_000 == 0:
            producer.poll(0)
            deadline.check("producing")
    while producer.flush(1.0) > 0:
        deadline.check("flushing the producer")
    if failures:
        raise sb.ScenarioError(f"{len(failures)} records not delivered, first: {failures[0]}")


def seed(workdir, keys, chunk):
    """Appends rows for ids 0..keys-1 to the table through PyIceberg."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("local", uri=f"sqlite:///{os.path.join(workdir, 'catalog.db')}",
                         warehouse=f"file://{os.path.join(workdir, 'warehouse')}",
                         init_catalog_tables="false")
    table = catalog.load_table("bench.kv")
    schema = table.schema().as_arrow()
    for start in range(0, keys, chunk):
        n = min(chunk, keys - start)
        ids = pa.array(range(start, start + n), pa.int64())
        columns = []
        for field in schema:
            if field.name == "id":
                columns.append(ids)
            elif field.name == "v":
                columns.append(ids)
            elif field.name == "s":
                columns.append(pa.array([f"seed{i % 1000:03d}" for i in range(start, start + n)],
                                        pa.string()))
            elif field.name == "_op":
                columns.append(pa.array(["insert"] * n, pa.string()))
            elif field.name == "_kafka_partition":
                columns.append(pa.array([i % PARTITIONS for i in range(start, start + n)],
                                        field.type))
            elif field.name == "_kafka_offset":
                columns.append(pa.array([-1] * n, field.type))
            else:
                columns.append(pa.nulls(n, field.type))
        table.append(pa.Table.from_arrays(columns, schema=schema))
        table = catalog.load_table("bench.kv")
        print(f"keys_bench: seeded {start + n:,} of {keys:,} keys", file=sys.stderr, flush=True)


def wait_records_in(proc, port, want, deadline, poll):
    """Polls the metrics until `want` records were read; returns (time of the first
    record, the agent's CPU seconds then)."""
    first = first_cpu = None
    while True:
        deadline.check("waiting for the agent to read")
        if proc.poll() is not None:
            raise sb.ScenarioError(f"the agent exited ({proc.returncode})")
        sums = sb.scrape(port) or {}
        got = sums.get("floe_records_in_total", 0)
        if first is None and got > 0:
            first, first_cpu = time.time(), sb.cpu_seconds(proc.pid)
        if got >= want:
            return first, first_cpu
        time.sleep(poll)


def log_events(path):
    with open(path, "rb") as f:
        for raw in f:
            try:
                yield json.loads(raw)
            except ValueError:
                continue


def event_time(event):
    """Seconds since the epoch of a JSON log event's timestamp."""
    import datetime as dt

    ts = event.get("timestamp", "").replace("Z", "+00:00")
    return dt.datetime.fromisoformat(ts).timestamp()


def run_agent(floe, config, log_path):
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    return sb.spawn([floe, "run", "--config", config, "--no-progress", "--log-format", "json"],
                    log_path, env)


def reap(proc, grace=300.0):
    """SIGTERM, wait (SIGKILL past `grace`); returns (exit code, CPU seconds, peak RSS MiB)
    of the whole process from its rusage."""
    proc.terminate()
    end = time.monotonic() + grace
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > end:
            proc.kill()
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc in sb.CHILDREN:
        sb.CHILDREN.remove(proc)
    return proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def run_scenario(keys, args, env):
    deadline = sb.Deadline(args.timeout, f"{keys:,} keys")
    workdir = tempfile.mkdtemp(prefix=f"keys-{keys}-", dir=args.work_dir)
    result = {"keys": keys, "updates": args.updates, "existing": args.existing,
              "index_memory": args.index_memory or "default", "workdir": workdir}
    broker = None
    began = time.monotonic()
    try:
        broker, bootstrap = sb.start_broker(env["FLOE_TANSU"], workdir, deadline)
        sb.create_topics(bootstrap, [TOPIC], PARTITIONS, deadline)
        port = sb.free_port()
        config = write_config(workdir, bootstrap, port, args.commit_interval,
                              args.index_memory)
        rng = random.Random(keys)

        # The agent creates the table from one record, then the seed goes in directly.
        produce_records(bootstrap, [(keys + args.updates, value(-1, rng))], deadline)
        proc = run_agent(env["FLOE_BIN"], config, os.path.join(workdir, "create.log"))
        wait_records_in(proc, port, 1, deadline, args.poll)
        while not any(e.get("message") == "committed"
                      for e in log_events(os.path.join(workdir, "create.log"))):
            deadline.check("creating the table")
            time.sleep(args.poll)
        reap(proc)
        shutil.rmtree(os.path.join(workdir, "index"), ignore_errors=True)
        t0 = time.monotonic()
        seed(workdir, keys, args.seed_chunk)
        result["seed_s"] = time.monotonic() - t0

        existing = int(args.updates * args.existing)
        ids = [rng.randrange(keys) for _ in range(existing)]
        ids += range(keys, keys + args.updates - existing)
        rng.shuffle(ids)
        t0 = time.monotonic()
        produce_records(bootstrap, ((i, value(i, rng)) for i in ids), deadline)
        result["produce_s"] = time.monotonic() - t0

        log_path = os.path.join(workdir, "agent.log")
        started = time.time()
        proc = run_agent(env["FLOE_BIN"], config, log_path)
        first, first_cpu = wait_records_in(proc, port, args.updates, deadline, args.poll)
        code, cpu, peak = reap(proc)
        events = list(log_events(log_path))
        commits = [event_time(e) for e in events if e.get("message") == "committed"]
        rebuild = [e for e in events if e.get("message") == "upsert index rebuilt from the table"]
        errors = [e.get("message") for e in events if e.get("level") == "ERROR"]
        if code != 0 or errors or not commits:
            raise sb.ScenarioError(f"the agent exited {code}: {errors[:3]} (log {log_path})")
        result.update({
            "startup_s": first - started,
            "rebuild_s": rebuild[0].get("ms", 0) / 1000.0 if rebuild else None,
            "stream_s": commits[-1] - first,
            "stream_cpu_s": cpu - first_cpu,
            "peak_rss_mib": peak,
            "commits": len(commits),
        })

        # Reopen the kept index with nothing to read.
        log_path = os.path.join(workdir, "reopen.log")
        started = time.time()
        proc = run_agent(env["FLOE_BIN"], config, log_path)
        opened = None
        while opened is None:
            deadline.check("reopening the index")
            if proc.poll() is not None:
                raise sb.ScenarioError(f"the agent exited ({proc.returncode}) on reopening")
            for e in log_events(log_path):
                if e.get("message", "").startswith("upsert index "):
                    opened = e
            time.sleep(args.poll)
        reap(proc)
        result["reopen_s"] = event_time(opened) - started
        result["reopen_from_disk"] = opened["message"] == "upsert index opened from disk"
        result["index_bytes"] = sum(
            os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(os.path.join(workdir, "index")) for f in files)
        result["ok"] = True
    except sb.ScenarioError as e:
        result.update(ok=False, error=str(e))
        print(f"keys_bench: {e} (logs in {workdir})", file=sys.stderr)
    finally:
        sb.kill_children()
        if broker is not None:
            sb.stop(broker, 10)
        result["scenario_s"] = time.monotonic() - began
    return result


def print_table(results):
    print("| live keys | updates (existing keys) | start-up s (index rebuild s) "
          "| records/s | records per CPU-s | peak RSS MiB | reopen s | index on disk MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if not r.get("ok"):
            print(f"| {r['keys']:,} | {r['updates']:,} | failed: {r.get('error', '?')} "
                  "| | | | | |")
            continue
        print(f"| {r['keys']:,} | {r['updates']:,} ({r['existing']:.0%}) "
              f"| {sb.fmt(r['startup_s'])} ({sb.fmt(r['rebuild_s'])}) "
              f"| {sb.fmt(r['updates'] / r['stream_s'], 0)} "
              f"| {sb.fmt(r['updates'] / r['stream_cpu_s'], 0)} | {sb.fmt(r['peak_rss_mib'], 0)} "
              f"| {sb.fmt(r['reopen_s'])}{'' if r['reopen_from_disk'] else ' (rebuilt)'} "
              f"| {sb.fmt(r['index_bytes'] / 2**20, 0)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="1000000,10000000,100000000")
    p.add_argument("--updates", type=int, default=2_000_000)
    p.add_argument("--existing", type=float, default=0.1,
                   help="share of the updates that hit a seeded key (default 0.1)")
    p.add_argument("--seed-chunk", type=int, default=5_000_000,
                   help="rows per PyIceberg append when seeding")
    p.add_argument("--commit-interval", default="10s")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per scenario")
    p.add_argument("--poll", type=float, default=0.1)
    p.add_argument("--out", default="keys-results.json")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--index-memory", default=None,
                   help="the pipeline's index_memory (default: the agent's default)")
    args = p.parse_args()
    env = {k: os.environ.get(k) for k in ("FLOE_BIN", "FLOE_TANSU")}
    missing = [k for k, v in env.items() if not v or not os.access(v, os.X_OK)]
    if missing:
        raise SystemExit(f"keys_bench: set {' and '.join(missing)} (scripts/scale-bench.sh does)")
    atexit.register(sb.kill_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for keys in [int(k) for k in args.keys.split(",")]:
        print(f"keys_bench: {keys:,} keys ...", file=sys.stderr, flush=True)
        r = run_scenario(keys, args, env)
        print(f"keys_bench: ... {'ok' if r.get('ok') else 'FAILED'} in {r['scenario_s']:.0f}s",
              file=sys.stderr, flush=True)
        results.append(r)
        if r.get("ok") and not args.keep:
            shutil.rmtree(r.pop("workdir"), ignore_errors=True)
        with open(args.out, "w") as f:
            json.dump({"floe_bin": env["FLOE_BIN"], "results": results}, f, indent=2)
    print_table(results)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
