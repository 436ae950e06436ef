#!/usr/bin/env python3
"""Build the Jackson classes Iceberg's Spark runtime jar expects but does not ship.

iceberg-spark-runtime-3.5_2.12-1.10.2.jar (from the PyPI package
snowpark-connect-deps-iceberg) references org.apache.iceberg.shaded.com.fasterxml.jackson.*
without containing those classes. This copies pyspark's own Jackson 2.15 jars into one
jar with every class moved into that package: the class files' constant pools (class
names, descriptors, string constants) and the entry names are rewritten, which is what
a shading plugin does. Runs in about 2 seconds; no build tool needed.

  shade_jackson.py --pyspark-jars DIR --out FILE.jar
"""

import argparse
import io
import os
import struct
import sys
import zipfile

JARS = ["jackson-core", "jackson-databind", "jackson-annotations", "jackson-datatype-jsr310"]
FROM = (b"com/fasterxml/jackson/", b"com.fasterxml.jackson.")
TO = (b"org/apache/iceberg/shaded/com/fasterxml/jackson/",
      b"org.apache.iceberg.shaded.com.fasterxml.jackson.")


def relocate(data):
    for a, b in zip(FROM, TO):
        data = data.replace(a, b)
    return data


def rewrite_class(data):
    """Rewrites the CONSTANT_Utf8 entries of a class file's constant pool."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    out = io.BytesIO()
    out.write(data[:10])
    count = struct.unpack(">H", data[8:10])[0]
    i = 10
    index = 1
    while index < count:
        tag = data[i]
        if tag == 1:  # Utf8
            n = struct.unpack(">H", data[i + 1:i + 3])[0]
            text = relocate(data[i + 3:i + 3 + n])
            out.write(bytes([1]) + struct.pack(">H", len(text)) + text)
            i += 3 + n
        elif tag in (3, 4):  # Integer, Float
            out.write(data[i:i + 5]); i += 5
        elif tag in (5, 6):  # Long, Double: two slots
            out.write(data[i:i + 9]); i += 9; index += 1
        elif tag in (7, 8, 16, 19, 20):  # Class, String, MethodType, Module, Package
            out.write(data[i:i + 3]); i += 3
        elif tag in (9, 10, 11, 12, 17, 18):  # refs, NameAndType, Dynamic, InvokeDynamic
            out.write(data[i:i + 5]); i += 5
        elif tag == 15:  # MethodHandle
            out.write(data[i:i + 4]); i += 4
        else:
            raise ValueError(f"unknown constant pool tag {tag}")
        index += 1
    out.write(data[i:])
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pyspark-jars", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sources = []
    for name in JARS:
        found = [f for f in os.listdir(args.pyspark_jars) if f.startswith(name + "-2.") and f.endswith(".jar")]
        if len(found) != 1:
            sys.exit(f"shade_jackson.py: expected one {name}-2.*.jar in {args.pyspark_jars}, found {found}")
        sources.append(os.path.join(args.pyspark_jars, found[0]))
    tmp = args.out + ".tmp"
    seen = set()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for src in sources:
            with zipfile.ZipFile(src) as jar:
                for entry in jar.infolist():
                    if entry.is_dir():
                        continue
                    data = jar.read(entry)
                    name = relocate(entry.filename.encode()).decode()
                    if entry.filename.endswith(".class"):
                        data = rewrite_class(data)
                    elif entry.filename.startswith("META-INF/services/"):
                        data = relocate(data)
                    elif entry.filename.startswith("META-INF/"):
                        continue  # manifests, signatures, module info of the originals
                    if name in seen:
                        continue
                    seen.add(name)
                    dst.writestr(name, data)
    os.replace(tmp, args.out)
    print(f"shade_jackson.py: {len(seen)} entries -> {args.out}")


if __name__ == "__main__":
    main()
