"""Every chart type from the sample traces, rendered to SVG and PDF; theme, sizes, byte stability."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SAMPLES

alt = pytest.importorskip(
    "altair", reason="needs the notebook extra: pip install 'tracekit[notebook]'"
)
pytest.importorskip("vl_convert", reason="needs vl-convert-python (notebook extra)")

import tracekit  # noqa: E402
import tracekit.viz as tv  # noqa: E402
from tracekit.viz import prep, prep_ncu  # noqa: E402
from tracekit.viz.export import canonical_pdf, to_bytes  # noqa: E402

pytestmark = [pytest.mark.notebook]

DECODE = SAMPLES / "llm_decode_1gpu" / "llm_decode_1gpu.sqlite"
TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"
NCU = SAMPLES / "ncu" / "ncu_precisions" / "ncu_precisions.ncu-rep"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"sample trace missing: {path}")
    return path


@pytest.fixture(scope="module")
def tp2() -> Any:
    return tracekit.open(_need(TP2))


@pytest.fixture(scope="module")
def ncu() -> Any:
    pytest.importorskip("ncu_report", reason="needs the ncu extra")
    return tracekit.open(_need(NCU))


def _layers(t: Any) -> pl.DataFrame:
    from tracekit.analysis.memory import layer_memory

    return layer_memory(t.memory_usage, t.nvtx, ranges=r"^layer\.\d+$")


def _charts(t: Any, r: Any) -> dict[str, Callable[[], Any]]:
    return {
        "top_kernels": lambda: tv.top_kernels_chart(t.kernels, n=10),
        "timeline": lambda: tv.timeline_chart(
            t.kernels, memcpys=t.memcpys, nvtx=t.nvtx, max_marks=500
        ),
        "layer_heatmap": lambda: tv.layer_heatmap(
            prep.layer_block_matrix(prep.attributed_kernels(t.kernels, t.cuda_api, t.nvtx))
        ),
        "breakdown": lambda: tv.breakdown_chart(
            prep.temporal_breakdown(t.kernels, t.memcpys, t.memsets)
        ),
        "nccl_bandwidth": lambda: tv.nccl_bandwidth_chart(prep.nccl_bandwidth(t.nccl)),
        "gpu_metrics": lambda: tv.gpu_metrics_chart(t.gpu_metrics, max_points=200),
        "memory": lambda: tv.memory_chart(t.memory_usage),
        "layer_memory": lambda: tv.layer_memory_chart(_layers(t), t.memory_usage),
        "layer_growth": lambda: tv.layer_growth_chart(_layers(t)),
        "durations": lambda: tv.duration_chart(t.kernels),
        "roofline": lambda: tv.roofline_chart(r),
        "tensor_dram": lambda: tv.tensor_dram_chart(r),
        "iterations": lambda: tv.iterations_chart(t.nvtx),
        "speed_of_light": lambda: tv.sol_chart(prep_ncu.kernel_metrics(r).head(1)),
    }


CHART_NAMES = list(_charts(None, None))


@pytest.mark.parametrize("name", CHART_NAMES)
def test_every_chart_renders_to_svg_and_pdf(name: str, tp2: Any, ncu: Any, tmp_path: Path) -> None:
    chart = _charts(tp2, ncu)[name]()
    spec = chart.to_dict()
    rows = sum(len(v) for v in spec.get("datasets", {}).values())
    assert rows <= 5000, f"{name} ships {rows} rows to the browser"
    svg = tv.save(chart, tmp_path / f"{name}.svg", width="column")
    pdf = tv.save(chart, tmp_path / f"{name}.pdf", width="double")
    text = svg.read_text()
    assert text.startswith("<svg") and "Liberation Sans" in text
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    assert b"/FontFile2" in data and re.search(rb"/BaseFont /[A-Z]{6}\+LiberationSans", data), (
        "font not embedded"
    )


def test_outputs_are_byte_stable(tp2: Any) -> None:
    # the screen theme draws bold titles too: two embedded fonts, the case svg2pdf orders at random
    chart = tv.top_kernels_chart(tp2.kernels, n=6, title="Top kernels")
    pdfs = {to_bytes(chart, "pdf", theme=tv.SCREEN_THEME) for _ in range(6)}
    assert len(pdfs) == 1
    assert len({to_bytes(chart, "svg") for _ in range(3)}) == 1
    assert len({to_bytes(chart, "png", scale=1) for _ in range(2)}) == 1


def test_canonical_pdf_has_a_consistent_xref(tp2: Any) -> None:
    data = to_bytes(tv.breakdown_chart(tp2.kernels, title="x"), "pdf", theme=tv.SCREEN_THEME)
    start = int(data.rsplit(b"startxref\n", 1)[1].split(b"\n")[0])
    assert data[start:].startswith(b"xref")
    offsets = [int(m.group(1)) for m in re.finditer(rb"(\d{10}) 00000 n", data)]
    for number, offset in enumerate(offsets, start=1):
        assert data[offset:].startswith(b"%d 0 obj" % number)
    assert canonical_pdf(data) == data  # idempotent
    assert canonical_pdf(b"not a pdf") == b"not a pdf"


def test_widths_are_column_and_double(tp2: Any) -> None:
    chart = tv.breakdown_chart(tp2.kernels)
    for width, points in (("column", 241), ("double", 506), (300, 300)):
        pdf = to_bytes(chart, "pdf", width=width)
        box = re.search(rb"/MediaBox \[0 0 ([\d.]+) ([\d.]+)\]", pdf)
        assert box and abs(float(box.group(1)) - points) <= 1.5
    with pytest.raises(ValueError, match="unknown width"):
        to_bytes(chart, "pdf", width="poster")
    with pytest.raises(ValueError, match="unknown figure format"):
        to_bytes(chart, "tiff")


def test_paper_theme_is_registered() -> None:
    from tracekit.viz.theme import FAMILY_COLORS, PALETTE, paper_config, register_themes

    register_themes()
    assert {tv.PAPER_THEME, tv.SCREEN_THEME} <= set(alt.theme.names())
    cfg = paper_config()
    assert cfg["axis"]["labelFontSize"] == 9 and cfg["axis"]["titleFontSize"] == 10
    assert cfg["font"] == "Liberation Sans"
    assert cfg["range"]["category"] == list(PALETTE)
    assert FAMILY_COLORS["communication"] != FAMILY_COLORS["gemm"]
    fonts = Path(tv.__file__).with_name("fonts")
    assert (fonts / "LiberationSans-Regular.ttf").is_file() and (
        fonts / "LICENSE-LiberationSans.txt"
    ).is_file()


def test_selections_for_drill_down(tp2: Any, ncu: Any) -> None:
    def params(chart: Any) -> set[str]:
        found = set()

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                found.update(p["name"] for p in node.get("params", []) if "select" in p)
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(chart.to_dict())
        return found

    assert params(tv.top_kernels_chart(tp2.kernels)) == {"kernel"}
    assert params(tv.timeline_chart(tp2.kernels, nvtx=tp2.nvtx)) == {"kernel", "window", "zoom"}  # zoom: the wheel
    assert "window" in params(tv.gpu_metrics_chart(tp2.gpu_metrics))
    assert params(tv.roofline_chart(ncu)) == {"kernel"}
    spec = tv.top_kernels_chart(tp2.kernels, highlight="ncclDevKernel_SendRecv").to_dict()
    assert spec["params"][0]["value"] == [{"name": "ncclDevKernel_SendRecv"}]


def test_timeline_never_ships_hundreds_of_thousands_of_marks() -> None:
    n = 300_000
    kernels = pl.DataFrame(
        {
            "device_id": pl.Series([i % 4 for i in range(n)], dtype=pl.Int64),
            "stream_id": pl.Series([7] * n, dtype=pl.Int64),
            "start_ns": pl.Series([i * 1_000 for i in range(n)], dtype=pl.Int64),
            "duration_ns": pl.Series([600] * n, dtype=pl.Int64),
            "short_name": ["gemm_kernel" if i % 3 else "nccl_allreduce" for i in range(n)],
        }
    ).with_columns((pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns"))
    lanes = prep.timeline_ops(prep.gpu_ops(kernels), max_marks=2000)
    assert lanes.height <= 2000 and lanes["binned"].all()
    assert lanes["busy_fraction"].max() <= 1.0
    assert (
        lanes.group_by("lane").agg(pl.col("count").sum())["count"].sum() >= n
    )  # ops split across bins count twice
    spec = tv.timeline_chart(kernels, max_marks=2000).to_dict()
    assert sum(len(v) for v in spec["datasets"].values()) <= 2000
    # a zoomed window is exact again
    window = (1_000_000, 1_050_000)
    exact = prep.timeline_ops(prep.gpu_ops(kernels), window=window, max_marks=2000)
    assert not exact["binned"].any() and exact.height == 50


def test_offline_html_has_no_external_script(tp2: Any) -> None:
    page = tv.to_html(tv.top_kernels_chart(tp2.kernels))
    assert "<script src" not in page and "cdn.jsdelivr" not in page and "esm.sh" not in page
    assert "vegaEmbed(" in page and len(page) > 500_000


def test_enable_notebook_selects_an_offline_renderer() -> None:
    name = tv.enable_notebook()
    assert alt.renderers.active == name and name in ("tracekit", "tracekit_html")
    bundle = alt.renderers.get()(
        tv.top_kernels_chart(pl.DataFrame({"name": ["a"], "duration_ns": [5]})).to_dict()
    )
    assert "esm.sh" not in str(bundle)
    assert tv.enable_notebook(widget=False) == "tracekit_html"
    html = alt.renderers.get()(
        {
            "mark": "point",
            "data": {"values": [{"a": 1}]},
            "encoding": {"x": {"field": "a", "type": "quantitative"}},
        }
    )
    assert "vegaEmbed(" in html["text/html"] and "<script src" not in html["text/html"]
    alt.renderers.enable("default")
    alt.theme.enable("default")


def test_missing_data_gives_empty_frames_not_errors() -> None:
    empty_nvtx = pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                      "name": pl.Utf8, "event_type": pl.Utf8})  # fmt: skip
    assert prep.iteration_times(empty_nvtx).is_empty()
    assert prep.timeline_nvtx(pl.DataFrame()).is_empty()
    g = pl.DataFrame(
        schema={
            "device_id": pl.Int64,
            "timestamp_ns": pl.Int64,
            "metric": pl.Utf8,
            "metric_label": pl.Utf8,
            "value": pl.Int64,
        }
    )
    assert prep.gpu_metrics_series(g).is_empty()


def test_layer_memory_charts_of_no_ranges_render_empty(tp2: Any) -> None:
    from tracekit.analysis.memory import layer_memory
    from tracekit.errors import EmptyResultWarning

    with pytest.warns(EmptyResultWarning, match="no NVTX range label matches"):
        none = layer_memory(tp2.memory_usage, tp2.nvtx, ranges="^no such range$")
    assert prep.layer_bands(none).is_empty() and prep.layer_memory_series(tp2.memory_usage, none).is_empty()
    for chart in (tv.layer_memory_chart(none, tp2.memory_usage), tv.layer_growth_chart(none)):
        assert to_bytes(chart, "svg").startswith(b"<svg")


def test_layer_memory_prep_frames(tp2: Any) -> None:
    """Bands are the outermost selected ranges; the line starts at the in-use total at the
    first band's start and ends at the last band's end, per process and GPU."""
    from tracekit.analysis.memory import layer_memory

    rows = layer_memory(tp2.memory_usage, tp2.nvtx, ranges=r"^(layer\.\d+|attn)$")
    bands = prep.layer_bands(rows)
    assert set(bands["name"]) == {"layer.0", "layer.1", "layer.2", "layer.3"}  # attn is nested: no band
    assert set(bands["lane"]) == {"pid 884 · GPU 0", "pid 885 · GPU 0", "pid 885 · GPU 1"}
    series = prep.layer_memory_series(tp2.memory_usage, rows, max_points=50)
    assert series.select("lane").n_unique() == 3
    for (pid, dev), part in series.sort("time_ns").group_by(["pid", "device_id"], maintain_order=True):
        lane = rows.filter((pl.col("pid") == pid) & (pl.col("device_id") == dev))
        assert part.height <= 51 and part["time_ns"][0] == rows["start_ns"].min()
        # the last point is the total after the last range of the lane (no event at its exact end)
        assert part["in_use_bytes"][-1] == lane.sort("end_ns")["in_use_at_exit_bytes"][-1]
        assert part["peak_bytes"].max() >= lane["peak_inside_bytes"].max()
    growth = prep.layer_growth(rows)
    assert growth.filter(pl.col("name") == "attn")["mean_net_growth_bytes"][0] > 0


def test_save_replaces_the_file_through_a_temporary_name(tmp_path: Path) -> None:
    """tv.save wrote the figure in place (a reader could see half a PDF); now it is written
    beside it and renamed over it, leaving no temporary file."""
    k = tracekit.open(DECODE).kernels
    out = tmp_path / "fig.svg"
    out.write_text("old")
    before = out.stat().st_ino
    tv.save(tv.top_kernels_chart(k, n=5), out, width="column")
    assert out.stat().st_ino != before and out.read_text().startswith("<svg")
    assert [p.name for p in tmp_path.iterdir()] == ["fig.svg"]


def test_series_charts_of_four_gpus_stay_under_altairs_row_limit() -> None:
    """3 GPU metrics on each of llm_tp2pp2_nccl's 4 GPUs at 600 points each were 5,676 rows:
    altair raised MaxRowsError and `tracekit report` printed 'This section could not be built'
    for GPU metrics. The points per series now shrink to fit; every GPU and metric stays."""
    from tracekit.viz.charts import ROW_BUDGET

    trace = tracekit.open(SAMPLES / "llm_tp2pp2_nccl" / "llm_tp2pp2_nccl.sqlite")
    full = prep.gpu_metrics_series(trace.gpu_metrics)
    assert full.height > 5000  # what the chart embedded before
    spec = tv.gpu_metrics_chart(trace.gpu_metrics).to_dict()  # raised MaxRowsError
    rows = next(iter(spec["datasets"].values()))
    assert len(rows) <= ROW_BUDGET
    assert {(r["device_id"], r["metric"]) for r in rows} == set(full.select("device_id", "metric").unique().iter_rows())
    # the sample's events on 16 devices, spread evenly over the capture so every bin has some
    spread = pl.int_range(pl.len(), dtype=pl.Int64).over("device_id") * 10**9 // pl.len().over("device_id")
    mu = trace.memory_usage.with_columns(spread.alias("start_ns"))
    many = pl.concat([mu.with_columns(pl.col("device_id") + 4 * i) for i in range(4)])
    assert prep.memory_series(many).height > 5000  # 16 devices x 800 points
    spec = tv.memory_chart(many).to_dict()
    assert len(next(iter(spec["datasets"].values()))) <= ROW_BUDGET


def test_nccl_chart_samples_points_but_not_medians(tp2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond NCCL_MAX_POINTS calls the points are a sample, said in the subtitle; the median
    line is over every call (it was over the sample)."""
    from tracekit.viz import charts

    calls = prep.nccl_bandwidth(tp2.nccl).filter(pl.col("bytes") > 0)
    assert calls.height > 10
    monkeypatch.setattr(charts, "NCCL_MAX_POINTS", 10)
    spec = tv.nccl_bandwidth_chart(calls).to_dict()
    data = spec["datasets"]
    points = data[spec["layer"][0]["data"]["name"]]
    medians = data[spec["layer"][1]["data"]["name"]]
    assert len(points) == 10
    # the subtitle is wrapped into lines that fit a one-column figure
    assert " ".join(spec["title"]["subtitle"]) == f"10 of {calls.height:,} calls drawn (a random sample); medians over all"
    by_hand = calls.group_by("op" if "op" in calls.columns else "collective", "bytes").agg(pl.col("bus_bandwidth_gbps").median())
    assert len(medians) == by_hand.height
    assert sorted(round(r["bus_bandwidth_gbps"], 9) for r in medians) == sorted(
        round(v, 9) for v in by_hand["bus_bandwidth_gbps"].to_list())
