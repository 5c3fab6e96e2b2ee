"""Write a SQLite export's tables as an nsys-style ``parquetdir`` and ``arrowdir`` folder.

For benchmarks only: nsys writes these folders from an ``.nsys-rep``, and the big synthetic
exports (``make_big_trace.py``) exist only as ``.sqlite``. The layout follows what nsys
2023.4.4 wrote for tests/data/nsys_columnar.tar.xz: one file per table named after it, the
SQLite column names, Parquet uncompressed with dictionary encoding in row groups of 2,048 rows,
Arrow as an IPC *stream* (``.arrow``). Column types are what the SQLite driver reports
(nsys uses some unsigned and 32-bit types; tracekit casts either way). Tables are streamed in
record batches of 65,536 rows: memory stays small whatever the export's size.

    python benchmarks/make_columnar_export.py benchmarks/out/gm250k.sqlite [--kinds parquetdir,arrowdir]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import time
from pathlib import Path

#: Rows per Parquet row group, as nsys 2023.4.4 writes them.
ROW_GROUP_ROWS = 2048
BATCH_ROWS = 65536


def _tables(path: Path) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    finally:
        con.close()


def convert(export: Path, kind: str) -> Path:
    """Write ``export``'s tables as ``<stem>.<kind>`` beside it (replacing one that is there)."""
    import adbc_driver_sqlite.dbapi as adbc
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = export.with_suffix(f".{kind}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with adbc.connect(f"file:{export.resolve()}?mode=ro&immutable=1") as con:
        for table in _tables(export):
            cur = con.cursor()
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cur.execute(f'SELECT * FROM "{table}"')
            reader = cur.fetch_record_batch()
            schema = reader.schema
            if kind == "parquetdir":
                with pq.ParquetWriter(tmp / f"{table}.parquet", schema, compression="NONE", use_dictionary=True) as w:
                    for batch in reader:
                        w.write_table(pa.Table.from_batches([batch], schema), row_group_size=ROW_GROUP_ROWS)
            else:
                with pa.OSFile(str(tmp / f"{table}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
                    for batch in reader:
                        w.write_batch(batch)
            cur.close()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--kinds", default="parquetdir,arrowdir")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        out = convert(args.export, kind)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"wrote {out} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
