"""Print what independent readers see in a Floe table of the embedded catalog.

    show_table.py --catalog-db .floe/catalog.db --catalog-name local --warehouse .floe/warehouse --table demo.events

PyIceberg: schema, row count, snapshots with the Kafka offsets each one carries.
DuckDB (iceberg extension): an aggregate query over the same table.
"""
import argparse
import json
import os
import sqlite3
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "readers"))
import read_table  # noqa: E402  (shared DuckDB extension lookup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog-db", required=True)
    ap.add_argument("--catalog-name", required=True)
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--table", required=True)
    args = ap.parse_args()

    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(args.catalog_name, uri=f"sqlite:///{os.path.abspath(args.catalog_db)}",
                         warehouse=f"file://{os.path.abspath(args.warehouse)}", init_catalog_tables="false")
    table = catalog.load_table(args.table)
    arrow = table.scan().to_arrow()
    print(f"PyIceberg: {args.table} has {arrow.num_rows} rows")
    print("schema:")
    for field in table.schema().fields:
        print(f"  {field.field_id:>3} {field.name}: {field.field_type}")
    print("snapshots (Kafka offsets stored in each summary):")
    for s in table.snapshots():
        props = s.summary.additional_properties if s.summary else {}
        print(f"  {s.snapshot_id}  +{props.get('added-records', '?')} rows  offsets={props.get('floe.offsets')}")
    print("first rows:")
    for row in arrow.slice(0, 3).to_pylist():
        print("  " + json.dumps(row, default=str))

    import duckdb

    con = sqlite3.connect(os.path.abspath(args.catalog_db))
    ns, name = args.table.rsplit(".", 1)
    (location,) = con.execute("SELECT metadata_location FROM iceberg_tables WHERE catalog_name=? AND table_namespace=? AND table_name=?",
                              (args.catalog_name, ns, name)).fetchone()
    con.close()
    db = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
                                            "extension_directory": tempfile.mkdtemp(prefix="floe-duckdb-")})
    for ext in ("avro", "httpfs", "iceberg"):
        db.execute(f"INSTALL '{read_table.duckdb_extension_file(ext)}'")
        db.execute(f"LOAD {ext}")
    path = read_table.local_path(location)
    columns = {f.name for f in table.schema().fields}
    group = "event" if "event" in columns else "_kafka_partition"
    print(f"DuckDB: SELECT {group}, count(*) ... FROM iceberg_scan(...)")
    for r in db.sql(f"SELECT {group}, count(*) AS n FROM iceberg_scan('{path}') GROUP BY 1 ORDER BY 2 DESC").fetchall():
        print(f"  {r[0]!s:<12} {r[1]}")


if __name__ == "__main__":
    main()
