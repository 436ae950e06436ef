#!/usr/bin/env python3
"""Read an Iceberg table with Spark 3.5 and Iceberg's Spark runtime, by its metadata
file, and write the rows Spark sees (deletes applied) as Parquet for read_table.py.

Runs with the Spark venv's python ($FLOE_SPARK_PYTHON from scripts/env.sh):

  read_spark.py --metadata FILE.metadata.json --out DIR --jars JAR[,JAR...]
               [--where SQL_CONDITION]
  read_spark.py --jdbc-uri postgresql://USER@HOST:PORT/DB --catalog NAME --table NS.TABLE
               --warehouse file:///DIR --out DIR --jars JAR[,JAR...]

The second form reads through Spark's JdbcCatalog on Postgres (the driver jar among
--jars), as Spark users open Floe's SQL catalog.

Prints one JSON line: {"rows": N, "files": [data files Spark planned to read]}.
Local (file://) warehouses only: the runtime jar lacks the shaded HTTP and S3 clients.
"""

import argparse
import json
import os
import sys
import tempfile


def jdbc_catalog(builder, catalog, jdbc_uri, warehouse):
    """`builder` with Spark catalog `catalog`: Iceberg's JdbcCatalog on the Postgres
    database `jdbc_uri` (postgresql://USER[:PASSWORD]@HOST:PORT/DB), tables in
    `warehouse`."""
    from urllib.parse import urlsplit

    uri = urlsplit(jdbc_uri)
    prefix = f"spark.sql.catalog.{catalog}"
    return (
        builder.config(prefix, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{prefix}.type", "jdbc")
        .config(f"{prefix}.uri", f"jdbc:postgresql://{uri.hostname}:{uri.port}{uri.path}")
        .config(f"{prefix}.jdbc.user", uri.username or "")
        .config(f"{prefix}.jdbc.password", uri.password or "")
        .config(f"{prefix}.jdbc.schema-version", "V1")
        .config(f"{prefix}.warehouse", warehouse)
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metadata", default="")
    ap.add_argument("--jdbc-uri", default="")
    ap.add_argument("--catalog", default="lake")
    ap.add_argument("--table", default="")
    ap.add_argument("--warehouse", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jars", required=True)
    ap.add_argument("--where", default="")
    args = ap.parse_args()

    from pyspark.sql import SparkSession

    scratch = tempfile.mkdtemp(prefix="floe-spark-")
    builder = SparkSession.builder
    if args.jdbc_uri:
        builder = jdbc_catalog(builder, args.catalog, args.jdbc_uri, args.warehouse)
    spark = (
        builder.master("local[2]")
        .appName("floe-read-spark")
        .config("spark.jars", args.jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "768m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", scratch)
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # Path-based loads go through Iceberg's default catalog: a Hadoop (file) catalog,
        # not Hive.
        .config("spark.sql.catalog.default_iceberg", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.default_iceberg.type", "hadoop")
        .config("spark.sql.catalog.default_iceberg.warehouse", os.path.join(scratch, "iceberg"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.jdbc_uri:
            df = spark.table(f"{args.catalog}.{args.table}")
        else:
            df = spark.read.format("iceberg").load(os.path.abspath(args.metadata))
        if args.where:
            df = df.where(args.where)
        files = []
        try:
            files = sorted(df.inputFiles())
        except Exception:  # noqa: BLE001 - not every plan can list its files
            files = []
        df.write.mode("overwrite").parquet(args.out)
        rows = spark.read.parquet(args.out).count()
    finally:
        spark.stop()
    print(json.dumps({"rows": rows, "files": files}))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report every failure the same way
        print(f"read_spark.py: {type(e).__name__}: {str(e).strip()[:4000]}", file=sys.stderr)
        sys.exit(1)
