"""Lazy tables answer what the eager tables answer, whatever the query: random polars lazy
queries (cross, inner, left, full, semi and anti joins; one side's or both sides' columns or
none; filters before and after the join; heads; aggregations) run on ``trace.scan(...)`` and on
the loaded tables of real exports (a SQLite export, nsys ``parquetdir`` and ``arrowdir``
folders), and the results must be equal.

Issue 44: ``scan("kernels").join(scan("memcpys"), how="cross").select(pl.len())`` answered 0
(a join side none of whose columns the query used was a zero-column scan, and a frame of no
columns has no rows). The property test found that class of bug; the examples below pin it.

The random queries are seeded (``derandomize``) so that CI runs the same ones every time; set
``TRACEKIT_PROPERTY_EXAMPLES`` to run more (and ``TRACEKIT_PROPERTY_RANDOM=1`` for new ones).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import tracekit
from tracekit.nsys import lazy
from tracekit.nsys.schema import TABLES

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "sample_traces" / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = ROOT / "sample_traces" / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"

EXAMPLES = int(os.environ.get("TRACEKIT_PROPERTY_EXAMPLES", "100"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    derandomize=os.environ.get("TRACEKIT_PROPERTY_RANDOM") != "1",
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

#: Tables a random query joins (``gpu_metrics`` too: it is read in windows of its own).
SIDES = ["kernels", "memcpys", "memsets", "syncs", "cuda_api", "nvtx", "gpus", "processes", "threads",
         "memory_usage", "gpu_metrics"]
#: Rows a join of two sides may reach before the larger side is cut with ``head`` (both sides of
#: the comparison get the same cut, so it stays a fair comparison; it also exercises slices).
MAX_PAIRS = 1_500_000
JOINS = ["cross", "inner", "left", "full", "semi", "anti"]
#: Join keys that relate rows of two tables.
KEYS = ["correlation_id", "pid", "device_id", "global_pid", "tid", "global_tid", "stream_id", "context_id"]
#: ``head`` of a side (None: the whole side).
HEADS = [None, None, None, None, 500, 37, 1, 0]


@dataclass
class Traces:
    """One export opened twice: ``scanned`` is only ever scanned, ``eager`` holds the tables."""

    label: str
    scanned: Any
    eager: Any
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)

    def table(self, name: str) -> pl.DataFrame:
        if name not in self.tables:
            self.tables[name] = self.eager.table(name)
        return self.tables[name]


@pytest.fixture(scope="module")
def traces(nsys_columnar: Path) -> list[Traces]:
    paths = [DECODE, TP2, nsys_columnar / "memfusion_report1.parquetdir", nsys_columnar / "memfusion_report1.arrowdir"]
    return [Traces(p.name, tracekit.open(p), tracekit.open(p)) for p in paths]


@pytest.fixture(autouse=True)
def _small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy, "SCAN_BATCH_ROWS", 1500)  # folders' event tables in several windows


# -- a query is a list of steps applied to two LazyFrames, the scanned and the eager ones -----------

Step = Callable[[pl.LazyFrame, pl.LazyFrame], pl.LazyFrame]


def _plain(dtype: pl.DataType) -> bool:
    """A column that sorts and compares exactly (not Binary, not Float)."""
    return dtype in (pl.Int64, pl.String)


def _filter_on(draw: st.DrawFn, frame: pl.DataFrame, columns: list[str]) -> pl.Expr | None:
    """A predicate on one of ``columns`` with a threshold taken from the column's own values
    (so that it keeps some rows and drops others), or None."""
    plain = [c for c in columns if _plain(frame.schema[c])]
    if not plain or draw(st.integers(0, 2)):
        return None
    col = draw(st.sampled_from(plain))
    values = frame[col].drop_nulls()
    kind = draw(st.sampled_from(["cmp", "cmp", "in", "null"]))
    if kind == "null" or values.is_empty():
        return pl.col(col).is_null() if draw(st.booleans()) else pl.col(col).is_not_null()
    value = values[draw(st.integers(0, values.len() - 1))]
    if kind == "in":
        return pl.col(col).is_in([value])
    if frame.schema[col] == pl.String:
        return pl.col(col) >= value
    return pl.col(col) > value


@st.composite
def queries(draw: st.DrawFn, traces: Traces) -> tuple[str, Callable[[Callable[[str], pl.LazyFrame]], pl.LazyFrame]]:
    """A random query over ``traces`` as (a description, a builder taking a ``name → LazyFrame``)."""
    left, right = draw(st.sampled_from(SIDES)), draw(st.sampled_from(SIDES))
    lt, rt = traces.table(left), traces.table(right)
    how = draw(st.sampled_from(JOINS))
    keys = [c for c in TABLES[left] if c in TABLES[right] and TABLES[left][c] == pl.Int64 and TABLES[right][c] == pl.Int64]
    usual = [c for c in KEYS if c in keys]  # keys that match rows; any other shared column now and then
    keys = usual * 3 + keys if usual else keys
    if how != "cross" and not keys:
        how = "cross"
    key = draw(st.sampled_from(keys)) if how != "cross" else None
    l_pred, r_pred = _filter_on(draw, lt, list(lt.columns)), _filter_on(draw, rt, list(rt.columns))
    l_head = draw(st.sampled_from(HEADS))
    r_head = draw(st.sampled_from(HEADS))
    nl = lt.height if l_head is None else min(l_head, lt.height)
    nr = rt.height if r_head is None else min(r_head, rt.height)
    if nl * nr > MAX_PAIRS:  # cut the larger side
        if nl >= nr:
            l_head = max(1, MAX_PAIRS // max(nr, 1))
        else:
            r_head = max(1, MAX_PAIRS // max(nl, 1))
    # what the joined frame's columns are called (the eager plan says)
    joined_schema = _join(lt.lazy(), rt.lazy(), how, key, None, None, None, None).collect_schema()
    names = [c for c, t in joined_schema.items() if _plain(t)]
    right_names = [c for c in names if c.endswith("_right") or (c in rt.columns and c not in lt.columns)]
    left_names = [c for c in names if c not in right_names]
    shape = draw(st.sampled_from(["count", "left", "right", "both", "group", "sum", "unique"]))
    if how in ("semi", "anti") and shape in ("right", "both"):
        shape = "left"
    if shape == "right" and not right_names:
        shape = "count"
    pick: list[str] = []
    if shape in ("left", "right", "both"):
        pool = {"left": left_names, "right": right_names, "both": names}[shape]
        pick = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
    group = draw(st.sampled_from(names)) if names else None
    numeric = [c for c, t in joined_schema.items() if t == pl.Int64]
    measure = draw(st.sampled_from(numeric)) if numeric else None
    after = None
    if draw(st.booleans()) and names:
        col = draw(st.sampled_from(names))
        after = pl.col(col).is_not_null() if draw(st.booleans()) else pl.col(col).is_null()

    def build(source: Callable[[str], pl.LazyFrame]) -> pl.LazyFrame:
        q = _join(source(left), source(right), how, key, l_pred, r_pred, l_head, r_head)
        if after is not None:
            q = q.filter(after)
        if shape == "count" or (shape in ("group", "sum") and (group is None or measure is None)):
            return q.select(pl.len())
        if shape == "group":
            return (q.group_by(group).agg(pl.len().alias("n"), pl.col(measure).sum().alias("total"))
                    .sort(group, nulls_last=True))
        if shape == "sum":
            return q.select(pl.col(measure).sum(), pl.col(measure).null_count().alias("nulls"), pl.len())
        if shape == "unique":
            return q.select(pl.col(group).n_unique())
        return q.select(pick).sort(pick, nulls_last=True)

    text = (f"{traces.label}: {left}{'' if l_pred is None else f'[{l_pred}]'}{'' if l_head is None else f'.head({l_head})'} "
            f"{how} join{'' if key is None else f' on {key}'} {right}{'' if r_pred is None else f'[{r_pred}]'}"
            f"{'' if r_head is None else f'.head({r_head})'}{'' if after is None else f' where {after}'} → {shape} "
            f"{pick or group or ''} {measure or ''}")
    return text, build


def _join(a: pl.LazyFrame, b: pl.LazyFrame, how: str, key: str | None, pa: pl.Expr | None, pb: pl.Expr | None,
          ha: int | None, hb: int | None) -> pl.LazyFrame:
    if pa is not None:
        a = a.filter(pa)
    if pb is not None:
        b = b.filter(pb)
    if ha is not None:
        a = a.head(ha)
    if hb is not None:
        b = b.head(hb)
    if how == "cross":
        return a.join(b, how="cross")
    return a.join(b, on=key, how=how)  # type: ignore[arg-type]


@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["decode.sqlite", "tp2.sqlite", "parquetdir", "arrowdir"])
@PROPERTY
@given(data=st.data())
def test_random_lazy_queries_equal_eager(traces: list[Traces], which: int, data: st.DataObject) -> None:
    t = traces[which]
    text, build = data.draw(queries(t))
    note(text)
    expected = build(lambda n: t.table(n).lazy()).collect()
    got = build(t.scanned.scan).collect()
    assert_frame_equal(got, expected, check_exact=True)
    assert not any(t.scanned.is_loaded(n) for n in ("kernels", "cuda_api", "nvtx"))  # it scanned, never loaded


# -- the cases of the issue, pinned --------------------------------------------------------------

@pytest.mark.parametrize("path", [DECODE, "parquetdir", "arrowdir"])
def test_a_side_whose_columns_are_unused_keeps_its_rows(path: Any, nsys_columnar: Path) -> None:
    if isinstance(path, str):
        path = nsys_columnar / f"memfusion_report1.{path}"
    trace, eager = tracekit.open(path), tracekit.open(path)
    k, m = eager.kernels.height, eager.memcpys.height
    assert k > 0 and m > 0
    cross = trace.scan("kernels").join(trace.scan("memcpys"), how="cross")
    assert cross.select(pl.len()).collect().item() == k * m
    assert cross.select("name").collect().height == k * m  # one side's columns only
    assert cross.select("bytes").collect().height == k * m
    assert trace.scan("kernels").select(pl.len()).collect().item() == k
    ones = trace.scan("cuda_api").with_columns(one=pl.lit(1)).select("one").collect()
    assert ones.height == eager.cuda_api.height
    # a semi join reads no column of the right side but its key
    semi = trace.scan("kernels").join(trace.scan("cuda_api"), on="correlation_id", how="semi").select(pl.len())
    assert semi.collect().item() == eager.kernels.join(eager.cuda_api, on="correlation_id", how="semi").height > 0



@pytest.mark.parametrize("path", [DECODE, TP2, "parquetdir", "arrowdir"])
def test_head_then_filter_cuts_before_it_filters(path: Any, nsys_columnar: Path) -> None:
    """``head(n).filter(p)`` is the first n rows, then filtered (polars hands the source both
    ``n_rows`` and the predicate); the sources filtered first and kept n rows that pass."""
    if isinstance(path, str):
        path = nsys_columnar / f"memfusion_report1.{path}"
    trace, eager = tracekit.open(path), tracekit.open(path)
    for name, keep in (("cuda_api", pl.col("name").str.starts_with("cudaLaunch")), ("nvtx", pl.col("end_ns").is_not_null()),
                       ("gpu_metrics", pl.col("metric") == "sms_active")):
        whole = eager.table(name)
        for n in (1, 50, 1700):
            expected = whole.head(n).filter(keep)
            assert_frame_equal(trace.scan(name).head(n).filter(keep).collect(), expected, check_exact=True)
            assert_frame_equal(trace.scan(name).filter(keep).head(n).collect(), whole.filter(keep).head(n), check_exact=True)


# -- the same through the MCP ``query`` tool's SQL ------------------------------------------------

#: Join clauses of polars' SQL (``{key}`` is the join column).
SQL_JOINS = ["CROSS JOIN {b}", ", {b}", "JOIN {b} ON a.{key} = b.{key}", "LEFT JOIN {b} ON a.{key} = b.{key}",
             "FULL JOIN {b} ON a.{key} = b.{key}", "RIGHT JOIN {b} ON a.{key} = b.{key}",
             "LEFT SEMI JOIN {b} ON a.{key} = b.{key}", "LEFT ANTI JOIN {b} ON a.{key} = b.{key}"]


@st.composite
def sql_queries(draw: st.DrawFn, traces: Traces) -> str:
    """A random read-only SQL join over two of ``traces``' tables (aliases ``a`` and ``b``)."""
    left = draw(st.sampled_from(SIDES))
    fits = [r for r in SIDES if traces.table(left).height * traces.table(r).height <= MAX_PAIRS]
    right = draw(st.sampled_from(fits or [left]))
    if traces.table(left).height * traces.table(right).height > MAX_PAIRS:
        left = right = "gpus"
    lt, rt = traces.table(left), traces.table(right)
    keys = [c for c in KEYS if c in TABLES[left] and c in TABLES[right]]
    joins = SQL_JOINS if keys else SQL_JOINS[:2]
    join = draw(st.sampled_from(joins))
    key = draw(st.sampled_from(keys)) if keys else ""
    one_sided = "SEMI" in join or "ANTI" in join
    a_cols = [c for c in lt.columns if _plain(lt.schema[c])]
    b_cols = [] if one_sided else [c for c in rt.columns if _plain(rt.schema[c])]
    shape = draw(st.sampled_from(["count", "a", "b", "both", "group"]))
    if shape in ("b", "both") and not b_cols:
        shape = "a"
    where = ""
    if draw(st.booleans()):
        side, frame, cols = ("a", lt, a_cols) if not b_cols or draw(st.booleans()) else ("b", rt, b_cols)
        col = draw(st.sampled_from([c for c in cols if frame.schema[c] == pl.Int64] or cols))
        values = frame[col].drop_nulls()
        if values.is_empty() or frame.schema[col] != pl.Int64:
            where = f" WHERE {side}.{col} IS NOT NULL"
        else:
            where = f" WHERE {side}.{col} > {values[draw(st.integers(0, values.len() - 1))]}"
    if shape == "count":
        select, tail = "count(*) AS n", ""
    elif shape == "group":
        col = draw(st.sampled_from(a_cols))
        select, tail = f"a.{col} AS g, count(*) AS n", f" GROUP BY a.{col} ORDER BY g NULLS LAST"
    else:
        pool = ([f"a.{c}" for c in a_cols] if shape in ("a", "both") else []) + (
            [f"b.{c}" for c in b_cols] if shape in ("b", "both") else [])
        picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        named = [f"{p} AS c{i}" for i, p in enumerate(picked)]
        select, tail = ", ".join(named), " ORDER BY " + ", ".join(f"c{i} NULLS LAST" for i in range(len(picked)))
    return f"SELECT {select} FROM {left} a {join.format(b=f'{right} b', key=key)}{where}{tail}"


@pytest.fixture(scope="module")
def session() -> Any:
    from tracekit.agent.tools import Session

    return Session([ROOT / "sample_traces"], keep_open=1)


@PROPERTY
@given(data=st.data())
def test_random_sql_joins_through_the_query_tool(traces: list[Traces], session: Any, data: st.DataObject) -> None:
    """The MCP ``query`` tool (``trace.scan`` under polars' SQL) against the same SQL over the
    eager tables: every page's rows and ``total_rows``."""
    t = traces[0]  # the decode sample, under the sample_traces root
    sql = data.draw(sql_queries(t))
    note(sql)
    names = sorted({w for w in sql.replace(",", " ").split() if w in TABLES})
    expected = pl.SQLContext({n: t.table(n).lazy() for n in names}, register_globals=False).execute(sql).collect()
    limit = data.draw(st.sampled_from([1, 7, 5000]))
    offset = data.draw(st.sampled_from([0, 0, 3]))
    got = session.query(sql, str(DECODE.relative_to(ROOT / "sample_traces")), offset=offset, limit=limit)
    assert got["total_rows"] == expected.height
    page = expected.slice(offset, limit)
    assert got["columns"] == page.columns
    if shape_is_ordered(sql):
        assert got["rows"] == page.to_dicts()
    else:
        assert len(got["rows"]) == page.height


def shape_is_ordered(sql: str) -> bool:
    """Whether ``sql``'s rows come in one order (ORDER BY every column, or one aggregate row)."""
    return " ORDER BY " in sql or sql.startswith("SELECT count(*)")


def test_the_issues_sql_answers() -> None:
    """The answers issue 44 saw as 0 through ``query``."""
    from tracekit.agent.tools import Session

    session = Session([ROOT / "sample_traces"], keep_open=1)
    rel = str(DECODE.relative_to(ROOT / "sample_traces"))
    eager = tracekit.open(DECODE)
    k, m = eager.kernels.height, eager.memcpys.height
    assert session.query("SELECT count(*) FROM kernels a CROSS JOIN kernels b", rel)["rows"] == [{"len": k * k}]
    one_side = session.query("SELECT a.name FROM kernels a CROSS JOIN memcpys b", rel, limit=10)
    assert one_side["total_rows"] == k * m and one_side["returned_rows"] == 10
    both = session.query("SELECT a.name, b.bytes FROM kernels a CROSS JOIN memcpys b", rel, limit=10)
    assert both["total_rows"] == k * m
    assert session.query("SELECT count(*) AS n FROM kernels, memcpys", rel)["rows"] == [{"n": k * m}]
