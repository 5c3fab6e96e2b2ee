"""Reading ncu's CSV exports without the ``ncu_report`` module.

* ``ncu --import r.ncu-rep --csv --page raw --print-units base > r.csv``: row 1 names,
  row 2 units, one row per profiled result; fixed columns (``ID``, ``Process ID``,
  ``Kernel Name``, the NVTX stack, ``Context``, ``Stream``, ``Block Size``, ``Grid Size``,
  ``Device``, ``CC``) then one column per metric.
* ``ncu --import r.ncu-rep --csv --page details --print-details all``: its rule rows give
  the ``rules`` table (:func:`read_details_rules`).

Numbers carry thousands separators (``"1,007,828,344,752.98"``) and doubles are printed
with two decimals; ``""``, ``"n/a"``, ``"no data"`` and ``"nan"`` become null.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import polars as pl

from tracekit.errors import TraceFormatError
from tracekit.ncu import schema

NUMBER = r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?$"
NULL_TEXTS = ("", "n/a", "N/A", "no data", "nan", "NaN", "-nan")

FIXED = {
    "ID": "id",
    "Process ID": "pid",
    "Process Name": "process_name",
    "Kernel Name": "name",
    "Context": "context_id",
    "Stream": "stream_id",
    "Device": "device_id",
    "CC": "compute_capability",
    "Block Size": "block_size",
    "Grid Size": "grid_size",
}
NVTX_PUSH_POP = "thread Domain:Push/Pop_Range"
NVTX_START_END = "Id:Domain:Start/Stop_Range"
HOST_NAME = "Host Name"


def _text(path: Path) -> str:
    raw = path.read_bytes().decode("utf-8-sig", errors="replace")
    # ncu may interleave its own ==PROF==/==WARNING== lines when run without --import.
    return "\n".join(line for line in raw.splitlines() if not line.startswith("=="))


def is_ncu_csv(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes) looks like an ncu raw or details CSV."""
    text = head.decode("utf-8-sig", errors="replace")
    for line in text.splitlines():
        if line.startswith("==") or not line.strip():
            continue
        return line.lstrip().startswith(('"ID"', "ID,"))
    return False


def _read(path: Path) -> pl.DataFrame:
    text = _text(path)
    try:
        frame = pl.read_csv(io.StringIO(text), infer_schema=False, has_header=True)
    except pl.exceptions.PolarsError as exc:
        msg = f"{path} is not a readable ncu CSV ({type(exc).__name__}); export it again with `ncu --import REPORT --csv --page raw --print-units base`"
        raise TraceFormatError(msg) from None
    if "ID" not in frame.columns:
        msg = f"{path} has no 'ID' column; export it with `ncu --import REPORT --csv --page raw --print-units base`"
        raise TraceFormatError(msg)
    return frame


class RawCsv:
    """A raw-page CSV split into per-result identity rows and a long metric frame."""

    def __init__(self, path: Path) -> None:
        self.path = path
        frame = _read(path)
        if "Section Name" in frame.columns:
            msg = f"{path} is a details-page CSV; NcuReport reads `--page raw --print-units base` (pass details CSVs as details_csv=)"
            raise TraceFormatError(msg)
        units: dict[str, str] = {}
        if frame.height and (frame["ID"][0] is None or frame["ID"][0] == ""):
            units = {c: v for c, v in frame.row(0, named=True).items() if v}
            frame = frame.slice(1)
        # every result row has a numeric ID: a repeated header line (CSV files concatenated) or
        # any other stray row means the file is not one raw-page export
        ids = frame["ID"].str.replace_all(",", "").str.strip_chars()
        bad = frame.filter(ids.cast(pl.Int64, strict=False).is_null())
        if bad.height:
            first = bad["ID"][0]
            msg = (
                f"{path} has {bad.height} row(s) whose ID is not a number (first: {first!r}: a repeated header "
                "line, or several CSVs joined); export one report again with `ncu --import REPORT --csv --page raw --print-units base`"
            )
            raise TraceFormatError(msg)
        self.frame = frame
        self.units = units
        self.metric_columns = [
            c
            for c in frame.columns
            if c not in FIXED
            and c != HOST_NAME
            and not c.startswith((NVTX_PUSH_POP, NVTX_START_END))
        ]

    def identity(self) -> pl.DataFrame:
        """Identity rows: ids, names, NVTX stack and the fixed launch columns."""
        f = self.frame
        cols = {new: pl.col(old) for old, new in FIXED.items() if old in f.columns}
        out = f.select([e.alias(n) for n, e in cols.items()])
        nvtx_col = next((c for c in f.columns if c.startswith(NVTX_PUSH_POP)), None)
        parsed = [_parse_nvtx(v) for v in (f[nvtx_col] if nvtx_col else [None] * f.height)]
        out = out.with_columns(
            pl.Series("tid", [p[0] for p in parsed], dtype=pl.Int64),
            pl.Series("nvtx_paths", [p[1] for p in parsed], dtype=schema.NVTX_PATHS),
        )
        out = out.with_columns(
            pl.col("nvtx_paths")
            .list.eval(
                pl.element().filter(pl.element().struct.field("domain") == "<default domain>")
            )
            .list.first()
            .struct.field("path")
            .alias("nvtx_path"),
        )
        for src, prefix in (("grid_size", "grid"), ("block_size", "block")):
            if src in out.columns:
                dims = pl.col(src).str.extract_all(r"\d+")
                out = out.with_columns(
                    dims.list.get(i, null_on_oob=True).cast(pl.Int64).alias(f"{prefix}_{axis}")
                    for i, axis in enumerate("xyz")
                )
        ints = [
            c for c in ("id", "pid", "context_id", "stream_id", "device_id") if c in out.columns
        ]
        return out.with_columns(
            pl.col(c).str.replace_all(",", "").cast(pl.Int64, strict=False) for c in ints
        )

    def metrics(self) -> pl.DataFrame:
        """The long ``metrics`` table (types inferred from names; no instance counts)."""
        if not self.metric_columns:
            return schema.empty(schema.METRICS)
        long = self.frame.select(
            pl.col("ID").str.replace_all(",", "").cast(pl.Int64).alias("id"), *self.metric_columns
        ).unpivot(index="id", variable_name="metric", value_name="raw")
        raw = pl.col("raw").fill_null("").str.strip_chars()
        number = raw.str.contains(NUMBER)
        digits = raw.str.replace_all(",", "")
        value = pl.when(number).then(digits.cast(pl.Float64, strict=False))
        huge = number & ~digits.str.contains(r"[.eE]") & (digits.str.len_chars() > 15)
        text = (
            pl.when(huge & (value.abs() > 2.0**53))
            .then(digits)
            .when(~number & ~raw.is_in(list(NULL_TEXTS)))
            .then(raw)
        )
        units = pl.DataFrame(
            {"metric": list(self.units), "unit": list(self.units.values())},
            schema={"metric": pl.Utf8, "unit": pl.Utf8},
        )
        names = long.select(pl.col("metric").unique())
        inferred = names.with_columns(
            pl.col("metric")
            .map_elements(lambda n: schema.split_metric_name(n)[1], return_dtype=pl.Utf8)
            .alias("rollup"),
            pl.col("metric")
            .map_elements(lambda n: schema.split_metric_name(n)[2], return_dtype=pl.Utf8)
            .alias("subtype"),
            pl.col("metric")
            .map_elements(schema.infer_metric_type, return_dtype=pl.Utf8)
            .alias("metric_type"),
        )
        out = (
            long.with_columns(value.alias("value"), text.alias("text"))
            .join(units, on="metric", how="left")
            .join(inferred, on="metric", how="left")
        )
        return schema.conform(out, schema.METRICS).sort("id", maintain_order=True)


_ENTRY = re.compile(r'"([^"]*)"')


def _parse_nvtx(cell: str | None) -> tuple[int | None, list[dict[str, str]]]:
    """``1937  "<default domain>:prec:none:…"  "<default domain>:bf16:none:…"`` →
    ``(1937, [{"domain": "<default domain>", "path": "prec/bf16"}])``."""
    if not cell or not cell.strip():
        return None, []
    head = re.match(r"\s*(\d+)", cell)
    tid = int(head.group(1)) if head else None
    stacks: dict[str, list[str]] = {}
    for entry in _ENTRY.findall(cell):
        fields = entry.split(":")
        if len(fields) < 8:
            continue
        # Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg; a range
        # name may contain ':', the six trailing fields never do.
        stacks.setdefault(fields[0], []).append(":".join(fields[1:-6]))
    return tid, [{"domain": d, "path": "/".join(s)} for d, s in stacks.items()]


def read_details_rules(path: str | Path) -> pl.DataFrame:
    """The ``rules`` table from a ``--page details --print-details all`` CSV.

    ncu's details CSV lacks rule titles and focus metrics; those columns are null.
    """
    path = Path(path)
    frame = _read(path)
    needed = ("Section Name", "Rule Name", "Rule Type", "Rule Description")
    if not all(c in frame.columns for c in needed):
        msg = f"{path} is not a details-page CSV; export it with `ncu --import REPORT --csv --page details --print-details all`"
        raise TraceFormatError(msg)
    rules = frame.filter(pl.col("Rule Name").is_not_null() & (pl.col("Rule Name") != ""))
    speedup = (
        pl.col("Estimated Speedup").str.replace_all(",", "").cast(pl.Float64, strict=False)
        if "Estimated Speedup" in rules.columns
        else pl.lit(None, pl.Float64)
    )
    speedup_type = (
        pl.col("Estimated Speedup Type").replace("", None)
        if "Estimated Speedup Type" in rules.columns
        else pl.lit(None, pl.Utf8)
    )
    out = rules.select(
        pl.col("ID").str.replace_all(",", "").cast(pl.Int64).alias("id"),
        pl.col("Rule Name").alias("rule_id"),
        pl.col("Section Name").alias("section"),
        pl.col("Rule Description").alias("message"),
        pl.col("Rule Type").replace_strict(schema.RULE_TYPES_CSV, default=None).alias("type"),
        speedup_type.alias("speedup_type"),
        speedup.alias("estimated_speedup_pct"),
    )
    return schema.conform(out, schema.RULES)
