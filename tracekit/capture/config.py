"""Presets and experiment files: YAML in, a resolved :class:`Experiment` out.

Layers apply in this order, each overriding the one before: the built-in defaults, the preset,
the YAML file, the arguments. An experiment file looks like ``configs/default.yaml``::

    name: decode
    mode: nsys
    command: python3 decode.py --steps 8 --batch {batch}
    preset: quick
    out: experiments
    nsys: {capture_range: cudaProfilerApi}
    sweep: {batch: [1, 4]}
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracekit.capture.options import Experiment
from tracekit.errors import CaptureError

DRILLDOWN_SECTIONS = (
    "SpeedOfLight", "SpeedOfLight_RooflineChart", "SpeedOfLight_HierarchicalTensorRooflineChart",
    "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
)  # fmt: skip

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "description": "low-overhead first look: CUDA + NVTX, no CPU sampling; ncu --set basic on 10 launches",
        "mode": "nsys",
        "nsys": {"trace": ["cuda", "nvtx"], "sample": "none", "cpuctxsw": "none"},
        "ncu": {"set": "basic", "launch_count": 10},
    },
    "llm-serving": {
        "description": "servers with worker processes and CUDA graphs: graphs traced per node, "
        "follows forked workers that never exec, capture opened by an NVTX range (--nvtx-capture)",
        "mode": "nsys",
        "nsys": {
            "trace": ["cuda", "nvtx", "osrt", "cublas"],
            "cuda_graph_trace": "node",
            "capture_range": "nvtx",
            "capture_range_end": "stop",
            "trace_fork_before_exec": True,
            "cuda_memory_usage": True,
        },
        "ncu": {"set": "basic", "graph_profiling": "node", "target_processes": "all"},
    },
    "torchrun": {
        "description": "one profiler per rank inside torchrun; reports named report_rank<RANK>",
        "mode": "nsys",
        "per_rank": True,
        "nsys": {"trace": ["cuda", "nvtx", "osrt"], "output_name": "report_rank%q{RANK}"},
        "ncu": {"output_name": "report_rank%q{RANK}", "set": "basic", "launch_count": 10},
    },
    "kernel-drilldown": {
        "description": "ncu sections behind tracekit's SOL, roofline, memory and occupancy views, no SASS",
        "mode": "ncu",
        "ncu": {"sections": list(DRILLDOWN_SECTIONS), "import_sass": False},
    },
}
"""Built-in presets: a partial experiment each (``description`` is for listings only)."""


def preset(name: str) -> dict[str, Any]:
    """The settings of preset ``name`` (a copy, without its description)."""
    if name not in PRESETS:
        msg = f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}"
        raise CaptureError(msg)
    data = copy.deepcopy(PRESETS[name])
    data.pop("description", None)
    return data


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge mappings left to right; nested mappings merge, everything else is replaced."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = deep_merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


def load_config(path: str | Path) -> dict[str, Any]:
    """Read an experiment file (YAML) as a mapping; raise :class:`CaptureError` on bad YAML."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        msg = f"cannot read the experiment file {path}: {exc.strerror or exc}; check the --config path"
        raise CaptureError(msg) from exc
    except UnicodeDecodeError:
        msg = f"{path} is not a text file (not UTF-8); give an experiment YAML file"
        raise CaptureError(msg) from None
    except yaml.YAMLError as exc:
        msg = f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix the file"
        raise CaptureError(msg) from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        msg = f"{path} must hold a mapping (command:, mode:, nsys:, …), not a {type(data).__name__}"
        raise CaptureError(msg)
    return dict(data)


SWEEP_KEYS = ("sweep", "sweeps")


def resolve(*layers: Mapping[str, Any]) -> tuple[Experiment, Any, dict[str, Any]]:
    """Apply the preset named in the last layer that names one, then every layer; build the experiment.

    Returns
    -------
    experiment
        The resolved :class:`Experiment`.
    sweep
        The ``sweep`` entry (a mapping, a list of points, a name or ``None``).
    sweeps
        Named sweeps (``sweeps:`` in the file).
    """
    merged = deep_merge(*layers)
    name = merged.get("preset")
    base = preset(name) if name else {}
    merged = deep_merge(base, merged)
    sweep_spec = merged.pop("sweep", None)
    named = merged.pop("sweeps", None) or {}
    if not isinstance(named, Mapping):
        msg = "'sweeps' must map sweep names to parameter grids"
        raise CaptureError(msg)
    if "command" not in merged or not merged["command"]:
        msg = "no command to run; give it after '--' or as 'command:' in the experiment file"
        raise CaptureError(msg)
    return Experiment.from_dict(merged), sweep_spec, dict(named)


# --- sweeps -----------------------------------------------------------------------------------------


def _scalar(text: str) -> Any:
    text = text.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_sweep(text: str) -> dict[str, list[Any]]:
    """Parse ``"batch_size=1,2,4;max_tokens=50,100"`` into ``{"batch_size": [1, 2, 4], …}``.

    Examples
    --------
    >>> parse_sweep("batch=1,2;mode=eager")
    {'batch': [1, 2], 'mode': ['eager']}
    """
    grid: dict[str, list[Any]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, values = part.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*", key):
            msg = f"cannot read sweep part {part!r}; write NAME=V1,V2;NAME2=V3 (names are identifiers)"
            raise CaptureError(msg)
        grid[key] = [_scalar(v) for v in values.split(",") if v.strip()]
        if not grid[key]:
            msg = f"sweep parameter {key!r} has no values; write {key}=V1,V2"
            raise CaptureError(msg)
    if not grid:
        msg = "the sweep is empty; write NAME=V1,V2;NAME2=V3"
        raise CaptureError(msg)
    return grid


def sweep_points(spec: Any, named: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every point of a sweep: a grid mapping (all combinations), a list of points, a string, a name.

    Examples
    --------
    >>> sweep_points({"batch": [1, 2], "steps": [4]})
    [{'batch': 1, 'steps': 4}, {'batch': 2, 'steps': 4}]
    """
    named = named or {}
    if isinstance(spec, str):
        if "=" not in spec:
            if spec not in named:
                known = ", ".join(named) or "none defined"
                msg = f"unknown sweep {spec!r}; named sweeps in the experiment file: {known}"
                raise CaptureError(msg)
            return sweep_points(named[spec], named)
        spec = parse_sweep(spec)
    if isinstance(spec, Mapping):
        keys = list(spec)
        values = [
            v if isinstance(v, Sequence) and not isinstance(v, str) else [v] for v in spec.values()
        ]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    if isinstance(spec, Sequence) and all(isinstance(p, Mapping) for p in spec):
        return [dict(p) for p in spec]
    msg = "a sweep is a mapping of parameter lists, a list of parameter mappings, 'A=1,2;B=3' or a sweep name"
    raise CaptureError(msg)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def fill(text: str, params: Mapping[str, Any]) -> str:
    """Replace ``{name}`` for each sweep parameter in ``text``; other braces stay as they are."""
    return _PLACEHOLDER.sub(
        lambda m: str(params[m.group(1)]) if m.group(1) in params else m.group(0), text
    )


def check_template(command: Sequence[str], env: Mapping[str, str], params: Sequence[str]) -> None:
    """Raise when a sweep parameter appears nowhere in the command or the environment."""
    used = {m for token in [*command, *env.values()] for m in _PLACEHOLDER.findall(token)}
    unused = [p for p in params if p not in used]
    if unused:
        msg = (
            f"sweep parameter(s) {', '.join(unused)} appear nowhere in the command; "
            f"add {' '.join('{' + p + '}' for p in unused)} where the values belong"
        )
        raise CaptureError(msg)
