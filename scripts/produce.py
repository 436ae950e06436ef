#!/usr/bin/env python3
"""Create a topic and produce records to it (test tooling for Floe).

Usage (with the venv python, $FLOE_PYTHON from scripts/env.sh):

  produce.py --bootstrap 127.0.0.1:9092 --topic T --partitions 3 --file events.ndjson [--key-field id]
  produce.py --bootstrap 127.0.0.1:9092 --topic T --partitions 3 --count 1000 [--key-field id] [--seed 42]

The topic is created with the admin API ("already exists" is fine; its
partition count is then left as it is).

--file: each line of the file becomes one record whose value is the line's
  bytes exactly, without the line terminator ("\\n" or "\\r\\n"); empty lines are
  skipped. With --key-field F the key is str(json.loads(line)[F]) encoded UTF-8
  (a line that is not a JSON object with field F is an error) and librdkafka's
  default partitioner picks the partition from the key; without it records have
  no key.
--count N: N generated JSON records (~144 bytes each), deterministic for a given
  --seed and --start-id: {"id", "user", "event", "amount" (float), "ts" (ISO-8601
  UTC with microseconds and "Z"), "tags" (list of strings)}.

--unbatched: one record per producer batch. Tansu 0.6.0 answers ListOffsets
  (latest) with the last batch's base offset + 1, so after batched produces the
  "high watermark" from ListOffsets is too low; Fetch responses are right.

Prints "produced N" after flushing; exits non-zero on any delivery failure.
"""

import argparse
import datetime as dt
import json
import logging
import random
import sys

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

EVENTS = ["page_view", "click", "purchase", "signup", "logout", "refund"]
TAGS = ["mobile", "web", "promo", "beta", "eu-west", "us-east", "vip", "returning"]
BASE_TS = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class _Once(logging.Filter):
    """librdkafka repeats connection errors every backoff; show each one once."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        key = record.getMessage().split("|")[-1].split(": ", 1)[-1]
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _logger():
    log = logging.getLogger("produce.rdkafka")
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("produce.py: librdkafka: %(message)s"))
        log.addHandler(h)
        log.addFilter(_Once())
        log.propagate = False
        log.setLevel(logging.INFO)
    return log


def fail(msg):
    print(f"produce.py: {msg}", file=sys.stderr)
    sys.exit(1)


def generated(count, seed, start_id):
    rng = random.Random(seed)
    for i in range(start_id, start_id + count):
        ts = BASE_TS + dt.timedelta(seconds=i, microseconds=rng.randrange(1_000_000))
        rec = {
            "id": i,
            "user": f"user-{rng.randrange(1000000):06d}@example.com",
            "event": rng.choice(EVENTS),
            "amount": round(rng.uniform(0, 10000), 2),
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "tags": rng.sample(TAGS, rng.randrange(2, 4)),
        }
        yield rec, json.dumps(rec, separators=(",", ":")).encode()


def from_file(path):
    try:
        f = open(path, "rb")
    except OSError as e:
        fail(f"cannot open {path}: {e}")
    with f:
        for lineno, line in enumerate(f, 1):
            if line.endswith(b"\n"):
                line = line[:-1]
                if line.endswith(b"\r"):
                    line = line[:-1]
            if not line:
                continue
            yield lineno, line


def create_topic(bootstrap, topic, partitions, timeout):
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_logger())
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as e:
        err = e.args[0] if e.args else None
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            fail(f"creating topic {topic!r} failed: {e}")
    except TimeoutError:
        fail(f"creating topic {topic!r} timed out after {timeout}s (is a broker listening at {bootstrap}?)")
    except Exception as e:  # noqa: BLE001 - anything else is fatal too
        fail(f"creating topic {topic!r} failed: {e!r}")
    # Wait until the topic's metadata shows up with its partitions.
    deadline = dt.datetime.now() + dt.timedelta(seconds=timeout)
    while True:
        md = admin.list_topics(topic=topic, timeout=timeout)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) > 0:
            return len(t.partitions)
        if dt.datetime.now() > deadline:
            fail(f"topic {topic!r} did not appear in metadata within {timeout}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True, help="HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="NDJSON file, one record per line")
    src.add_argument("--count", type=int, help="number of generated records")
    ap.add_argument("--key-field", help="use str(record[FIELD]) as the record key")
    ap.add_argument("--seed", type=int, default=42, help="seed for generated records (default 42)")
    ap.add_argument("--start-id", type=int, default=0, help="first id of generated records (default 0)")
    ap.add_argument("--unbatched", action="store_true",
                    help="one record per batch (batch.num.messages=1): slower (~4k/s), but keeps Tansu's "
                         "ListOffsets(latest) exact, which otherwise reports last batch's base offset + 1")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds for admin calls and flush (default 30)")
    args = ap.parse_args()
    if args.partitions < 1:
        fail("--partitions must be >= 1")
    if args.count is not None and args.count < 0:
        fail("--count must be >= 0")

    create_topic(args.bootstrap, args.topic, args.partitions, args.timeout)

    errors = []
    delivered = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")
        else:
            delivered[0] += 1

    conf = {
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": int(args.timeout * 1000),
    }
    if args.unbatched:
        conf["batch.num.messages"] = 1
    producer = Producer(conf, logger=_logger())

    def send(value, key):
        while True:
            try:
                producer.produce(args.topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)

    sent = 0
    if args.file is not None:
        for lineno, line in from_file(args.file):
            key = None
            if args.key_field:
                # Malformed lines are sent as they are, without a key: sample data may
                # carry bad records on purpose, to show the dead-letter path.
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and args.key_field in obj:
                    key = str(obj[args.key_field]).encode()
            send(line, key)
            sent += 1
    else:
        for rec, value in generated(args.count, args.seed, args.start_id):
            key = None
            if args.key_field:
                if args.key_field not in rec:
                    fail(f"generated records have no field {args.key_field!r}")
                key = str(rec[args.key_field]).encode()
            send(value, key)
            sent += 1

    remaining = producer.flush(args.timeout)
    if remaining:
        fail(f"{remaining} record(s) still undelivered after {args.timeout}s")
    if errors:
        fail(f"{len(errors)} record(s) failed: " + "; ".join(errors[:5]))
    if delivered[0] != sent:
        fail(f"sent {sent} but {delivered[0]} confirmed")
    print(f"produced {sent}")


if __name__ == "__main__":
    main()
