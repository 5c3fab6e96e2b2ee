"""The memory zoo's own measure: for every call of every decoder layer (``model.layers.N``),
``torch.cuda.memory_allocated()`` when the layer is entered and when it returns, and the
allocator's peak in between (``max_memory_allocated()`` after ``reset_peak_memory_stats()`` at
entry), read by the program's own module hooks, not by the profiler. At exit one line
``LAYERMEM {json}`` per call: ``layer`` (path), ``call`` (0-based per layer), ``entry``,
``exit``, ``peak`` (bytes). ``ZOO_DRY=1`` shrinks sizes for a CPU dry run (all zeros there)."""

from __future__ import annotations

import atexit
import json
import os

import torch

CUDA = torch.cuda.is_available()
DRY = bool(os.environ.get("ZOO_DRY"))


def dry(full, small):  # noqa: ANN001, ANN201
    return small if DRY else full


def _allocated() -> int:
    return torch.cuda.memory_allocated() if CUDA else 0


def _peak() -> int:
    return torch.cuda.max_memory_allocated() if CUDA else 0


def watch(model: torch.nn.Module, pattern: str = r"^model\.layers\.\d+$") -> list[dict]:
    """Hooks on the modules whose path matches ``pattern``; the records are printed at exit."""
    import re

    records: list[dict] = []
    calls: dict[str, int] = {}
    for path, module in model.named_modules():
        if not re.match(pattern, path):
            continue

        def pre(m, args, _path=path):  # noqa: ANN001, ANN202
            if CUDA:
                torch.cuda.reset_peak_memory_stats()
            records.append({"layer": _path, "call": calls.get(_path, 0), "entry": _allocated()})
            calls[_path] = calls.get(_path, 0) + 1

        def post(m, args, out, _path=path):  # noqa: ANN001, ANN202
            rec = next(r for r in reversed(records) if r["layer"] == _path and "exit" not in r)
            rec["exit"], rec["peak"] = _allocated(), _peak()

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def report() -> None:
        for r in records:
            print("LAYERMEM " + json.dumps(r), flush=True)

    atexit.register(report)
    return records
