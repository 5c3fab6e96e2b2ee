"""``NcuReport``: one Nsight Compute report (``.ncu-rep`` or raw CSV) as polars tables.

``.ncu-rep`` files are read with NVIDIA's ``ncu_report`` module (``pip install
'tracekit[ncu]'``); ncu's raw CSV (``ncu --import r.ncu-rep --csv --page raw
--print-units base``) is read without it. The file's first bytes decide which.

Example
-------
>>> import tracekit
>>> report = tracekit.open("sample_traces/ncu/ncu_precisions/ncu_precisions.ncu-rep")
>>> report.kernels.select("id", "short_name", "duration_ns")  # doctest: +SKIP
>>> report.wide(["gpu__time_duration.sum", "dram__bytes_read.sum"])  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

import polars as pl

from tracekit.errors import TraceFormatError, TraceNotFoundError, TracePermissionError
from tracekit.ncu import container, schema, tables
from tracekit.ncu.binary import BinaryReport
from tracekit.ncu.damage import DamagedReportWarning, IncompleteReportWarning
from tracekit.ncu.isolated import IsolatedReport, isolate_mode
from tracekit.ncu.raw_csv import RawCsv, is_ncu_csv, read_details_rules

__all__ = ["DamagedReportWarning", "IncompleteReportWarning", "NcuReport", "is_ncu_report"]


def is_ncu_report(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes) starts with Nsight Compute's ``NVR\\0`` magic."""
    return head.startswith(container.MAGIC)


def _check_file(path: Path) -> bytes:
    if not path.exists():
        msg = f"{path} does not exist; check the path (Nsight Compute reports end in .ncu-rep)"
        raise TraceNotFoundError(msg)
    if path.is_dir():
        msg = f"{path} is a directory; pass one .ncu-rep file or raw CSV"
        raise TraceFormatError(msg)
    if not os.access(path, os.R_OK):
        msg = f"{path} is not readable by this user; fix its permissions (chmod a+r) or copy it"
        raise TracePermissionError(msg)
    with path.open("rb") as fh:
        head = fh.read(4096)
    if not head:
        msg = f"{path} is empty (0 bytes); the capture or copy was interrupted: run ncu again"
        raise TraceFormatError(msg)
    return head


class NcuReport:
    """An Nsight Compute report; tables are built on first access and cached.

    Use :meth:`from_path` (or :func:`tracekit.open`). Tables: :attr:`kernels`,
    :attr:`metrics`, :attr:`instances`, :attr:`rules`, :attr:`devices`; :meth:`wide`
    pivots chosen metrics to one column each. ``docs/tables_ncu.md`` lists every column.
    """

    def __init__(
        self,
        path: Path,
        *,
        binary: BinaryReport | IsolatedReport | None = None,
        raw: RawCsv | None = None,
        details_csv: Path | None = None,
        expected_results: int | None = None,
        validate: bool = True,
    ) -> None:
        if (binary is None) == (raw is None):
            msg = "NcuReport needs exactly one of binary= or raw=; use NcuReport.from_path()"
            raise ValueError(msg)
        self.path = path
        self._binary = binary
        self._raw = raw
        self._details_csv = details_csv
        #: Results the container announces (``None`` for CSV input).
        self.expected_results = expected_results
        #: Signs of damage, one sentence each; empty for a sound report. Only a report opened
        #: with ``validate=False`` can have any (otherwise they raise TraceFormatError).
        self.damaged: tuple[str, ...] = ()
        self._validate = validate

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        details_csv: str | Path | None = None,
        validate: bool = True,
        isolate: bool | Literal["auto"] | None = None,
    ) -> NcuReport:
        """Open ``path``: an ``.ncu-rep`` (needs ``ncu_report``) or ncu's raw-page CSV.

        Parameters
        ----------
        path
            The report. ``NVR\\0`` magic → ``ncu_report``; text starting with ``"ID"`` →
            the CSV loader; anything else raises :class:`~tracekit.errors.TraceFormatError`.
        details_csv
            For CSV input, the ``--page details --print-details all`` export of the same
            report; its rule rows fill :attr:`rules` (empty otherwise).
        validate
            Refuse a damaged ``.ncu-rep`` (default): a container whose framing is broken, or
            a report from which ``ncu_report`` read fewer results, metrics or instance values
            than the container holds, or printed a parse error. ``False`` loads whatever
            ``ncu_report`` can read, with one :class:`DamagedReportWarning` and the problems in
            :attr:`damaged`. See ``docs/ncu.md``, "Damaged reports".
        isolate
            Read the report in a child process, so that a crash of ``ncu_report`` (SIGABRT on
            some damaged files) is a TraceFormatError instead of the end of this process:
            ``True``, ``False``, or ``"auto"`` (only when the container walk failed, i.e. with
            ``validate=False``). Default: ``TRACEKIT_NCU_ISOLATE`` (``1``, ``0``, ``auto``),
            else ``"auto"``.
        """
        path = Path(path)
        head = _check_file(path)
        details = Path(details_csv) if details_csv is not None else None
        if is_ncu_report(head):
            return cls._open_binary(path, validate=validate, isolate=isolate)
        if is_ncu_csv(head):
            raw = RawCsv(path)
            if raw.frame.height == 0:
                warnings.warn(
                    f"{path} holds 0 profiled kernels", IncompleteReportWarning, stacklevel=2
                )
            return cls(path, raw=raw, details_csv=details)
        msg = (
            f"{path} is neither an Nsight Compute report (NVR magic) nor ncu's raw CSV; "
            "pass a .ncu-rep or `ncu --import REPORT --csv --page raw --print-units base` output"
        )
        raise TraceFormatError(msg)

    @classmethod
    def _open_binary(
        cls, path: Path, *, validate: bool, isolate: bool | Literal["auto"] | None
    ) -> NcuReport:
        mode = isolate_mode(isolate)  # a bad TRACEKIT_NCU_ISOLATE fails before any work
        walked: container.Container | None = None
        problems: list[str] = []
        try:
            walked = container.walk(path)
        except container.ContainerError as exc:
            if validate:
                msg = (
                    f"{path} is truncated or corrupt ({exc}); capture again or copy the whole "
                    "file (validate=False loads whatever ncu_report can read)"
                )
                raise TraceFormatError(msg) from None
            problems.append(f"container: {exc}")
        if mode == "always" or (mode == "auto" and walked is None):
            loader: BinaryReport | IsolatedReport = IsolatedReport(path)
        else:
            loader = BinaryReport(path, container=walked)
        problems += loader.problems
        expected = walked.results if walked is not None else None
        report = cls(path, binary=loader, expected_results=expected, validate=validate)
        report._damage(problems, stacklevel=4)
        if loader.num_results == 0 and not problems:
            warnings.warn(
                f"{path} holds 0 profiled kernels; check ncu's filters (-k, --nvtx-include, -c)",
                IncompleteReportWarning,
                stacklevel=3,
            )
        return report

    def _damage(self, problems: list[str], *, stacklevel: int) -> None:
        """Raise (validate) or warn about ``problems`` and record them in :attr:`damaged`."""
        if not problems:
            return
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        if self._validate:
            msg = (
                f"{self.path} is damaged: {problems[0]}{more}; capture again or copy the whole "
                "file (validate=False loads what ncu_report reads, listed in report.damaged)"
            )
            raise TraceFormatError(msg)
        self.damaged += tuple(problems)
        warnings.warn(
            f"{self.path} is damaged: {problems[0]}{more}; tables hold what ncu_report could read "
            "(see report.damaged)",
            DamagedReportWarning,
            stacklevel=stacklevel,
        )

    def _late_damage(self) -> None:
        """Instance-value counts are checked when metrics are first read (in process)."""
        if isinstance(self._binary, BinaryReport):
            new = [p for p in self._binary.late_problems if p not in self.damaged]
            self._damage(new, stacklevel=5)  # past metrics/instances and cached_property

    # -- identity -------------------------------------------------------------------------

    @property
    def source(self) -> Literal["ncu_report", "csv"]:
        """How the report was read."""
        return "ncu_report" if self._binary is not None else "csv"

    def __repr__(self) -> str:
        count = self._binary.num_results if self._binary is not None else self._raw.frame.height  # type: ignore[union-attr]
        return f"NcuReport({str(self.path)!r}, kernels={count}, source={self.source!r})"

    def __enter__(self) -> NcuReport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the cached tables (they are rebuilt on next access)."""
        for name in ("kernels", "metrics", "instances", "rules", "devices"):
            self.__dict__.pop(name, None)

    # -- tables -----------------------------------------------------------------------------

    @cached_property
    def kernels(self) -> pl.DataFrame:
        """One row per profiled result (kernel), keyed by ncu's ``id``."""
        if self._binary is not None:
            rows, launch = self._binary.kernel_rows()
            identity_schema = {k: schema.KERNELS[k] for k in schema.IDENTITY_COLUMNS}
            identity = pl.DataFrame(rows, schema=identity_schema)
            return tables.build_kernels(identity, launch)
        assert self._raw is not None
        identity = self._raw.identity()
        launch = self.metrics.select("id", "metric", "value")
        return tables.build_kernels(identity, launch)

    @cached_property
    def metrics(self) -> pl.DataFrame:
        """Every metric of every result, long: ``id, metric, value, text, unit, …``."""
        if self._binary is not None:
            frame = self._binary.metrics()
            self._late_damage()
            return frame
        assert self._raw is not None
        return self._raw.metrics()

    @cached_property
    def instances(self) -> pl.DataFrame:
        """Instance values of instanced metrics (empty for CSV input)."""
        if self._binary is not None:
            frame = self._binary.instances()
            self._late_damage()
            return frame
        return schema.empty(schema.INSTANCES)

    def instances_of(self, metrics: Sequence[str]) -> pl.DataFrame:
        """:attr:`instances` restricted to ``metrics`` (cheaper than the whole table)."""
        if "instances" in self.__dict__:
            return self.instances.filter(pl.col("metric").is_in(list(metrics)))
        if self._binary is not None:
            return self._binary.instances(list(metrics))
        return schema.empty(schema.INSTANCES)

    @cached_property
    def rules(self) -> pl.DataFrame:
        """ncu's rule results (guided-analysis findings), one row per rule message."""
        if self._binary is not None:
            return self._binary.rules()
        if self._details_csv is not None:
            return read_details_rules(self._details_csv)
        return schema.empty(schema.RULES)

    @cached_property
    def devices(self) -> pl.DataFrame:
        """One row per GPU: ``device__attribute_*`` metrics, prefix removed."""
        return tables.build_devices(self.metrics, self.kernels)

    def wide(self, metrics: Sequence[str]) -> pl.DataFrame:
        """``id`` plus one column per metric in ``metrics`` (Float64, Utf8 for string metrics).

        Metrics absent from the report come back as null columns, so code written for one
        capture runs on another.
        """
        if isinstance(metrics, str):
            metrics = [metrics]
        return tables.wide(self.metrics, self.kernels, list(metrics))
