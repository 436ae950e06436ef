#!/usr/bin/env python3
"""A Spark 3.5 session with Iceberg's Spark runtime and SQL extensions, on Floe's SQL
catalog through Spark's JdbcCatalog, driven one statement at a time: another engine
working on Floe's tables between (and against) Floe's own commits.

Runs with the Spark venv's python ($FLOE_SPARK_PYTHON from scripts/env.sh):

  spark_session.py --jdbc-uri postgresql://USER@HOST:PORT/DB --catalog NAME
                   --warehouse file:///DIR --jars JAR[,JAR...]

Reads one JSON object per line on stdin, {"sql": "..."}, runs it and answers one line
on stdout: {"ok": true, "rows": [{column: value, ...}, ...]} or {"ok": false,
"error": "..."} (the statement failed; the session goes on). Timestamps come back
as read_table.py writes them (the session runs with TZ=UTC). Prints {"ready": true}
once the session is up. The catalog caches tables (Spark's default), so a statement
runs on the table as the session last loaded it until `REFRESH TABLE`: that is how a
test makes Spark plan on a snapshot and commit after Floe has committed on top.
"""

import argparse
import datetime as dt
import json
import os
import sys
import tempfile


def plain(value):
    """JSON for what Spark returns beyond JSON's types: timestamps as read_table.py
    writes them (UTC, microseconds, with the offset: the session runs with TZ=UTC),
    anything else as text."""
    if isinstance(value, dt.datetime):
        text = value.isoformat(timespec="microseconds")
        return text if value.tzinfo else text + "+00:00"
    return str(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jdbc-uri", required=True)
    ap.add_argument("--catalog", default="lake")
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--jars", required=True)
    args = ap.parse_args()

    from pyspark.sql import SparkSession

    from read_spark import jdbc_catalog

    scratch = tempfile.mkdtemp(prefix="floe-spark-")
    prefix = f"spark.sql.catalog.{args.catalog}"
    builder = jdbc_catalog(SparkSession.builder, args.catalog, args.jdbc_uri, args.warehouse)
    spark = (
        builder.master("local[2]")
        .appName("floe-spark-session")
        .config("spark.jars", args.jars)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(f"{prefix}.cache-enabled", "true")
        .config(f"{prefix}.cache.expiration-interval-ms", "-1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "768m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", scratch)
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            sql = json.loads(line)["sql"]
            try:
                rows = [r.asDict(recursive=True) for r in spark.sql(sql).collect()]
                answer = {"ok": True, "rows": rows}
            except Exception as e:  # noqa: BLE001 - a failed statement is an answer
                answer = {"ok": False, "error": f"{type(e).__name__}: {str(e).strip()[:4000]}"}
            print(json.dumps(answer, default=plain), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report every failure the same way
        print(f"spark_session.py: {type(e).__name__}: {str(e).strip()[:4000]}", file=sys.stderr)
        sys.exit(1)
