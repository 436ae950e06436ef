#!/usr/bin/env python3
"""A minimal Confluent schema registry for Floe's tests (test fixture, memory only).

  registry.py [--port N] [--user USER:PASSWORD]

Prints "listening on 127.0.0.1:PORT" once it accepts requests. Implements the
endpoints the Python Avro, Protobuf and JSON serializers and Floe's client use, for the
schema types AVRO (default), PROTOBUF and JSON, with references to other subjects:

  POST /subjects/{subject}/versions    {"schema": "...", "schemaType"?: "AVRO", "references"?: [...]}
                                        -> {"id": N, "subject", "version"}
                                        (the same schema, type and references get the same id
                                        in any subject)
  POST /subjects/{subject}             the same body -> {"subject", "id", "version", "schema", ...}
                                        (lookup; 404 with error_code 40403 if not registered there)
  GET  /schemas/ids/{id}               -> {"schema": "...", "schemaType"?, "references"?}
                                        (404 with error_code 40403 if unknown)
  GET  /subjects/{subject}/versions/{N|latest} -> {"subject", "id", "version", "schema",
                                        "schemaType", "references"}
  GET  /subjects                       -> ["subject", ...]
  GET  /_stats                         -> {"schema_gets": {"ID": count}, "version_gets":
                                        {"SUBJECT/N": count}} (test hook: cache checks)

Schemas are served as they were registered (query parameters such as `format` are
ignored): Protobuf schemas registered by the Python serializer are base64-encoded
FileDescriptorProtos, which is also what a real registry serves with `format=serialized`.

With --user, every request needs that HTTP basic auth (401 otherwise).
"""

import argparse
import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LOCK = threading.Lock()
SCHEMAS = {}  # id -> (schema text, schema type, references JSON)
IDS = {}  # (schema text, schema type, references JSON) -> id
SUBJECTS = {}  # subject -> [id, ...] (versions in order)
GETS = {}  # id -> GET /schemas/ids count
VERSION_GETS = {}  # "subject/version" -> GET /subjects/{subject}/versions/{version} count
AUTH = None  # expected "Basic ..." header value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("registry: " + (fmt % args) + "\n")

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def registered(self, subject, sid):
        """The registry's description of schema `sid` as a version of `subject`."""
        with LOCK:
            text, stype, refs = SCHEMAS[sid]
            version = SUBJECTS[subject].index(sid) + 1
        return {
            "subject": subject,
            "id": sid,
            "version": version,
            "schema": text,
            "schemaType": stype,
            "references": json.loads(refs),
        }

    def not_found(self, code, message):
        self.reply(404, {"error_code": code, "message": message})

    def authorized(self):
        if AUTH is None or self.headers.get("Authorization") == AUTH:
            return True
        self.reply(401, {"error_code": 401, "message": "Unauthorized"})
        return False

    def do_GET(self):
        if not self.authorized():
            return
        path = urlsplit(self.path).path
        m = re.fullmatch(r"/schemas/ids/(\d+)(/schema)?", path)
        if m:
            sid = int(m.group(1))
            with LOCK:
                GETS[sid] = GETS.get(sid, 0) + 1
                found = SCHEMAS.get(sid)
            if found is None:
                return self.not_found(40403, f"Schema {sid} not found")
            text, stype, refs = found
            if m.group(2):
                return self.reply(200, json.loads(text))
            body = {"schema": text}
            if stype != "AVRO":
                body["schemaType"] = stype
            if refs != "[]":
                body["references"] = json.loads(refs)
            return self.reply(200, body)
        m = re.fullmatch(r"/subjects/([^/]+)/versions/(latest|\d+)", path)
        if m:
            subject = unquote(m.group(1))
            with LOCK:
                versions = SUBJECTS.get(subject)
            if not versions:
                return self.not_found(40401, f"Subject {subject} not found")
            index = len(versions) - 1 if m.group(2) == "latest" else int(m.group(2)) - 1
            if not 0 <= index < len(versions):
                return self.not_found(40402, "Version not found")
            with LOCK:
                key = f"{subject}/{m.group(2)}"
                VERSION_GETS[key] = VERSION_GETS.get(key, 0) + 1
            return self.reply(200, self.registered(subject, versions[index]))
        if path == "/subjects":
            with LOCK:
                return self.reply(200, sorted(SUBJECTS))
        if path == "/_stats":
            with LOCK:
                return self.reply(
                    200,
                    {"schema_gets": {str(k): v for k, v in GETS.items()}, "version_gets": dict(VERSION_GETS)},
                )
        self.not_found(404, f"no route {path}")

    def do_POST(self):
        if not self.authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as e:
            return self.reply(422, {"error_code": 42201, "message": f"invalid JSON: {e}"})
        path = urlsplit(self.path).path
        key = (
            body.get("schema"),
            body.get("schemaType") or "AVRO",
            json.dumps(body.get("references") or [], sort_keys=True),
        )
        m = re.fullmatch(r"/subjects/([^/]+)", path)
        if m and "schema" in body:
            subject = unquote(m.group(1))
            with LOCK:
                sid = IDS.get(key)
                versions = SUBJECTS.get(subject, [])
            if sid is None or sid not in versions:
                return self.not_found(40403, "Schema not found")
            return self.reply(200, self.registered(subject, sid))
        m = re.fullmatch(r"/subjects/([^/]+)/versions", path)
        if not m or "schema" not in body:
            return self.not_found(404, f"no route {path}")
        subject = unquote(m.group(1))
        with LOCK:
            sid = IDS.get(key)
            if sid is None:
                sid = len(SCHEMAS) + 1
                SCHEMAS[sid] = key
                IDS[key] = sid
            versions = SUBJECTS.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            version = versions.index(sid) + 1
        self.reply(200, {"id": sid, "subject": subject, "version": version})


def main():
    global AUTH
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--user", help="USER:PASSWORD required as basic auth")
    args = ap.parse_args()
    if args.user:
        AUTH = "Basic " + base64.b64encode(args.user.encode()).decode()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
