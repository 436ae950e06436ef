#!/usr/bin/env python3
"""DuckDB's full-scan time of a table of an embedded (SQLite) catalog, best of 3.

  scan_time.py --catalog-db FILE --table NS.TABLE [--catalog-name local]

Prints the seconds of `SELECT * FROM iceberg_scan(<current metadata>)` fetched as Arrow
(every column, deletes applied). Extensions load from the pinned wheels, as in
tests/readers/read_table.py.
"""

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "readers"))
from read_table import duckdb_extension_file, local_path  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog-db", required=True)
    ap.add_argument("--catalog-name", default="local")
    ap.add_argument("--table", required=True)
    args = ap.parse_args()
    import duckdb

    ns, name = args.table.rsplit(".", 1)
    con = sqlite3.connect(f"file:{args.catalog_db}?mode=ro", uri=True)
    (location,) = con.execute(
        "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
        (args.catalog_name, ns, name)).fetchone()
    con.close()
    ext_dir = tempfile.mkdtemp(prefix="floe-duckdb-ext-")
    try:
        db = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                               "autoload_known_extensions": "false",
                                               "extension_directory": ext_dir, "threads": "2"})
        for ext in ("avro", "httpfs", "iceberg"):
            db.execute(f"INSTALL '{duckdb_extension_file(ext)}'")
            db.execute(f"LOAD {ext}")
        path = local_path(location).replace("'", "''")
        best = None
        for _ in range(3):
            start = time.perf_counter()
            rel = db.sql(f"SELECT * FROM iceberg_scan('{path}')")
            table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
            spent = time.perf_counter() - start
            best = spent if best is None else min(best, spent)
            assert table.num_rows >= 0
        print(f"{best:.6f}")
    finally:
        shutil.rmtree(ext_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
