#!/usr/bin/env python3
"""The cost of many tables in one agent (run through scripts/scale-bench.sh).

For each entry of --tables (N, or N:K for N topics of which K receive records) it starts
a fresh Tansu broker, creates topics scale.t0000 ... (--partitions each), produces
--records JSON records of about 140 bytes spread evenly over the active topics, then runs
`$FLOE_BIN run` with one pipeline (topic_pattern "scale\\..*", table "t_{topic}", an
embedded catalog) and measures, from the agent's start:

  start-up    seconds until floe_partitions_assigned reaches N x partitions (and, in
              the JSON, until the first "committed" log line)
  wall        seconds until floe_records_out_total reaches --records (the JSON also has
              read_s, until floe_records_in_total does: the first commit waits for
              --commit-interval, so with few records wall is mostly start-up + interval)
  CPU         user + system seconds of the agent at that moment
  peak RSS    VmHWM once the agent has been idle for 3 commit intervals after the last
              record landed; idle RSS is VmRSS at that time

  commit ms   median and largest `ms` of the agent's "committed" log lines
  offsets     bytes of the stored offsets in the first table's current snapshot summary
              (`floe.offsets`; the JSON also has the table property's size)

then stops it with SIGTERM. Prints a markdown table and writes every figure to --out.
`--tables 1 --partitions 2000` measures a table fed by many partitions.

Environment: FLOE_BIN (the agent) and FLOE_TANSU (the broker), from scripts/env.sh.
--list-topics writes `topics = [...]` instead of topic_pattern, for agents that do not
accept `{topic}` in `table` together with topic_pattern.
"""

import argparse
import atexit
import ctypes
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC_PREFIX = "scale.t"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CHILDREN = []
TAGS = [["beta", "web"], ["mobile", "promo", "vip"], ["web", "returning", "eu-west"]]
BASE_TS = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class ScenarioError(Exception):
    """A scenario that cannot finish (timeout, a child that exited, a broker error)."""


# --- processes ---------------------------------------------------------------------


def _die_with_parent():
    """In the child: get SIGKILL when this script dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(cmd, log_path, env=None):
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, preexec_fn=_die_with_parent,
        )
    CHILDREN.append(proc)
    return proc


def stop(proc, grace=60.0):
    """SIGTERM, then SIGKILL after `grace` seconds; returns (exit code, seconds taken)."""
    if proc.poll() is not None:
        return proc.returncode, 0.0
    started = time.monotonic()
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc in CHILDREN:
        CHILDREN.remove(proc)
    return proc.returncode, time.monotonic() - started


def kill_children():
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    CHILDREN.clear()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid, field):
    """A kB field of /proc/PID/status (VmRSS, VmHWM) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise KeyError(field)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Deadline:
    def __init__(self, seconds, label):
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.label = label

    def check(self, stage):
        if time.monotonic() > self.end:
            raise ScenarioError(f"{self.label}: timed out after {self.seconds:.0f}s while {stage}")


# --- broker and records --------------------------------------------------------------


def start_broker(tansu, workdir, deadline):
    for attempt in range(3):
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        proc = spawn(
            [tansu, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            os.path.join(workdir, f"broker-{attempt}.log"),
        )
        if wait_listening(proc, port, deadline):
            return proc, f"127.0.0.1:{port}"
        stop(proc, 5)
    raise ScenarioError("the broker did not start (see broker-*.log)")


def wait_listening(proc, port, deadline):
    limit = time.monotonic() + 20
    while time.monotonic() < limit:
        deadline.check("starting the broker")
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
        except OSError:
            time.sleep(0.05)
            continue
        time.sleep(0.1)  # a broker that lost the port to another process exits by now
        return proc.poll() is None
    return False


def topic_names(count):
    return [f"{TOPIC_PREFIX}{i:04d}" for i in range(count)]


def create_topics(bootstrap, topics, partitions, deadline):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for i in range(0, len(topics), 100):
        chunk = [NewTopic(t, partitions, 1) for t in topics[i:i + 100]]
        for topic, fut in admin.create_topics(chunk, request_timeout=60).items():
            try:
                fut.result(timeout=60)
            except Exception as e:  # noqa: BLE001 (a KafkaException or a timeout)
                raise ScenarioError(f"create topic {topic}: {e}") from e
    while True:
        deadline.check("waiting for the topics to appear")
        present = set(admin.list_topics(timeout=10).topics)
        if all(t in present for t in topics):
            return
        time.sleep(0.2)


def record(i):
    ts = BASE_TS + dt.timedelta(seconds=i, microseconds=(i * 7919) % 1_000_000)
    return json.dumps({
        "id": i,
        "user": f"user-{(i * 7919) % 100_000:05d}@example.com",
        "amount": (i % 10_000) / 100.0,
        "paid": i % 3 != 0,
        "ts": ts.isoformat().replace("+00:00", "Z"),
        "tags": TAGS[i % 3],
    }, separators=(",", ":")).encode()


def spread(total, parts):
    """`total` split over `parts` slots as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def produce(bootstrap, slots, records, deadline):
    """Produces `records` over `slots` ((topic, partition) pairs). The last record of each
    partition goes in a batch of its own: Tansu reports a partition's end offset as its
    last batch's first offset + 1."""
    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err)

    producer = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True,
        "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none",
    })
    counts = spread(records, len(slots))
    next_id = 0
    for (topic, partition), count in zip(slots, counts):
        for _ in range(count - 1):
            next_id = send(producer, topic, partition, next_id, on_delivery)
        deadline.check("producing")
    flush(producer, deadline)
    for (topic, partition), count in zip(slots, counts):
        if count > 0:
            next_id = send(producer, topic, partition, next_id, on_delivery)
    flush(producer, deadline)
    if failures:
        raise ScenarioError(f"{len(failures)} records not delivered, first: {failures[0]}")


class SustainedProducer(threading.Thread):
    """Produces round-robin over `slots` for `seconds` while the agent runs (as fast as
    one Python producer can), then the last record of each partition in a batch of its
    own; `total` is set once everything is delivered."""

    def __init__(self, bootstrap, slots, seconds):
        super().__init__(daemon=True)
        self.bootstrap, self.slots, self.seconds = bootstrap, slots, seconds
        self.total = None
        self.failures = []

    def run(self):
        def on_delivery(err, _msg):
            if err is not None:
                self.failures.append(err)

        producer = Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True,
            "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none",
        })
        end = time.monotonic() + self.seconds
        next_id = 0
        while time.monotonic() < end:
            for topic, partition in self.slots:
                for _ in range(64):
                    next_id = send(producer, topic, partition, next_id, on_delivery)
        while producer.flush(1.0) > 0:
            pass
        for topic, partition in self.slots:
            next_id = send(producer, topic, partition, next_id, on_delivery)
        while producer.flush(1.0) > 0:
            pass
        self.total = next_id


def table_name(topic):
    """The table `t_{topic}` names for `topic` (as the agent maps it)."""
    return "t_" + re.sub(r"[^A-Za-z0-9_]", "_", topic)


def table_files(workdir, topic):
    """Snapshots of the first table, and its data files (count, mean MiB) on disk."""
    table = table_name(topic)
    sizes = []
    for root, _dirs, files in os.walk(os.path.join(workdir, "warehouse")):
        if table in root.split(os.sep) and os.sep + "data" in root:
            sizes += [os.path.getsize(os.path.join(root, f)) for f in files
                      if f.endswith(".parquet")]
    return {
        "data_files": len(sizes),
        "mean_file_mib": sum(sizes) / len(sizes) / 2**20 if sizes else 0.0,
    }


def send(producer, topic, partition, i, on_delivery):
    while True:
        try:
            producer.produce(topic, record(i), partition=partition, on_delivery=on_delivery)
            producer.poll(0)
            return i + 1
        except BufferError:
            producer.poll(0.05)


def flush(producer, deadline):
    while producer.flush(1.0) > 0:
        deadline.check("flushing the producer")


# --- the agent ------------------------------------------------------------------------


def toml_str(value):
    return json.dumps(str(value))


def write_config(workdir, bootstrap, topics, metrics_port, args):
    if args.list_topics:
        source_topics = "topics = [" + ", ".join(toml_str(t) for t in topics) + "]"
    else:
        source_topics = 'topic_pattern = "scale\\\\..*"'
    text = f"""\
[metrics]
listen = "127.0.0.1:{metrics_port}"

[catalogs.local]
type = "embedded"
path = {toml_str(os.path.join(workdir, "catalog.db"))}
warehouse = {toml_str(os.path.join(workdir, "warehouse"))}

[[pipelines]]
name = "scale"

[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "floe-scale"
{source_topics}
start = "earliest"

[pipelines.source.properties]
"topic.metadata.refresh.interval.ms" = "2000"
"session.timeout.ms" = "{args.session_timeout_ms}"

[pipelines.dead_letter]
path = {toml_str(os.path.join(workdir, "dead-letter.ndjson"))}

[pipelines.sink]
catalog = "local"
namespace = "scale"
table = "t_{{topic}}"
create_table = true
commit_interval = {toml_str(args.commit_interval)}
"""
    path = os.path.join(workdir, "floe.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


class AgentLog:
    """Follows the agent's JSON log: when the first commit happened, warnings, errors."""

    def __init__(self, path, started):
        self.path = path
        self.started = started
        self.first_commit = None
        self.commits = 0
        self.commit_ms = []
        self.problems = {"WARN": {}, "ERROR": {}}
        self.offset = 0

    def read(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            self._line(line)

    def _line(self, raw):
        try:
            event = json.loads(raw)
        except ValueError:
            event = {"level": "ERROR", "message": raw.decode(errors="replace")[:200]}
        level, message = event.get("level", ""), event.get("message", "")
        if message == "committed":
            self.commits += 1
            if isinstance(event.get("ms"), (int, float)):
                self.commit_ms.append(event["ms"])
            if self.first_commit is None:
                self.first_commit = time.monotonic() - self.started
        if level in self.problems:
            seen = self.problems[level]
            seen[message] = seen.get(message, 0) + 1


def scrape(port):
    """Sums of each metric over its label sets, or None while the endpoint is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    sums = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    return sums


def interval_seconds(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", text)
    if not m:
        raise SystemExit(f"--commit-interval: cannot read {text!r} (e.g. 5s, 500ms, 1m)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def watch_agent(proc, port, log, want_partitions, want_records, deadline, poll):
    """Polls until every record is committed; returns the figures at that moment."""
    started, assigned_at, read_at, sums = log.started, None, None, {}
    target = want_records
    while True:
        if callable(target):
            want_records = target()
            if want_records is None:
                want_records = float("inf")
        deadline.check(
            f"waiting for the agent (partitions {sums.get('floe_partitions_assigned', 0):.0f}"
            f"/{want_partitions}, records out {sums.get('floe_records_out_total', 0):.0f}"
            f"/{want_records})")
        if proc.poll() is not None:
            log.read()
            raise ScenarioError(f"the agent exited ({proc.returncode}) before committing everything")
        log.read()
        sums = scrape(port) or {}
        now = time.monotonic() - started
        if assigned_at is None and sums.get("floe_partitions_assigned", 0) >= want_partitions:
            assigned_at = now
        if read_at is None and sums.get("floe_records_in_total", 0) >= want_records:
            read_at = now
        if sums.get("floe_records_out_total", 0) >= want_records and assigned_at is not None:
            return {
                "startup_assigned_s": assigned_at,
                "wall_s": now,
                "cpu_s": cpu_seconds(proc.pid),
                "rss_done_mib": proc_status(proc.pid, "VmRSS"),
                "records_out": sums["floe_records_out_total"],
                "read_s": read_at,
                "ingest_s": now - assigned_at,
            }
        time.sleep(poll)


def run_agent(floe, config, workdir, metrics_port, want_partitions, want_records, args, deadline):
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    log_path = os.path.join(workdir, "agent.log")
    started = time.monotonic()
    proc = spawn([floe, "run", "--config", config, "--no-progress", "--log-format", "json"],
                 log_path, env)
    log = AgentLog(log_path, started)
    try:
        figures = watch_agent(proc, metrics_port, log, want_partitions, want_records,
                              deadline, args.poll)
        idle_until = time.monotonic() + 3 * interval_seconds(args.commit_interval)
        while time.monotonic() < idle_until:
            deadline.check("idling")
            time.sleep(min(args.poll, max(0.0, idle_until - time.monotonic())))
        figures["idle_rss_mib"] = proc_status(proc.pid, "VmRSS")
        figures["peak_rss_mib"] = proc_status(proc.pid, "VmHWM")
        figures["cpu_after_idle_s"] = cpu_seconds(proc.pid)
    finally:
        code, stop_s = stop(proc)
        log.read()
    ms = sorted(log.commit_ms)
    figures.update({
        "commit_ms_median": ms[len(ms) // 2] if ms else None,
        "commit_ms_max": ms[-1] if ms else None,
        "exit_code": code, "stop_s": stop_s, "agent_log": log_path,
        "startup_first_commit_s": log.first_commit, "commit_log_lines": log.commits,
        "warnings": log.problems["WARN"], "errors": log.problems["ERROR"],
    })
    return figures


# --- scenarios ------------------------------------------------------------------------


def run_scenario(tables, active, args, env):
    label = f"{tables} tables, {active} active"
    deadline = Deadline(args.timeout, label)
    workdir = tempfile.mkdtemp(prefix=f"scale-{tables}-{active}-", dir=args.work_dir)
    result = {"tables": tables, "active": active, "partitions": args.partitions,
              "records": args.records, "workdir": workdir}
    broker = None
    began = time.monotonic()
    try:
        broker, bootstrap = start_broker(env["FLOE_TANSU"], workdir, deadline)
        topics = topic_names(tables)
        t0 = time.monotonic()
        create_topics(bootstrap, topics, args.partitions, deadline)
        result["create_topics_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        slots = [(t, p) for t in topics[:active] for p in range(args.partitions)]
        want = args.records
        if args.sustain:
            producer = SustainedProducer(bootstrap, slots, args.sustain)
            want = lambda: producer.total  # noqa: E731
        else:
            produce(bootstrap, slots, args.records, deadline)
            result["produce_s"] = time.monotonic() - t0
        port = free_port()
        config = write_config(workdir, bootstrap, topics, port, args)
        if args.sustain:
            producer.start()
        result.update(run_agent(env["FLOE_BIN"], config, workdir, port,
                                tables * args.partitions, want, args, deadline))
        if args.sustain:
            if producer.failures:
                raise ScenarioError(f"{len(producer.failures)} records not delivered")
            result["records"] = producer.total
        result.update(offsets_size(workdir, topics[0]))
        result.update(table_files(workdir, topics[0]))
        result["ok"] = True
    except ScenarioError as e:
        result.update(ok=False, error=str(e))
        print(f"scale_bench: {e} (logs in {workdir})", file=sys.stderr)
    finally:
        if broker is not None:
            stop(broker, 10)
        result["scenario_s"] = time.monotonic() - began
    return result


def offsets_size(workdir, topic):
    """Bytes of the stored offsets in the first table: the current snapshot's
    `floe.offsets` summary value and the `floe.offsets.<pipeline>` table property."""
    import gzip
    import sqlite3

    table = table_name(topic)
    with sqlite3.connect(os.path.join(workdir, "catalog.db")) as db:
        row = db.execute("SELECT metadata_location FROM iceberg_tables WHERE table_name = ?",
                         (table,)).fetchone()
    if not row:
        return {}
    with open(row[0].removeprefix("file://"), "rb") as f:
        raw = f.read()
    meta = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    current = next((x for x in meta.get("snapshots", [])
                    if x["snapshot-id"] == meta.get("current-snapshot-id")), {})
    return {
        "summary_offsets_bytes": len(current.get("summary", {}).get("floe.offsets", "")),
        "property_offsets_bytes": len(meta.get("properties", {}).get("floe.offsets.scale", "")),
        "metadata_bytes": len(raw),
        "snapshots": len(meta.get("snapshots", [])),
    }


def parse_tables(text, default_active):
    """"1,10,500:10" -> [(1, a), (10, a), (500, 10)] with a = default_active or all."""
    out = []
    for item in text.split(","):
        n, _, k = item.strip().partition(":")
        tables = int(n)
        active = int(k) if k else (default_active or tables)
        if not 1 <= active <= tables:
            raise SystemExit(f"--tables {item}: active topics must be 1..{tables}")
        out.append((tables, active))
    return out


def fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(results):
    print("| tables | active | records | start-up s (to all partitions assigned) "
          "| wall s (to all committed) | records/s | records per CPU-s "
          "| peak RSS MiB | idle RSS MiB | commit ms (median / max) | offsets bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if not r.get("ok"):
            print(f"| {r['tables']} | {r['active']} | {r['records']:,} "
                  f"| failed: {r.get('error', '?')} | | | | | | | |")
            continue
        print(f"| {r['tables']} | {r['active']} | {r['records']:,} "
              f"| {fmt(r['startup_assigned_s'])} | {fmt(r['wall_s'])} "
              f"| {fmt(r['records'] / r['wall_s'], 0)} | {fmt(r['records'] / r['cpu_s'], 0)} "
              f"| {fmt(r['peak_rss_mib'])} | {fmt(r['idle_rss_mib'])} "
              f"| {r.get('commit_ms_median', '-')} / {r.get('commit_ms_max', '-')} "
              f"| {r.get('summary_offsets_bytes', '-')} |")


def print_sustained(results, interval):
    """Table health after a sustained run: snapshots against commit intervals, files."""
    print()
    print("| tables | records | ingest s | commit intervals | snapshots (first table) "
          "| data files | mean file MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if r.get("ok"):
            print(f"| {r['tables']} | {r['records']:,} | {fmt(r['ingest_s'])} "
                  f"| {fmt(r['ingest_s'] / interval)} | {r.get('snapshots', '-')} "
                  f"| {r.get('data_files', '-')} | {fmt(r.get('mean_file_mib'))} |")


def problems_summary(results):
    for r in results:
        for level in ("errors", "warnings"):
            for message, count in sorted(r.get(level, {}).items()):
                print(f"scale_bench: {r['tables']}/{r['active']}: {level[:-1]} x{count}: "
                      f"{message}", file=sys.stderr)


def write_results(args, env, results):
    with open(args.out, "w") as f:
        json.dump({"floe_bin": env["FLOE_BIN"], "commit_interval": args.commit_interval,
                   "session_timeout_ms": args.session_timeout_ms,
                   "list_topics": args.list_topics, "results": results}, f, indent=2)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default="1,10,100,500,500:10",
                   help="table counts; N:K makes only K of the N topics receive records "
                        "(default 1,10,100,500,500:10)")
    p.add_argument("--active-topics", type=int, default=0,
                   help="topics that receive records, for entries without :K (default: all)")
    p.add_argument("--records", type=int, default=400_000, help="records per scenario")
    p.add_argument("--partitions", type=int, default=1, help="partitions per topic")
    p.add_argument("--commit-interval", default="5s")
    p.add_argument("--session-timeout-ms", type=int, default=6000,
                   help="the consumer's session.timeout.ms, as in tests/bench: Tansu holds a new "
                        "group's first join for about half of it (librdkafka's 45000: 23s)")
    p.add_argument("--sustain", type=float, default=0,
                   help="produce for this many seconds while the agent runs (instead of "
                        "--records produced beforehand)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per scenario")
    p.add_argument("--poll", type=float, default=0.25, help="metrics poll period, seconds")
    p.add_argument("--list-topics", action="store_true",
                   help="name every topic in the config instead of topic_pattern")
    p.add_argument("--out", default="scale-results.json")
    p.add_argument("--work-dir", default=None, help="where scenario directories go (default: TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep each scenario's directory")
    args = p.parse_args()
    args.scenarios = parse_tables(args.tables, args.active_topics)
    interval_seconds(args.commit_interval)
    return args


def main():
    args = parse_args()
    env = {k: os.environ.get(k) for k in ("FLOE_BIN", "FLOE_TANSU")}
    missing = [k for k, v in env.items() if not v or not os.access(v, os.X_OK)]
    if missing:
        raise SystemExit(f"scale_bench: set {' and '.join(missing)} to executables "
                         "(scripts/scale-bench.sh does)")
    atexit.register(kill_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for tables, active in args.scenarios:
        print(f"scale_bench: {tables} tables, {active} active, {args.records:,} records ...",
              file=sys.stderr, flush=True)
        r = run_scenario(tables, active, args, env)
        print(f"scale_bench: ... {'ok' if r.get('ok') else 'FAILED'} in {r['scenario_s']:.0f}s",
              file=sys.stderr, flush=True)
        results.append(r)
        if r.get("ok") and not args.keep:
            shutil.rmtree(r.pop("workdir"), ignore_errors=True)
            r.pop("agent_log", None)
        write_results(args, env, results)
    problems_summary(results)
    print_table(results)
    if args.sustain:
        print_sustained(results, interval_seconds(args.commit_interval))
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
