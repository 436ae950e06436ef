"""The peer a user would write instead of Floe: a Python consumer (confluent-kafka)
batching JSON records into pyarrow tables and appending them with PyIceberg to a
SQL-catalog table, with the same commit policy (interval or size, whichever first).

Prints one JSON object: records, seconds, cpu_seconds, peak_rss_mib, files, snapshots.
"""
import argparse
import json
import os
import resource
import time

import pyarrow as pa
from confluent_kafka import Consumer
from pyiceberg.catalog.sql import SqlCatalog


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--commit-interval", type=float, default=10.0)
    ap.add_argument("--flush-bytes", type=int, default=64 << 20)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()

    start = time.monotonic()
    cpu0 = time.process_time()
    catalog = SqlCatalog("peer", uri=f"sqlite:///{args.workdir}/peer.db", warehouse=f"file://{args.workdir}/warehouse")
    catalog.create_namespace_if_not_exists("bench")
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "bench-python-peer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
    })
    consumer.subscribe([args.topic])
    table = None
    rows, buffered, seen = [], 0, 0
    last_commit = time.monotonic()

    def commit():
        nonlocal table, rows, buffered, last_commit
        if not rows:
            return
        batch = pa.Table.from_pylist(rows)
        if table is None:
            table = catalog.create_table("bench.events", schema=batch.schema)
        table.append(batch)
        consumer.commit(asynchronous=False)
        rows, buffered, last_commit = [], 0, time.monotonic()

    while seen < args.records:
        for m in consumer.consume(num_messages=10_000, timeout=1.0):
            if m.error():
                continue
            value = m.value()
            record = json.loads(value)
            record["_kafka_partition"] = m.partition()
            record["_kafka_offset"] = m.offset()
            rows.append(record)
            buffered += len(value)
            seen += 1
        if buffered >= args.flush_bytes or time.monotonic() - last_commit >= args.commit_interval:
            commit()
    commit()
    consumer.close()
    seconds = time.monotonic() - start
    table = catalog.load_table("bench.events")
    snap = table.current_snapshot()
    print(json.dumps({
        "records": int(snap.summary["total-records"]),
        "seconds": seconds,
        "cpu_seconds": time.process_time() - cpu0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "files": int(snap.summary["total-data-files"]),
        "snapshots": len(table.snapshots()),
    }))


if __name__ == "__main__":
    main()
