"""The views of :class:`~tracekit.widgets.explorer.TraceExplorer`'s tabs: what each shows for the
trace and window (overview, top kernels, instances, NVTX tree, timeline, communication, GPU
metrics, memory). A mixin: the state, layout and selection plumbing are in ``explorer.py``."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.viz.prep import nvtx_tree
from tracekit.widgets._common import fmt_bytes, fmt_ns, html_table

#: The top-kernels sort picker: label → :data:`tracekit.viz.prep.TOP_SORTS` key.
SORT_KEYS = {"GPU time": "total", "mean duration": "mean", "longest instance": "max", "instances": "instances"}


class ExplorerViews:
    """The tab refreshers of :class:`~tracekit.widgets.explorer.TraceExplorer` (it holds the
    attributes they read: ``trace``, ``prep``, ``views``, the controls, the window)."""

    trace: Any
    prep: Any
    views: dict[str, Any]
    errors: dict[str, str]
    _layer_cache: tuple[str, pl.DataFrame, str | None] | None

    if TYPE_CHECKING:  # the rest of the explorer's state, for the type checker

        def __getattr__(self, name: str) -> Any: ...

    def _refresh_all(self) -> None:
        self._refresh_overview()
        self._refresh_top()
        self._refresh_instances()
        self._refresh_nvtx()
        self._refresh_timeline()
        self._refresh_comm()
        self._refresh_metrics()
        self._refresh_memory()

    def _refresh_overview(self) -> None:
        t = self.trace
        k = self._in_window(self.kernels)
        lo, hi = self._effective_window()
        win = self.current_window()
        devices = [k["device_id"]] + ([self._in_window(self.graph_ops)["device_id"]] if self.graph_ops is not None else [])
        gpus = pl.concat(devices).drop_nulls().n_unique() if devices else 0
        meta = getattr(t, "meta", None)
        busy = self._busy_line()
        memcpys = self._in_window(t.memcpys)
        rows = [
            ("trace", html.escape(str(getattr(t, "path", "")))),
            (
                "nsys",
                html.escape(
                    str(getattr(meta, "version", "") or getattr(meta, "product_version", "") or "?")
                ),
            ),
            ("run", html.escape(self._run_line())),
            ("window", html.escape(win.label())),
            ("GPUs with GPU work", str(gpus)),
            *([("GPU busy", html.escape(busy))] if busy else []),
            ("kernels", f"{k.height:,}"),
            ("kernel time", fmt_ns(k["duration_ns"].sum() if not k.is_empty() else 0)),
            *self._graph_facts(),
            ("memcpy", f"{memcpys.height:,} ({fmt_bytes(memcpys['bytes'].sum() if memcpys.height else 0)})"),
            ("NVTX events", f"{t.nvtx.height:,}" if t.nvtx.height else "none (" + html.escape(self._hint("nvtx")) + ")"),
            ("GPU metric samples", f"{t.gpu_metrics.height:,}" if t.gpu_metrics.height else "none (" + html.escape(self._hint("gpu_metrics")) + ")"),
        ]
        if k.is_empty() and self.graph_ops is None:
            rows.append(("note", html.escape(self._hint("kernels"))))
        self.summary.value = (
            "<table>"
            + "".join(f"<tr><td style='vertical-align:top;white-space:nowrap'><b>{a}</b></td><td>{b}</td></tr>" for a, b in rows)
            + "</table>"
        )

        def breakdown() -> None:
            from tracekit.viz import breakdown_chart

            if t.kernels.is_empty() and self.graph_ops is None:
                self.breakdown = pl.DataFrame()
                msg = self._hint("kernels")
                self.views["overview"].message(msg)
                self.views["breakdown"].message(msg)
                return
            frame = self.prep.temporal_breakdown(
                t.kernels, t.memcpys, t.memsets, self.graph_ops, window=(lo, hi)
            )
            self.breakdown = frame
            chart = breakdown_chart(frame, window=win, title="Where the GPU time goes")
            self.views["overview"].show(chart)
            self.views["breakdown"].show(chart)

        self._guard("breakdown", self.views["overview"], breakdown)

        def iterations() -> None:
            st = self.structure
            its = self.prep.structure_iterations(st)
            if its.is_empty():
                self.views["iterations"].message(f"no iterations: {st.reason}")
                return
            from tracekit.viz import iterations_chart

            self.views["iterations"].show(iterations_chart(its, title="Iterations", subtitle=st.headline()))

        self._guard("iterations", self.views["iterations"], iterations)

    def _hint(self, what: str) -> str:
        from tracekit.viz.notes import hint

        return hint(what, self.trace)

    def _busy_line(self) -> str:
        """Each GPU's busy share of the window (kernels, copies, graph replays; overlaps once)."""
        try:
            from tracekit.analysis.gpu_time import busy_time, gpu_ops

            t = self.trace
            ops = gpu_ops(t.kernels, t.memcpys, t.memsets, self.graph_ops)
            lo, hi = self._effective_window()
            ops = ops.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi)).with_columns(
                pl.col("start_ns").clip(lo, hi), pl.col("end_ns").clip(lo, hi))
            if ops.is_empty():
                return ""
            b = busy_time(ops).sort([c for c in ("rank", "device_id") if c in ops.columns])
            parts = [f"GPU {r['device_id']}: {100 * r['busy_ns'] / max(hi - lo, 1):.0f} %"
                     + (f" (rank {r['rank']})" if "rank" in r else "") for r in b.iter_rows(named=True)]
            return " · ".join(parts[:8]) + (" …" if len(parts) > 8 else "") + " of the window"
        except Exception as exc:  # the overview stays up
            self.errors["busy"] = f"{type(exc).__name__}: {exc}"
            return ""

    def _run_line(self) -> str:
        """The run's structure in one line, or why there is none (the explorer stays up)."""
        try:
            return str(self.structure.headline())
        except Exception as exc:  # keep the explorer alive
            self.errors["structure"] = f"{type(exc).__name__}: {exc}"
            return f"(no structure: {type(exc).__name__})"

    def _graph_facts(self) -> list[tuple[str, str]]:
        """The overview's line on CUDA graph replays traced whole in the window (none without)."""
        if self.graph_ops is None:
            return []
        g = self._in_window(self.graph_ops)
        return [("CUDA graph replays", f"{g.height:,} traced whole, {fmt_ns(g['duration_ns'].sum())} "
                                       "(their kernels are not in the trace)")]

    def _refresh_top(self) -> None:
        k = self._in_window(self.kernels)
        pattern = self.filter_text.value.strip()
        if pattern:
            try:
                k = k.filter(pl.col("name").str.contains(pattern))
            except Exception:
                k = k.filter(pl.col("name").str.contains(pattern, literal=True))
        sort = SORT_KEYS[self.sort_by.value]
        top = self.prep.top_kernels(k, n=self.top_n.value, by="name", sort=sort) if k.height else self.prep.top_kernels(k, n=1, by="name")
        top = self.prep.with_kernel_labels(top, self._raw_kernels)
        self.top = top
        current = self.selected_kernel or ""
        names = top["name"].to_list()
        options = [("(none)", "")] + list(zip(top["label"].to_list(), names, strict=True))
        if current and current not in names:
            options.append((current if len(current) < 90 else current[:89] + "…", current))
        self._set_picker(options, current)
        win = self.current_window()
        steps = int(getattr(self._structure_or_none(), "steps", 0) or 0) if win.kind == "steady" else 0
        shown = top.select(
            pl.col("label").alias("kernel"), "family", "instances",
            (pl.col("total_ns") / 1e6).alias("total_ms"),
            *([(pl.col("total_ns") / steps / 1e6).alias("per_step_ms")] if steps else []),
            (pl.col("mean_ns") / 1e3).alias("mean_us"),
            (pl.col("max_ns") / 1e3).alias("max_us"), (pl.col("share") * 100).alias("share_pct"), "name")
        activity = self._kernel_activity(k, top)
        if activity is not None:
            shown = shown.join(activity, on="name", how="left", maintain_order="left")
        self.top_activity = activity
        key = self.prep.TOP_SORTS[sort][1]
        caption = (f"<b>Top {top.height} kernels by {html.escape(key)}</b> — {html.escape(win.label())}"
                   if top.height else f"<i>no kernels in the {html.escape(win.label())}</i>")
        self.top_table.value = f"<p>{caption}</p>" + (html_table(
            shown,
            formats={"total_ms": "{:,.3f}".format, "per_step_ms": "{:,.3f}".format, "mean_us": "{:,.2f}".format,
                     "max_us": "{:,.2f}".format, "share_pct": "{:.1f}".format, "instances": "{:,}".format,
                     "tensor_active_pct": "{:.1f}".format, "dram_read_gbps": "{:,.0f}".format,
                     "dram_write_gbps": "{:,.0f}".format},
            left=("kernel", "family"),
            clip={"kernel": "name"},
            hidden=("name",),
            highlight=lambda row: row["name"] == self.selected_kernel,
        ) if top.height else "")

        def chart() -> None:
            from tracekit.viz import top_kernels_chart

            if top.is_empty():
                self.views["top"].message(f"no kernels in the {win.label()}" if self.kernels.height else self._hint("kernels"))
                return
            self.views["top"].show(top_kernels_chart(top, sort=sort, window=win, highlight=self.selected_kernel))

        self._guard("top", self.views["top"], chart)

    def _structure_or_none(self) -> Any:
        try:
            return self.structure
        except Exception:  # the views stay up without one
            return None

    def _kernel_activity(self, kernels: pl.DataFrame, top: pl.DataFrame) -> pl.DataFrame | None:
        """Per kernel shown: the GPU metrics while its instances ran in the window
        (duration-weighted; :func:`tracekit.analysis.metrics.kernel_metrics`): ``tensor_active_pct``,
        ``dram_read_gbps``/``dram_write_gbps`` (from the GPU's peak); ``None`` without metrics."""
        g = self.trace.gpu_metrics
        if g.is_empty() or top.is_empty():
            return None
        try:
            from tracekit.analysis.metrics import kernel_metrics, metric_names, metrics_by

            present = [m for m in ("tensor_active", "dram_read_bandwidth", "dram_write_bandwidth") if m in metric_names(g)]
            if not present:
                return None
            mine = kernels.filter(pl.col("name").is_in(top["name"].to_list()))
            per = metrics_by(kernel_metrics(mine.select("name", *[c for c in ("rank",) if c in mine.columns], "device_id",
                                                        "start_ns", "end_ns", "duration_ns"), g, metrics=present),
                             ["name"], metrics=present)
            out = per.select("name", *[pl.col(m).alias(f"{m}_pct") for m in present])
            from tracekit.viz.prep_series import _peak_bandwidth

            peak = _peak_bandwidth(getattr(self.trace, "gpus", None))
            if peak is not None:
                bw = float(peak["peak_bytes_per_s"].mean())  # type: ignore[arg-type]
                out = out.with_columns(*[(pl.col(f"{m}_pct") / 100 * bw / 1e9).alias(m.replace("_bandwidth", "_gbps"))
                                         for m in present if m.startswith("dram_")])
                out = out.drop([f"{m}_pct" for m in present if m.startswith("dram_")])
            return out
        except Exception as exc:  # the table stays up without these columns
            self.errors["kernel_metrics"] = f"{type(exc).__name__}: {exc}"
            return None

    def _kernel_rows(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The rows of ``frame`` of the selected kernel: by full name, or by short name when
        the selection is one (set from code)."""
        name = self.selected_kernel
        if "name" in frame.columns and frame.filter(pl.col("name") == name).height:
            return frame.filter(pl.col("name") == name)
        if "short_name" in frame.columns:
            return frame.filter(pl.col("short_name") == name)
        return frame.clear()

    def _refresh_instances(self) -> None:
        name = self.selected_kernel
        if not name:
            self.instances = pl.DataFrame()
            self.instances_html.value = ""
            return
        a = self.attributed
        inst = self._in_window(self._kernel_rows(a)).sort("start_ns")
        keep = [
            c
            for c in (
                "device_id",
                "stream_id",
                "start_ns",
                "duration_ns",
                "grid_x",
                "block_x",
                "nvtx_path",
            )
            if c in inst.columns
        ]
        self.instances = inst.select(keep)
        shown = self.instances.with_columns(
            ((pl.col("start_ns") - self.origin_ns) / 1e6).alias("start_ms"),
            (pl.col("duration_ns") / 1e3).alias("duration_us"),
        ).drop("start_ns", "duration_ns")
        self.instances_html.value = (
            f"<h4>{html.escape(name)}: {inst.height} instances in the {html.escape(self.current_window().label())}</h4>"
            + html_table(
                shown,
                formats={"duration_us": "{:,.2f}".format, "start_ms": "{:,.4f}".format},
                left=("nvtx_path",),
                clip={"nvtx_path": "nvtx_path"} if "nvtx_path" in shown.columns else None,
                max_rows=100,
            )
        )

    def _refresh_nvtx(self) -> None:
        a = self._in_window(self.attributed)
        if self.selected_kernel:
            a = self._kernel_rows(a)
        rows = (
            nvtx_tree(a, max_depth=self.nvtx_depth.value)
            if "nvtx_path" in a.columns
            else pl.DataFrame()
        )
        self.nvtx_rows = rows
        if rows.is_empty():
            why = self._hint("nvtx") if self.trace.nvtx.is_empty() else "no GPU work inside NVTX ranges"
            self.nvtx_html.value = (
                f"<i>{html.escape(why)}"
                + (" for this kernel" if self.selected_kernel and not self.trace.nvtx.is_empty() else "")
                + f" — {html.escape(self.current_window().label())}</i>"
            )
            return
        shown = rows.head(400).with_columns(
            pl.concat_str(
                pl.lit("\u2003").repeat_by(pl.col("depth") - 1).list.join(""), pl.col("name")
            ).alias("range"),
            (pl.col("gpu_time_ns") / 1e6).alias("gpu_time_ms"),
            (pl.col("share") * 100).alias("share_pct"),
        )
        title = (f"<h4>GPU time by NVTX range{' — ' + html.escape(self.selected_kernel) if self.selected_kernel else ''}"
                 f" <small>({html.escape(self.current_window().label())})</small></h4>")
        self.nvtx_html.value = title + html_table(
            shown.select("range", "gpu_time_ms", "ops", "share_pct"),
            formats={"gpu_time_ms": "{:,.3f}".format, "share_pct": "{:.1f}".format, "ops": "{:,}".format},
            left=("range",),
            max_rows=400,
        )

    def _refresh_timeline(self) -> None:
        lo, hi = self._effective_window()
        self.window_label.value = (
            f"<small>{fmt_ns(hi - lo)} shown: drag on the chart to zoom in (re-drawn exactly), "
            "wheel to zoom the drawing, shift-drag to pan</small>"
        )

        def build() -> None:
            from tracekit.viz import timeline_chart

            t = self.trace
            ops = self.prep.gpu_ops(t.kernels, t.memcpys, t.memsets, self.graph_ops, name_column="name")
            lanes = self.prep.timeline_ops(ops, window=(lo, hi), max_marks=self.max_marks)
            self.timeline_lanes = lanes
            nvtx = t.nvtx if self.show_nvtx.value else None
            api = t.cuda_api if self.show_api.value else None
            try:
                structure = self.structure
            except Exception:  # no structure: no step marks
                structure = None
            chart = timeline_chart(
                lanes,
                nvtx=nvtx,
                cuda_api=api,
                structure=structure,
                window=self.current_window(),
                origin_ns=self.origin_ns,
                highlight=self.selected_kernel,
                title="Timeline",
                width=760,
            )
            self.views["timeline"].show(chart)

        self._guard("timeline", self.views["timeline"], build)

    def _refresh_comm(self) -> None:
        win = self.current_window()
        k = self._in_window(self.kernels).filter(pl.col("family") == "communication")
        if k.is_empty():
            self.comm_html.value = f"<i>no communication kernels (NCCL or custom collectives) in the {html.escape(win.label())}</i>"
        else:
            top = self.prep.top_kernels(k, n=30, by="name")
            self.comm_html.value = f"<h4>Communication kernels <small>({html.escape(win.label())})</small></h4>" + html_table(
                top.select("name", "instances", (pl.col("total_ns") / 1e6).alias("total_ms"),
                           (pl.col("mean_ns") / 1e3).alias("mean_us"), (pl.col("max_ns") / 1e3).alias("max_us")),
                formats={"total_ms": "{:,.3f}".format, "mean_us": "{:,.2f}".format, "max_us": "{:,.2f}".format},
                left=("name",), clip={"name": "name"},
            )

        def nccl() -> None:
            calls = getattr(self.trace, "nccl", None)
            if calls is None or calls.is_empty():
                self.views["nccl"].message(self._hint("nccl"))
                return
            calls = self._in_window(
                self.prep.nccl_bandwidth(calls).filter(pl.col("start_ns").is_not_null())
            )
            if calls.is_empty() or calls["bus_bandwidth_gbps"].drop_nulls().is_empty():
                self.views["nccl"].message(f"no NCCL calls with message sizes in the {win.label()}")
                return
            from tracekit.viz import nccl_bandwidth_chart

            self.nccl_calls = calls
            self.views["nccl"].show(nccl_bandwidth_chart(calls, window=win, title="NCCL bus bandwidth"))

        self._guard("nccl", self.views["nccl"], nccl)

    def _refresh_metrics(self) -> None:
        def build() -> None:
            g = self.trace.gpu_metrics
            if g.is_empty():
                self.views["metrics"].message(self._hint("gpu_metrics"))
                return
            from tracekit.viz import gpu_metrics_chart
            from tracekit.viz.charts import within_row_budget

            win = self.current_window()
            gpus = getattr(self.trace, "gpus", None)
            series = within_row_budget(
                lambda n: self.prep.gpu_metric_panels(g, window=win.bounds, gpus=gpus, max_points=n), 600)
            if series.is_empty():
                self.views["metrics"].message(f"no GPU metric samples in the {win.label()}")
                return
            self.metric_series = series
            self.views["metrics"].show(
                gpu_metrics_chart(series, window=win, origin_ns=self.origin_ns, title="GPU metrics")
            )

        self._guard("metrics", self.views["metrics"], build)

    def _refresh_memory(self) -> None:
        def build() -> None:
            m = self.trace.memory_usage
            if m.is_empty():
                self.views["memory"].message(self._hint("memory_usage"))
                return
            from tracekit.viz import memory_chart
            from tracekit.viz.charts import within_row_budget

            win = self.current_window()
            series = within_row_budget(lambda n: self.prep.memory_series(m, window=win.bounds, max_points=n), 800)
            if series.is_empty():
                self.views["memory"].message(f"no allocations in the {win.label()}")
                return
            self.views["memory"].show(
                memory_chart(series, window=win, origin_ns=self.origin_ns, title="Device memory allocated")
            )

        self._guard("memory", self.views["memory"], build)
        self._guard("layer_memory", self.views["layer_memory"], self._refresh_layer_memory)

    def _layer_memory(self, pattern: str) -> tuple[pl.DataFrame, str | None]:
        """``layer_memory`` of the ranges matching ``pattern`` and, when empty, why."""
        if self._layer_cache is None or self._layer_cache[0] != pattern:
            import warnings

            from tracekit.analysis.memory import layer_memory

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rows = layer_memory(self.trace.memory_usage, self.trace.nvtx, ranges=pattern or None)
            why = next((str(c.message) for c in caught if rows.is_empty()), None)
            self._layer_cache = (pattern, rows, why)
        return self._layer_cache[1], self._layer_cache[2]

    def _refresh_layer_memory(self) -> None:
        pattern = self.layer_ranges.value.strip()
        rows, why = self._layer_memory(pattern)
        rows = self._in_window(rows)
        self.layer_rows = rows
        if rows.is_empty():
            self.layer_summary = pl.DataFrame()
            text = why or "no NVTX range matching the pattern in this window"
            self.views["layer_memory"].message(text)
            self.views["layer_growth"].message(text)
            self.layer_html.value = ""
            return
        from tracekit.analysis.memory import layer_memory_summary
        from tracekit.viz import layer_growth_chart, layer_memory_chart

        self.layer_summary = layer_memory_summary(rows)
        self.views["layer_memory"].show(
            layer_memory_chart(rows, self.trace.memory_usage, title="Memory in use per NVTX range")
        )
        self.views["layer_growth"].show(layer_growth_chart(self.layer_summary, title="Mean net growth per range"))
        cols = ["mean_net_growth_bytes", "mean_allocated_bytes", "mean_freed_bytes", "max_peak_above_entry_bytes"]
        self.layer_html.value = html_table(
            self.layer_summary.select("name", "phase", "instances", *cols), max_rows=50, left=("name", "phase"),
            formats=dict.fromkeys(cols, fmt_bytes), headers={c: c.removesuffix("_bytes").replace("_", " ") for c in cols},
        )
