#!/usr/bin/env python3
"""Read an Iceberg table from a SQL (sqlite) catalog with an independent reader
and print it as one JSON document (test oracle for Floe).

  read_table.py --reader pyiceberg|duckdb|spark --catalog-db CATALOG.sqlite --catalog-name NAME \\
                --warehouse DIR --table NAMESPACE.TABLE [--order-by col1,col2] [--keep-order]

Spark (3.5 with Iceberg's runtime 1.10, local tables only) runs tests/readers/read_spark.py
with $FLOE_SPARK_PYTHON and $FLOE_SPARK_JARS (scripts/env.sh), which writes the rows it
reads as Parquet; those are converted here like the other readers' rows.

A SQL catalog on Postgres is read the same way with --catalog-uri postgresql://... instead
of --catalog-db (PyIceberg's SqlCatalog through psycopg2).

  read_table.py --reader pyiceberg --plan-filter "day >= '2024-01-02'" ...

prints instead the data files a PyIceberg scan with that row filter plans, and every
live data file: {"planned": [...], "all": [...]} (partition pruning checks).

or, from an Iceberg REST catalog with tables on S3 (PyIceberg's RestCatalog; DuckDB
ATTACHes the REST catalog with an S3 secret):

  read_table.py --reader pyiceberg|duckdb --rest-uri URI --rest-token TOKEN \\
                --rest-warehouse WAREHOUSE --s3-endpoint http://HOST:PORT --table NS.TABLE ...

Run it with the venv python ($FLOE_PYTHON from scripts/env.sh).

Output (stdout, one line):
  {"reader": "pyiceberg"|"duckdb",
   "columns": [[name, iceberg-type-string], ...],   current schema, e.g. "long",
                "timestamptz", "decimal(10, 2)", "struct<a: int, b: string>",
                "list<string>", "map<string, long>"
   "row_count": N,
   "rows": [{column: value, ...}, ...],
   "snapshot_count": N,
   "current_snapshot_summary": {"operation": "append", ...} | null}

Values: int/bool/string as JSON; float/double as JSON numbers (float32 printed
with the shortest decimal that round-trips in float32; NaN/Infinity/-Infinity
as those strings); binary and fixed as {"hex": "..."}; decimal as a string
("12.30"); uuid as its canonical string; date "YYYY-MM-DD"; time
"HH:MM:SS.ffffff"; timestamptz "YYYY-MM-DDTHH:MM:SS.ffffff+00:00" (UTC),
timestamp the same without offset (nanosecond types: 9 fraction digits);
struct as an object; list as an array; map as an array of {"key": k, "value": v};
null as null.

Row order: sorted by the --order-by columns (nulls first), ties broken by the
whole row; without --order-by sorted by the whole row, so the output is
deterministic whatever the file layout. --keep-order keeps the reader's order.

Both readers print the same JSON apart from "reader" for the same table.
Exits 1 with a message on stderr on any failure.
"""

import argparse
import datetime as dt
import decimal
import glob
import gzip
import json
import math
import os
import shutil
import site
import struct
import sys
import tempfile
import uuid

import pyarrow as pa


class ReadError(Exception):
    pass


# ---------------------------------------------------------------- iceberg types

def type_str(t):
    """Iceberg type (JSON form from table metadata) -> type string."""
    if isinstance(t, str):
        return t
    kind = t.get("type")
    if kind == "struct":
        return "struct<" + ", ".join(f"{f['name']}: {type_str(f['type'])}" for f in t["fields"]) + ">"
    if kind == "list":
        return f"list<{type_str(t['element'])}>"
    if kind == "map":
        return f"map<{type_str(t['key'])}, {type_str(t['value'])}>"
    raise ReadError(f"unknown iceberg type {t!r}")


def current_schema(meta):
    sid = meta.get("current-schema-id")
    schemas = meta.get("schemas")
    if schemas is None and "schema" in meta:  # format v1 without "schemas"
        return meta["schema"]
    for s in schemas or []:
        if s.get("schema-id") == sid:
            return s
    raise ReadError(f"metadata has no schema with current-schema-id {sid}")


def snapshot_info(meta):
    snaps = meta.get("snapshots") or []
    cur = meta.get("current-snapshot-id")
    summary = None
    if cur is not None and cur != -1:
        for s in snaps:
            if s.get("snapshot-id") == cur:
                summary = s.get("summary")
                break
        else:
            raise ReadError(f"current-snapshot-id {cur} not among the table's snapshots")
    return len(snaps), summary


# ---------------------------------------------------------------- value conversion

EPOCH = dt.datetime(1970, 1, 1)
UNIT_PER_SEC = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def fmt_timestamp(v, unit, with_tz):
    per = UNIT_PER_SEC[unit]
    secs, frac = divmod(v, per)
    d = EPOCH + dt.timedelta(seconds=secs)
    if unit == "ns":
        frac_s = f"{frac:09d}"
    else:
        frac_s = f"{frac * (1_000_000 // per):06d}"
    s = (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T"
         f"{d.hour:02d}:{d.minute:02d}:{d.second:02d}.{frac_s}")
    return s + "+00:00" if with_tz else s


def fmt_time(v, unit):
    per = UNIT_PER_SEC[unit]
    secs, frac = divmod(v, per)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    frac_s = f"{frac:09d}" if unit == "ns" else f"{frac * (1_000_000 // per):06d}"
    return f"{h:02d}:{m:02d}:{s:02d}.{frac_s}"


def fmt_float(v, single):
    if v is None:
        return None
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if single:
        # shortest decimal that round-trips through float32
        packed = struct.pack("<f", v)
        for prec in range(1, 10):
            cand = float(f"{v:.{prec}g}")
            if struct.pack("<f", cand) == packed:
                return cand
    return v


def fmt_uuid(v):
    if v is None:
        return None
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return str(uuid.UUID(bytes=bytes(v)))
    return str(uuid.UUID(str(v)))


def struct_children(arr):
    # flatten() accounts for the array's offset (slices)
    return arr.flatten()


def convert(arr, ice):
    """pyarrow Array -> list of JSON-ready values. `ice` is the Iceberg type
    (JSON form) when known; it only matters for uuid."""
    t = arr.type
    n = len(arr)
    nulls = arr.is_null().to_pylist() if n else []

    if ice == "uuid":
        if isinstance(t, pa.ExtensionType):
            arr = arr.storage
        return [fmt_uuid(v) for v in arr.to_pylist()]
    if isinstance(t, pa.ExtensionType):
        return convert(arr.storage, ice)
    if pa.types.is_dictionary(t):
        return convert(arr.dictionary_decode(), ice)
    if pa.types.is_timestamp(t):
        ints = arr.view(pa.int64()).to_pylist()
        return [None if v is None else fmt_timestamp(v, t.unit, t.tz is not None) for v in ints]
    if pa.types.is_time32(t) or pa.types.is_time64(t):
        ints = arr.view(pa.int32() if pa.types.is_time32(t) else pa.int64()).to_pylist()
        return [None if v is None else fmt_time(v, t.unit) for v in ints]
    if pa.types.is_struct(t):
        ice_fields = {}
        if isinstance(ice, dict) and ice.get("type") == "struct":
            ice_fields = {f["name"]: f["type"] for f in ice["fields"]}
        names = [t.field(i).name for i in range(t.num_fields)]
        cols = [convert(c, ice_fields.get(name)) for c, name in zip(struct_children(arr), names)]
        return [None if nulls[i] else {name: col[i] for name, col in zip(names, cols)}
                for i in range(n)]
    if pa.types.is_map(t):
        ice_k = ice.get("key") if isinstance(ice, dict) else None
        ice_v = ice.get("value") if isinstance(ice, dict) else None
        offsets = arr.offsets.to_pylist()
        entries = arr.values  # struct<key, value>, not sliced; offsets index into it
        keys = convert(entries.field(0), ice_k)
        vals = convert(entries.field(1), ice_v)
        return [None if nulls[i] else
                [{"key": keys[j], "value": vals[j]} for j in range(offsets[i], offsets[i + 1])]
                for i in range(n)]
    if pa.types.is_fixed_size_list(t):
        return convert(arr.cast(pa.list_(t.value_field)), ice)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        ice_e = ice.get("element") if isinstance(ice, dict) else None
        offsets = arr.offsets.to_pylist()
        vals = convert(arr.values, ice_e)
        return [None if nulls[i] else vals[offsets[i]:offsets[i + 1]] for i in range(n)]
    if hasattr(pa.types, "is_list_view") and (pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return convert(arr.cast(pa.large_list(t.value_field)), ice)
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or (hasattr(pa.types, "is_binary_view") and pa.types.is_binary_view(t))):
        return [None if v is None else {"hex": bytes(v).hex()} for v in arr.to_pylist()]
    if pa.types.is_floating(t):
        single = pa.types.is_float32(t) or pa.types.is_float16(t)
        return [fmt_float(v, single) for v in arr.to_pylist()]
    if pa.types.is_decimal(t):
        return [None if v is None else format(v, "f") for v in arr.to_pylist()]
    if pa.types.is_date(t):
        return [None if v is None else v.isoformat() for v in arr.to_pylist()]
    if (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_null(t)
            or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(t))):
        return arr.to_pylist()
    raise ReadError(f"unsupported arrow type {t}")


def sort_key_of(v):
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, str):
        return (2, v)
    return (3, json.dumps(v, sort_keys=True))


def column_sort_keys(arr, ice):
    """Keys that order a column by value (timestamps chronologically, decimals numerically)."""
    t = arr.type
    if isinstance(t, pa.ExtensionType):
        arr, t = arr.storage, arr.storage.type
    if pa.types.is_timestamp(t):
        return [(0,) if v is None else (1, v) for v in arr.view(pa.int64()).to_pylist()]
    if pa.types.is_decimal(t) or pa.types.is_date(t):
        return [(0,) if v is None else (1, v) for v in arr.to_pylist()]
    return [sort_key_of(v) for v in convert(arr, ice)]


def table_to_rows(table, schema, order_by, keep_order):
    fields = schema["fields"]
    names = [f["name"] for f in fields]
    if table.column_names != names:
        raise ReadError(f"reader returned columns {table.column_names}, schema has {names}")
    arrays = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    cols = [convert(a, f["type"]) for a, f in zip(arrays, fields)]
    n = table.num_rows
    rows = [{name: col[i] for name, col in zip(names, cols)} for i in range(n)]
    if keep_order:
        return rows
    keys = []
    for c in order_by:
        if c not in names:
            raise ReadError(f"--order-by column {c!r} not in table columns {names}")
        idx = names.index(c)
        keys.append(column_sort_keys(arrays[idx], fields[idx]["type"]))
    whole = [json.dumps(r, sort_keys=True) for r in rows]
    order = sorted(range(n), key=lambda i: (tuple(k[i] for k in keys), whole[i]))
    return [rows[i] for i in order]


# ---------------------------------------------------------------- readers

def split_table(ident):
    if "." not in ident:
        raise ReadError(f"--table must be NAMESPACE.TABLE, got {ident!r}")
    ns, name = ident.rsplit(".", 1)
    return ns, name


def local_path(location):
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    if "://" in location:
        raise ReadError(f"only local tables are supported, got location {location!r}")
    return location


def load_metadata_json(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReadError(f"cannot read table metadata {path}: {e}") from e
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"  # libpostgresql-jdbc-java (scripts/setup.sh)


def is_s3(location):
    return location.startswith(("s3://", "s3a://"))


def warehouse_uri(args):
    return args.warehouse if is_s3(args.warehouse) else f"file://{args.warehouse}"


def s3_props(args):
    """PyIceberg FileIO properties of the tests' S3 store (moto), for S3 warehouses."""
    if not args.s3_endpoint:
        return {}
    return {
        "s3.endpoint": args.s3_endpoint,
        "s3.access-key-id": S3_KEY,
        "s3.secret-access-key": S3_KEY,
        "s3.region": "us-east-1",
        "s3.path-style-access": "true",
    }


def load_s3_json(args, location):
    from pyarrow import fs

    endpoint = args.s3_endpoint.split("://", 1)
    s3 = fs.S3FileSystem(access_key=S3_KEY, secret_key=S3_KEY, region="us-east-1",
                         endpoint_override=endpoint[-1], scheme=endpoint[0] if len(endpoint) > 1 else "http",
                         force_virtual_addressing=False)
    with s3.open_input_stream(location.split("://", 1)[1]) as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def sql_uri(args):
    """SQLAlchemy URI of the SQL catalog: the sqlite file, or Postgres through psycopg2."""
    if args.catalog_uri:
        return "postgresql+psycopg2://" + args.catalog_uri.split("://", 1)[1]
    return f"sqlite:///{args.catalog_db}"


def read_pyiceberg(args):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        args.catalog_name,
        uri=sql_uri(args),
        warehouse=warehouse_uri(args),
        init_catalog_tables="false",
        **s3_props(args),
    )
    table = catalog.load_table(args.table)
    schema = table.schema().model_dump(by_alias=True, mode="json")
    arrow = table.scan().to_arrow()
    snap = table.current_snapshot()
    summary = snap.summary.model_dump(mode="json") if snap is not None and snap.summary is not None else None
    return schema, arrow, len(table.metadata.snapshots), summary


def duckdb_extension_file(name):
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, f"duckdb_extension_{name}", "extensions", "v*",
                                             f"{name}.duckdb_extension")))
        if hits:
            return hits[-1]
    raise ReadError(f"DuckDB extension {name!r} not found (is duckdb-extension-{name} installed?)")


def local_metadata(args):
    """(path, parsed JSON) of a table's current metadata file, from the SQL catalog."""
    ns, name = split_table(args.table)
    query = ("SELECT metadata_location FROM iceberg_tables "
             "WHERE catalog_name = :c AND table_namespace = :n AND table_name = :t")
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(
            sql_uri(args) if args.catalog_uri else f"sqlite:///file:{args.catalog_db}?mode=ro&uri=true")
        try:
            with engine.connect() as con:
                found = con.execute(sqlalchemy.text(query),
                                    {"c": args.catalog_name, "n": ns, "t": name}).fetchall()
        finally:
            engine.dispose()
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise ReadError(f"reading catalog {args.catalog_uri or args.catalog_db}: {e}") from e
    if not found:
        raise ReadError(f"table {args.table!r} not found in catalog {args.catalog_name!r} ({args.catalog_db})")
    if not found[0][0]:
        raise ReadError(f"table {args.table!r} has no metadata_location")
    if is_s3(found[0][0]):
        return found[0][0], load_s3_json(args, found[0][0])
    meta_path = local_path(found[0][0])
    return meta_path, load_metadata_json(meta_path)


def read_spark(args):
    import pyarrow.parquet as pq
    import subprocess

    meta_path, meta = local_metadata(args)
    schema = current_schema(meta)
    snapshot_count, summary = snapshot_info(meta)
    if summary is None:
        return schema, pa.table({f["name"]: pa.array([], pa.null()) for f in schema["fields"]}), snapshot_count, summary
    python = os.environ.get("FLOE_SPARK_PYTHON")
    jars = os.environ.get("FLOE_SPARK_JARS")
    if not python or not jars:
        raise ReadError("FLOE_SPARK_PYTHON / FLOE_SPARK_JARS are not set: run scripts/setup.sh, then source scripts/env.sh")
    out = tempfile.mkdtemp(prefix="floe-spark-out-")
    try:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_spark.py")
        source = ["--metadata", meta_path]
        if args.catalog_uri:
            # Through Spark's JdbcCatalog on the same Postgres database.
            jars = f"{jars},{POSTGRES_JDBC_JAR}"
            source = ["--jdbc-uri", args.catalog_uri, "--catalog", args.catalog_name,
                      "--table", args.table, "--warehouse", warehouse_uri(args)]
        done = subprocess.run([python, script, *source, "--out", os.path.join(out, "rows"),
                               "--jars", jars], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ReadError(f"spark failed: {done.stderr.strip()[-3000:]}")
        arrow = pq.read_table(os.path.join(out, "rows"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    names = [f["name"] for f in schema["fields"]]
    arrow = arrow.select(names)
    return schema, arrow, snapshot_count, summary


def plan_filter(args):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        args.catalog_name,
        uri=sql_uri(args),
        warehouse=warehouse_uri(args),
        init_catalog_tables="false",
        **s3_props(args),
    )
    table = catalog.load_table(args.table)
    planned = sorted(t.file.file_path for t in table.scan(row_filter=args.plan_filter).plan_files())
    every = sorted(t.file.file_path for t in table.scan().plan_files())
    return {"planned": planned, "all": every}


def read_duckdb(args):
    import duckdb

    meta_path, meta = local_metadata(args)
    schema = current_schema(meta)
    snapshot_count, summary = snapshot_info(meta)

    ext_dir = tempfile.mkdtemp(prefix="floe-duckdb-ext-")
    try:
        con = duckdb.connect(":memory:", config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "extension_directory": ext_dir,
            "threads": "2",
        })
        try:
            for ext in ("avro", "httpfs", "iceberg"):
                path = duckdb_extension_file(ext)
                con.execute(f"INSTALL '{path}'")
                con.execute(f"LOAD {ext}")
            con.execute("SET TimeZone = 'UTC'")
            if is_s3(meta_path):
                endpoint = args.s3_endpoint.split("://", 1)[-1]
                con.execute(f"CREATE SECRET floe_s3 (TYPE s3, KEY_ID '{S3_KEY}', SECRET '{S3_KEY}', "
                            f"REGION 'us-east-1', ENDPOINT '{endpoint}', URL_STYLE 'path', "
                            f"USE_SSL {'true' if args.s3_endpoint.startswith('https') else 'false'})")
            if summary is None:
                # No snapshot yet: nothing to scan; an empty table with the schema's columns.
                arrow = pa.table({f["name"]: pa.array([], pa.null()) for f in schema["fields"]})
            else:
                quoted = meta_path.replace("'", "''")
                rel = con.sql(f"SELECT * FROM iceberg_scan('{quoted}')")
                arrow = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        finally:
            con.close()
    finally:
        shutil.rmtree(ext_dir, ignore_errors=True)
    return schema, arrow, snapshot_count, summary


# ---------------------------------------------------------------- REST catalog readers

S3_KEY = "testing"  # moto accepts any key; the tests' S3 store is moto


def rest_metadata(args):
    """Table metadata straight from the REST catalog's load-table answer."""
    import urllib.parse
    import urllib.request

    ns, name = split_table(args.table)
    base = args.rest_uri.rstrip("/")

    def get(path, query=""):
        req = urllib.request.Request(f"{base}/v1/{path}{query}",
                                     headers={"Authorization": f"Bearer {args.rest_token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    config = get("config", "?" + urllib.parse.urlencode({"warehouse": args.rest_warehouse}))
    prefix = (config.get("overrides") or {}).get("prefix") or (config.get("defaults") or {}).get("prefix")
    path = f"namespaces/{urllib.parse.quote(ns.replace('.', chr(0x1f)), safe='')}/tables/{urllib.parse.quote(name, safe='')}"
    if prefix:
        path = f"{urllib.parse.quote(prefix, safe='')}/{path}"
    return get(path)["metadata"]


def read_pyiceberg_rest(args):
    from pyiceberg.catalog.rest import RestCatalog

    catalog = RestCatalog(
        "rest",
        uri=args.rest_uri,
        token=args.rest_token,
        warehouse=args.rest_warehouse,
        **{
            "s3.endpoint": args.s3_endpoint,
            "s3.access-key-id": S3_KEY,
            "s3.secret-access-key": S3_KEY,
            "s3.region": "us-east-1",
            "s3.path-style-access": "true",
        },
    )
    table = catalog.load_table(args.table)
    schema = table.schema().model_dump(by_alias=True, mode="json")
    arrow = table.scan().to_arrow()
    snap = table.current_snapshot()
    summary = snap.summary.model_dump(mode="json") if snap is not None and snap.summary is not None else None
    return schema, arrow, len(table.metadata.snapshots), summary


def read_duckdb_rest(args):
    import duckdb

    meta = rest_metadata(args)
    schema = current_schema(meta)
    snapshot_count, summary = snapshot_info(meta)
    ns, name = split_table(args.table)
    endpoint = args.s3_endpoint.split("://", 1)[-1]
    ext_dir = tempfile.mkdtemp(prefix="floe-duckdb-ext-")
    q = lambda v: v.replace("'", "''")  # noqa: E731
    try:
        con = duckdb.connect(":memory:", config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "extension_directory": ext_dir,
            "threads": "2",
        })
        try:
            for ext in ("avro", "httpfs", "iceberg"):
                con.execute(f"INSTALL '{duckdb_extension_file(ext)}'")
                con.execute(f"LOAD {ext}")
            con.execute("SET TimeZone = 'UTC'")
            con.execute(f"CREATE SECRET floe_s3 (TYPE s3, KEY_ID '{S3_KEY}', SECRET '{S3_KEY}', "
                        f"REGION 'us-east-1', ENDPOINT '{q(endpoint)}', URL_STYLE 'path', "
                        f"USE_SSL {'true' if args.s3_endpoint.startswith('https') else 'false'})")
            con.execute(f"CREATE SECRET floe_rest (TYPE iceberg, TOKEN '{q(args.rest_token)}')")
            con.execute(f"ATTACH '{q(args.rest_warehouse)}' AS floe_rest_catalog (TYPE iceberg, "
                        f"SECRET floe_rest, ENDPOINT '{q(args.rest_uri)}', "
                        f"ACCESS_DELEGATION_MODE 'none')")
            if summary is None:
                arrow = pa.table({f["name"]: pa.array([], pa.null()) for f in schema["fields"]})
            else:
                rel = con.sql(f'SELECT * FROM floe_rest_catalog."{ns}"."{name}"')
                arrow = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        finally:
            con.close()
    finally:
        shutil.rmtree(ext_dir, ignore_errors=True)
    return schema, arrow, snapshot_count, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reader", required=True, choices=["pyiceberg", "duckdb", "spark"])
    ap.add_argument("--plan-filter", default="", help="print the files a PyIceberg scan with this row filter plans")
    ap.add_argument("--catalog-db", help="sqlite file of the SQL catalog")
    ap.add_argument("--catalog-uri", help="postgresql:// URI of a SQL catalog (instead of --catalog-db)")
    ap.add_argument("--catalog-name", default="local")
    ap.add_argument("--warehouse", help="warehouse directory, or s3://bucket/prefix (with --s3-endpoint)")
    ap.add_argument("--rest-uri", help="Iceberg REST catalog URI (instead of --catalog-db)")
    ap.add_argument("--rest-token", default="", help="bearer token for the REST catalog")
    ap.add_argument("--rest-warehouse", default="", help="warehouse name for the REST catalog")
    ap.add_argument("--s3-endpoint", default="", help="S3 endpoint of the tables (http://host:port)")
    ap.add_argument("--table", required=True, help="NAMESPACE.TABLE")
    ap.add_argument("--order-by", default="", help="comma-separated column names")
    ap.add_argument("--keep-order", action="store_true", help="do not sort rows")
    args = ap.parse_args()

    if not args.rest_uri:
        if not ((args.catalog_db or args.catalog_uri) and args.warehouse):
            ap.error("--catalog-db (or --catalog-uri) and --warehouse are required without --rest-uri")
        if args.catalog_db:
            args.catalog_db = os.path.abspath(args.catalog_db)
        if not is_s3(args.warehouse):
            args.warehouse = os.path.abspath(args.warehouse)
    order_by = [c.strip() for c in args.order_by.split(",") if c.strip()]
    try:
        if not args.rest_uri and args.catalog_db and not os.path.isfile(args.catalog_db):
            raise ReadError(f"catalog db {args.catalog_db} does not exist")
        split_table(args.table)
        if args.plan_filter:
            sys.stdout.write(json.dumps(plan_filter(args)) + "\n")
            return
        if args.reader == "spark":
            if args.rest_uri:
                raise ReadError("the spark reader reads local (file://) tables only")
            schema, arrow, snapshot_count, summary = read_spark(args)
        elif args.rest_uri and args.reader == "pyiceberg":
            schema, arrow, snapshot_count, summary = read_pyiceberg_rest(args)
        elif args.rest_uri:
            schema, arrow, snapshot_count, summary = read_duckdb_rest(args)
        elif args.reader == "pyiceberg":
            schema, arrow, snapshot_count, summary = read_pyiceberg(args)
        else:
            schema, arrow, snapshot_count, summary = read_duckdb(args)
        rows = table_to_rows(arrow, schema, order_by, args.keep_order)
        doc = {
            "reader": args.reader,
            "columns": [[f["name"], type_str(f["type"])] for f in schema["fields"]],
            "row_count": len(rows),
            "rows": rows,
            "snapshot_count": snapshot_count,
            "current_snapshot_summary": summary,
        }
        out = json.dumps(doc, ensure_ascii=True, allow_nan=False)
    except Exception as e:  # noqa: BLE001 - report every failure the same way
        msg = str(e).strip() or repr(e)
        print(f"read_table.py ({args.reader}): {type(e).__name__}: {msg}", file=sys.stderr)
        sys.exit(1)
    sys.stdout.write(out + "\n")


if __name__ == "__main__":
    main()
