"""``tracekit`` entry point: registers the commands and turns TracekitError into one line.

Only the command being run is registered (all of them for ``tracekit --help`` or an unknown
name): typer inspects every registered function's signature at start-up, which for all
commands cost about 0.1 s of each ``tracekit stats`` run. A plain ``tracekit stats`` command
line (the export, ``-r``, ``-f``, ``--convention``: :func:`tracekit.cli.stats_cache.parse_stats`)
runs without typer at all (its import is 0.05 s of a cold run on 200 k kernels); anything else
on that command line (``--rows``, ``-o``, ``--help``, ``--debug``, a typo) goes through typer.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from tracekit.cli.terminal import help_markup_mode

if TYPE_CHECKING:
    import typer

_state = {"debug": False}


def _configure(debug: bool) -> None:
    """The global ``--debug`` option: full tracebacks and debug logs, else warnings only."""
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


#: Command name → the module whose ``register(app)`` adds it (imported only when needed).
COMMANDS: dict[str, str] = {
    "summary": "tracekit.cli.summary",
    "stats": "tracekit.cli.stats",
    "diagnose": "tracekit.cli.diagnose",
    "diff": "tracekit.cli.diff",
    "model": "tracekit.cli.model",
    "report": "tracekit.cli.report",
    "capture": "tracekit.cli.capture",
    "export": "tracekit.cli.export",
    "mcp": "tracekit.cli.mcp",
}


def build_app(argv: Sequence[str] | None = None) -> typer.Typer:
    """The CLI with the command named in ``argv`` registered (every command when none is)."""
    import typer

    def _root(
        debug: bool = typer.Option(False, "--debug", help="Show full tracebacks and debug logs."),
    ) -> None:
        _configure(debug)

    app = typer.Typer(
        name="tracekit",
        help="GPU profiler output (Nsight Systems / Nsight Compute) as tables, answers and figures.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=help_markup_mode(),
    )
    app.callback()(_root)
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if not a.startswith("-")), None)
    for name, module in COMMANDS.items():
        if command not in COMMANDS or command == name:
            importlib.import_module(module).register(app)
    return app


_prepared = {"done": False}

#: Commands that import numpy anyway (measured on the decode sample): prepare_process imports
#: it first, while there is room; imported late under ``ulimit -v``, loading OpenBLAS failed
#: ("failed to map segment from shared object") or OpenBLAS exited the process itself.
NUMPY_COMMANDS = frozenset({"summary", "diagnose", "report", "diff"})


def prepare_process(command: str | None = None) -> None:
    """Set up the process so that running out of memory is the one-line error, not an abort
    (run once, by :func:`main`, before any table is read):

    - ``OPENBLAS_NUM_THREADS=1`` when it is unset and numpy is not imported yet: OpenBLAS
      maps a buffer and a stack for each of its threads when numpy is imported (one per
      core): 41 MB less address space here (2 cores; numpy import +129 MB → +88 MB), a few
      hundred MB on a 16-core machine, and its "Memory allocation still failed" exit under
      ``ulimit -v`` came from those buffers. tracekit makes no BLAS call (the memory-growth
      slope is computed in closed form: ``np.polyfit`` made OpenBLAS map its buffers on first
      use and exit 1 when it could not).
    - polars' reader threads started (:func:`tracekit.nsys.database.start_reader`:
      ~370 MB of address space at once here, 7 ms), so that the check before each read
      sees what is left; skipped without room for them.
    - the ADBC SQLite driver loaded (6 MB of address space; loaded with no room left, it
      crashed with SIGSEGV instead of failing).
    - numpy imported for the commands that use it (:data:`NUMPY_COMMANDS`; ~90 ms they spend
      anyway).
    """
    if _prepared["done"]:
        return
    _prepared["done"] = True
    if "numpy" not in sys.modules and not os.environ.get("OPENBLAS_NUM_THREADS", "").strip():
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if command in NUMPY_COMMANDS:
        import numpy  # noqa: F401
    log = logging.getLogger(__name__)
    from tracekit.nsys.database import start_reader

    start_reader()
    try:  # the SQLite reader's driver loaded (it crashed, SIGSEGV, when loaded with no room left)
        import adbc_driver_manager
        import adbc_driver_sqlite

        db = adbc_driver_sqlite.connect(":memory:")
        adbc_driver_manager.AdbcConnection(db).close()
        db.close()
    except Exception as exc:  # not installed (sqlite3 is used then) or failing: a real read reports it
        log.debug("loading the ADBC SQLite driver failed: %s", exc)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a TracekitError prints one line on stderr and exits with code 2."""
    import warnings

    from tracekit.cli import stats_cache
    from tracekit.cli.stats_run import run_stats
    from tracekit.errors import TracekitError

    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if a in COMMANDS), None)
    if command == "capture":  # --annotate-torch[=DEPTH]: an option whose value may be left out
        from tracekit.cli.capture import expand_optional_values

        args = expand_optional_values(args)
    # --help stays light; capture reads no big table and must run where only the workload's
    # packages are (no polars on a GPU node: the summary then says so, the capture still works);
    # mcp's server reads no table either (its workers prepare their own process)
    if command not in (None, "capture", "mcp") and not {"--help", "-h"} & set(args):
        prepare_process(command)

    # a warning is one line on stderr ("tracekit: warning: …"), not file:line plus source; the
    # lines are collected and printed when the command ends well, so that an error is the one
    # line on stderr (warnings that led to it are not mixed into it)
    warnings.formatwarning = lambda message, category, *_args, **_kw: f"tracekit: warning: {message}\n"
    collected: list[str] = []
    shown = warnings.showwarning

    def collect(message: Warning | str, category: type[Warning], *_args: object, **_kw: object) -> None:
        line = f"tracekit: warning: {message}"
        if line not in collected:
            collected.append(line)

    def flush_warnings() -> None:
        for line in collected:
            print(line, file=sys.stderr)
        collected.clear()

    warnings.showwarning = collect
    try:
        try:
            plain = stats_cache.parse_stats(args)
            if plain is not None:  # a plain `tracekit stats` command line: no typer to import
                _configure(False)
                file, report, convention, fmt = plain
                try:
                    run_stats(file, report, fmt, convention=convention)
                except KeyboardInterrupt:  # as through typer: the warnings so far, exit 130
                    flush_warnings()
                    return 130
                except EOFError:  # as click through typer: an empty line, then Abort (exit 1)
                    print(file=sys.stderr)
                    return 1
                result = None
            else:
                result = build_app(args)(args=args, standalone_mode=False)
            flush_warnings()
            if isinstance(result, int):
                return result
        except TracekitError as exc:
            if _state["debug"]:
                flush_warnings()
                raise
            # one line whatever a library put in the message (newlines, quoted SQL)
            text = " ".join(str(exc).split())
            print(f"tracekit: error: {text}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("tracekit: interrupted", file=sys.stderr)
            return 130
        except SystemExit as exc:  # typer's own exits (--help, usage errors)
            if not exc.code:
                flush_warnings()
            return int(exc.code or 0)
        except Exception as exc:
            # click (vendored by typer) signals usage errors and --help exits with exceptions
            # that carry an exit code; anything else is a bug in tracekit.
            if hasattr(exc, "exit_code"):
                if hasattr(exc, "show"):
                    exc.show()
                return int(exc.exit_code)
            if type(exc).__name__ == "Abort":
                return 1
            if _state["debug"]:
                raise
            if isinstance(exc, MemoryError) or (isinstance(exc, ImportError) and "failed to map segment" in str(exc)):
                print("tracekit: error: out of memory; read fewer columns (trace.table(name, columns=[...])), one column "
                      "at a time (trace.columns_on_demand), keep the column cache on (TRACEKIT_COLUMN_CACHE), a shorter "
                      "window where the command has --window, or open many reports with engine='dask' (docs/scale.md)", file=sys.stderr)
                return 2
            from tracekit.errors import one_line

            print(f"tracekit: internal error: {type(exc).__name__}: {one_line(str(exc), 400)} (rerun with --debug for the traceback)",
                  file=sys.stderr)
            return 1
        except BaseException as exc:
            # polars' Rust side raises pyo3's PanicException, a BaseException: one line, not a Rust
            # and Python traceback (KeyboardInterrupt and SystemExit are handled above)
            if type(exc).__name__ != "PanicException" or _state["debug"]:
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            if "memory allocation" in first or "spawn" in first:  # the Rust side ran out of memory
                print(f"tracekit: error: out of memory in the table engine ({first}); read fewer columns "
                      "(trace.table(name, columns=[...])), one column at a time (trace.columns_on_demand), keep the "
                      "column cache on (TRACEKIT_COLUMN_CACHE), or use a machine with more memory", file=sys.stderr)
                return 2
            print(f"tracekit: internal error: the table engine panicked ({first}); the export may be damaged "
                  "(rerun with --debug for the traceback)", file=sys.stderr)
            return 1
        return 0
    finally:
        warnings.showwarning = shown


def run() -> NoReturn:
    """The ``tracekit`` console script: :func:`main`, then end the process without tearing the
    interpreter down.

    Exit handlers run (``atexit``: logging, thread pools, finalizers) and output is flushed;
    only the interpreter's final garbage collection and module teardown are skipped, which
    after a report over a million kernels frees a few hundred MB of frames object by object:
    0.05–0.1 s that a one-shot command has no use for (measured on the 1 M-kernel export).
    """
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (``tracekit stats ... | head``)
        code = code or 1
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    run()
