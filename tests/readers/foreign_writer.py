#!/usr/bin/env python3
"""Another engine writing to a Floe table: PyIceberg on the embedded (SQL) catalog.

  foreign_writer.py --catalog-db FILE --warehouse DIR --table NS.TABLE
                    [--create-like NS.OTHER [--location LOCATION]]
                    [--append-json '{"col": value, ...}']... [--delete-where EXPR]
                    [--expire-all-but-current]

--create-like first creates the table with the schema of another table (at LOCATION,
or where the catalog puts it).

--append-json appends one row per flag in one commit (columns not given are null;
timestamps as ISO-8601 strings). --expire-all-but-current removes every snapshot except
the current one (metadata only, like any engine's expire_snapshots). --delete-where
deletes the rows matching a PyIceberg row filter ("id < 300"), rewriting the data files
that hold them without those rows (copy-on-write). Prints
{"snapshots": N, "current": ID}.
"""

import argparse
import datetime as dt
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalog-db", required=True)
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--catalog-name", default="local")
    ap.add_argument("--table", required=True)
    ap.add_argument("--create-like")
    ap.add_argument("--location")
    ap.add_argument("--append-json", action="append", default=[])
    ap.add_argument("--delete-where")
    ap.add_argument("--expire-all-but-current", action="store_true")
    args = ap.parse_args()

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(args.catalog_name, uri=f"sqlite:///{args.catalog_db}",
                         warehouse=f"file://{args.warehouse}", init_catalog_tables="false")
    if args.create_like:
        like = catalog.load_table(args.create_like)
        catalog.create_table(args.table, schema=like.schema(), location=args.location)
    table = catalog.load_table(args.table)
    if args.append_json:
        schema = table.schema().as_arrow()
        rows = []
        for text in args.append_json:
            row = json.loads(text)
            for field in schema:
                v = row.get(field.name)
                if isinstance(v, str) and pa.types.is_timestamp(field.type):
                    row[field.name] = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
            rows.append({f.name: row.get(f.name) for f in schema})
        table.append(pa.Table.from_pylist(rows, schema=schema))
        table = catalog.load_table(args.table)
    if args.delete_where:
        table.delete(delete_filter=args.delete_where)
        table = catalog.load_table(args.table)
    if args.expire_all_but_current:
        current = table.current_snapshot().snapshot_id
        old = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        table = catalog.load_table(args.table)
    snap = table.current_snapshot()
    print(json.dumps({"snapshots": len(table.metadata.snapshots),
                      "current": snap.snapshot_id if snap else None}))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report every failure the same way
        print(f"foreign_writer.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
