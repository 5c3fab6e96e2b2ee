"""The ``tracekit`` command line (typer + rich).

Each command module imports its heavy dependencies inside the command body, so that
``tracekit --help`` imports neither polars nor altair.
"""
