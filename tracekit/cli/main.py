"""``tracekit`` entry point: registers the commands and turns TracekitError into one line."""

from __future__ import annotations

import logging
import sys

import typer

from tracekit.cli import capture as capture_cmd
from tracekit.cli import report as report_cmd
from tracekit.cli import stats as stats_cmd
from tracekit.cli import summary as summary_cmd

app = typer.Typer(
    name="tracekit",
    help="GPU profiler output (Nsight Systems / Nsight Compute) as tables, answers and figures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
_state = {"debug": False}


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks and debug logs."),
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


summary_cmd.register(app)
stats_cmd.register(app)
report_cmd.register(app)
app.add_typer(capture_cmd.app, name="capture")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a TracekitError prints one line on stderr and exits with code 2."""
    from tracekit.errors import TracekitError

    try:
        result = app(args=argv, standalone_mode=False)
        if isinstance(result, int):
            return result
    except TracekitError as exc:
        if _state["debug"]:
            raise
        print(f"tracekit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer's own exits (--help, usage errors)
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
        print(f"tracekit: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
