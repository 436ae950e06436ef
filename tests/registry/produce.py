#!/usr/bin/env python3
"""Produce records with confluent-kafka's real serializers (Confluent wire format):
ProtobufSerializer, JSONSerializer or AvroSerializer, against a schema registry.

  produce.py --bootstrap HOST:PORT --registry URL [--user USER:PASSWORD] --topic T
             --format protobuf|json|avro --schema FILE --records FILE.ndjson
             [--message NAME] [--proto-path DIR]
             [--ref NAME=SUBJECT=FILE ...]
             [--key-field F [--key-schema FILE] [--key-message NAME]]
             [--plain]

Each line of FILE.ndjson is one record as JSON.

protobuf: FILE is a .proto file under --proto-path (default: its directory); its Python
  classes are generated with grpcio-tools' protoc (imports of other files under
  --proto-path and of google/protobuf/*.proto work). --message names the message type
  (simple or full name, default: the first message of the file). Records are in the
  protobuf JSON mapping (json_format.ParseDict: int64 as numbers or strings, bytes as
  base64, Timestamp as RFC 3339, Duration as "1.5s", enums by name, wrappers as plain
  values). The serializer registers the file under "<topic>-value" and every imported
  file (except the well-known ones) as its own subject named by the import path, which
  the schema references. --plain writes the message bytes alone (no Confluent header,
  nothing registered): plain Protobuf.
json: FILE is a JSON schema; records are passed as they are (the serializer validates).
avro: FILE is an .avsc schema; records are passed as they are.

--ref NAME=SUBJECT=FILE (json and avro; repeatable, in dependency order): registers FILE
  under SUBJECT first and makes the schema reference it as NAME (for JSON the `$ref`
  target, for Avro the full name of the named type).

--key-field F: the key is that field's value (a field named `_...` is removed from the value): with --key-schema FILE serialized by a
  second serializer of the same format ("<topic>-key"; protobuf: --key-message names
  the message type in the same .proto files, FILE is its .proto), else UTF-8 text.
"""

import argparse
import importlib
import json
import os
import sys
import tempfile

from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext


def proto_classes(proto_file, proto_path):
    """Generates Python classes for every .proto under proto_path; returns the module of proto_file."""
    import grpc_tools
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="floe-proto-")
    files = []
    for root, _dirs, names in os.walk(proto_path):
        for n in names:
            if n.endswith(".proto"):
                files.append(os.path.relpath(os.path.join(root, n), proto_path))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{proto_path}", f"-I{well_known}", f"--python_out={out}", *files])
    if rc != 0:
        sys.exit(f"protoc failed ({rc}) on {files}")
    sys.path.insert(0, out)
    rel = os.path.relpath(proto_file, proto_path)
    return importlib.import_module(rel[: -len(".proto")].replace("/", ".").replace("-", "_") + "_pb2")


def message_class(module, name):
    """The message class `name` (simple, nested `A.B`, or fully qualified) of a generated module."""
    fd = module.DESCRIPTOR
    if name is None:
        name = next(iter(fd.message_types_by_name))
    package = fd.package + "." if fd.package else ""
    if name.startswith(package):
        name = name[len(package):]
    cls = module
    for part in name.split("."):
        cls = getattr(cls, part)
    return cls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--user")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--format", required=True, choices=["protobuf", "json", "avro"])
    ap.add_argument("--schema", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--message")
    ap.add_argument("--proto-path")
    ap.add_argument("--ref", action="append", default=[])
    ap.add_argument("--key-field")
    ap.add_argument("--key-schema")
    ap.add_argument("--key-message")
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()

    conf = {"url": args.registry}
    if args.user:
        conf["basic.auth.user.info"] = args.user
    registry = SchemaRegistryClient(conf)
    value_ctx = SerializationContext(args.topic, MessageField.VALUE)
    key_ctx = SerializationContext(args.topic, MessageField.KEY)

    schema_type = {"json": "JSON", "avro": "AVRO"}.get(args.format)
    references = []
    for ref in args.ref:
        name, subject, path = ref.split("=", 2)
        registry.register_schema(subject, Schema(open(path).read(), schema_type))
        version = registry.lookup_schema(subject, Schema(open(path).read(), schema_type)).version
        references.append(SchemaReference(name, subject, version))

    if args.format == "protobuf":
        from google.protobuf import json_format
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        proto_path = args.proto_path or os.path.dirname(os.path.abspath(args.schema))
        module = proto_classes(os.path.abspath(args.schema), os.path.abspath(proto_path))
        cls = message_class(module, args.message)
        ser_conf = {"use.deprecated.format": False}
        serializer = ProtobufSerializer(cls, registry, ser_conf)

        def value_of(record):
            msg = json_format.ParseDict(record, cls())
            return msg.SerializeToString() if args.plain else serializer(msg, value_ctx)

        key_of = None
        if args.key_schema:
            key_module = proto_classes(os.path.abspath(args.key_schema), os.path.abspath(proto_path))
            key_cls = message_class(key_module, args.key_message)
            key_serializer = ProtobufSerializer(key_cls, registry, ser_conf)

            def key_of(k):
                msg = json_format.ParseDict(k, key_cls())
                return msg.SerializeToString() if args.plain else key_serializer(msg, key_ctx)

    elif args.format == "json":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        schema = Schema(open(args.schema).read(), "JSON", references)
        serializer = JSONSerializer(schema, registry)

        def value_of(record):
            return serializer(record, value_ctx)

        key_of = None
        if args.key_schema:
            key_serializer = JSONSerializer(open(args.key_schema).read(), registry)

            def key_of(k):
                return key_serializer(k, key_ctx)

    else:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        schema = Schema(open(args.schema).read(), "AVRO", references)
        serializer = AvroSerializer(registry, schema)

        def value_of(record):
            return serializer(record, value_ctx)

        key_of = None
        if args.key_schema:
            key_serializer = AvroSerializer(registry, open(args.key_schema).read())

            def key_of(k):
                return key_serializer(k, key_ctx)

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
            record = json.loads(line)
            key = None
            if args.key_field:
                # A field named with a leading underscore is the key only, not in the value.
                k = record.pop(args.key_field) if args.key_field.startswith("_") else record[args.key_field]
                key = key_of(k) if key_of else str(k).encode()
            producer.produce(args.topic, key=key, value=value_of(record), on_delivery=delivered)
            count += 1
    producer.flush(30)
    if errors:
        sys.exit(f"delivery failed: {errors}")
    print(json.dumps({"produced": count}))


if __name__ == "__main__":
    main()
