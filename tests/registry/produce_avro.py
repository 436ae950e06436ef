#!/usr/bin/env python3
"""Produce Avro records with confluent-kafka's real AvroSerializer (Confluent wire format).

  produce_avro.py --bootstrap HOST:PORT --registry URL [--user USER:PASSWORD]
                  --topic T --schema FILE.avsc --records FILE.ndjson
                  [--key-field F [--key-schema FILE.avsc]]

Each line of FILE.ndjson is one record as JSON. Values are converted to what the
serializer expects from the top-level field types: decimal fields from strings to
Decimal, timestamp-millis/micros from ISO-8601 strings to datetimes, date from
"YYYY-MM-DD", uuid from its canonical string. The schema is registered under
"<topic>-value" by the serializer itself. With --key-field the key is that field's
value: UTF-8 text, or with --key-schema Avro from another AvroSerializer ("<topic>-key").
"""

import argparse
import datetime as dt
import decimal
import json
import sys
import uuid

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def logical(field_type):
    """The logical type of a field, looking through ["null", T] unions."""
    if isinstance(field_type, list):
        non_null = [t for t in field_type if t != "null"]
        return logical(non_null[0]) if len(non_null) == 1 else None
    if isinstance(field_type, dict):
        return field_type.get("logicalType")
    return None


def convert(value, kind):
    if value is None or kind is None:
        return value
    if kind == "decimal":
        return decimal.Decimal(value)
    if kind in ("timestamp-millis", "timestamp-micros"):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if kind in ("local-timestamp-millis", "local-timestamp-micros"):
        return dt.datetime.fromisoformat(value)
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind == "uuid":
        return uuid.UUID(value)
    return value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--user")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--schema", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--key-field")
    ap.add_argument("--key-schema")
    args = ap.parse_args()

    schema_text = open(args.schema).read()
    fields = {f["name"]: logical(f["type"]) for f in json.loads(schema_text)["fields"]}
    conf = {"url": args.registry}
    if args.user:
        conf["basic.auth.user.info"] = args.user
    registry = SchemaRegistryClient(conf)
    serializer = AvroSerializer(registry, schema_text)
    key_serializer = None
    if args.key_schema:
        key_serializer = AvroSerializer(registry, open(args.key_schema).read())
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    errors = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(str(err))

    count = 0
    with open(args.records) as lines:
        for line in lines:
            if not line.strip():
                continue
            record = {k: convert(v, fields.get(k)) for k, v in json.loads(line).items()}
            value = serializer(record, SerializationContext(args.topic, MessageField.VALUE))
            key = None
            if key_serializer is not None:
                key = key_serializer(record[args.key_field], SerializationContext(args.topic, MessageField.KEY))
            elif args.key_field:
                key = str(record[args.key_field]).encode()
            producer.produce(args.topic, key=key, value=value, on_delivery=delivered)
            count += 1
    producer.flush(30)
    if errors:
        sys.exit(f"delivery failed: {errors}")
    print(json.dumps({"produced": count}))


if __name__ == "__main__":
    main()
