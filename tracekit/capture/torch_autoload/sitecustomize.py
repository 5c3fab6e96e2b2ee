"""Start-up hook of ``tracekit capture nsys --annotate-torch`` and ``tracekit capture torch``
(not a tracekit module).

The capture puts this folder first on the program's ``PYTHONPATH`` and the wanted ranges in
``TRACEKIT_ANNOTATE_TORCH`` (JSON: depth, include, exclude, backward), or the profiler's
settings in ``TRACEKIT_TORCH_PROFILE`` (JSON: ``tracekit/capture/torch_profile.py``, which is
loaded from its file and started once ``torch`` is imported), or both: then the module ranges
are ``torch.profiler`` ranges (``record_function``), which the Kineto trace holds. Python imports
``sitecustomize`` at start-up in every interpreter of the program (torchrun's workers too);
this one waits for ``import torch`` to finish, then installs
``tracekit/capture/torch_nvtx.py``'s global module hooks, loaded from its file so that
nothing else of tracekit (nor polars) is imported into the program. A ``sitecustomize``
that the environment already had is run afterwards, as if this one were not there.

It never stops the program: a problem is printed once to stderr, prefixed ``tracekit:``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV = "TRACEKIT_ANNOTATE_TORCH"
_PROFILE_ENV = "TRACEKIT_TORCH_PROFILE"


def _say(message: str) -> None:
    print(f"tracekit: {message}", file=sys.stderr, flush=True)


def _load(file: str, name: str):  # type: ignore[no-untyped-def]
    path = os.path.join(os.path.dirname(_HERE), file)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load_annotator():  # type: ignore[no-untyped-def]
    return _load("torch_nvtx.py", "_tracekit_torch_nvtx")


def _install(config: dict) -> None:  # type: ignore[type-arg]
    if config.get("_profile"):
        try:
            _load("torch_profile.py", "_tracekit_torch_profile").install(config)
        except Exception as exc:  # noqa: BLE001 - the program must run regardless
            _say(f"torch.profiler could not start ({type(exc).__name__}: {exc}); the program runs without it")
            return
        if "_annotate" in config:  # module ranges as torch.profiler sees them
            _annotate(config["_annotate"], "record_function")
        return
    _annotate(config, "nvtx")


def _annotate(config: dict, emit: str) -> None:  # type: ignore[type-arg]
    try:
        annotator = _load_annotator()
        ann = annotator.install_global(**annotator.AnnotationConfig.from_dict(config).to_dict(), emit=emit)
        if not ann.emitting:
            _say("--annotate-torch: this PyTorch has no NVTX support and the nvtx package is missing; no ranges")
    except Exception as exc:  # noqa: BLE001 - the program must run regardless
        _say(f"--annotate-torch could not install its hooks ({type(exc).__name__}: {exc}); the program runs without them")


class _AfterTorch:
    """A meta-path finder that lets the normal finders find ``torch`` and runs
    :func:`_install` once its ``__init__`` has executed."""

    def __init__(self, config: dict) -> None:  # type: ignore[type-arg]
        self.config = config

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once: the other finders do the finding
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, config = spec.loader, self.config

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):  # type: ignore[no-untyped-def]
                return loader.create_module(spec)

            def exec_module(self, module):  # type: ignore[no-untyped-def]
                loader.exec_module(module)
                _install(config)

            def __getattr__(self, item):  # type: ignore[no-untyped-def]
                return getattr(loader, item)

        spec.loader = _Loader()
        return spec


def _read(env: str) -> dict | None:  # type: ignore[type-arg]
    """The JSON object in ``env``, or None when it is unset; said once when it is not valid."""
    raw = os.environ.get(env)
    if not raw:
        return None
    try:
        config = json.loads(raw)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        _say(f"{env} is not valid ({exc}); " + ("no torch.profiler trace" if env == _PROFILE_ENV else "no module ranges"))
        return None
    return config


def _start() -> None:
    if os.environ.get(_PROFILE_ENV):
        config = _read(_PROFILE_ENV)
        if config is None:
            return
        config["_profile"] = True
        annotate = _read(_ENV)
        if annotate is not None:  # both: the module ranges go to torch.profiler (record_function), not NVTX
            config["_annotate"] = annotate
    else:
        config = _read(_ENV)
        if config is None:
            return
    if "torch" in sys.modules:
        _install(config)
    else:
        sys.meta_path.insert(0, _AfterTorch(config))


def _chain() -> None:
    """Run the ``sitecustomize`` this folder hides, if the environment has one."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin in (None, __file__):
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as Python itself does for a failing sitecustomize
        _say(f"the environment's sitecustomize ({spec.origin}) failed: {type(exc).__name__}: {exc}")


_start()
_chain()
