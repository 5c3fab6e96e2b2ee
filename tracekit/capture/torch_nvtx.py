"""NVTX ranges per PyTorch module, named by module path, without editing the model.

Runs *inside* the profiled program, so it imports nothing but the standard library and
``torch`` (no polars, no tracekit loaders): it must work on a GPU node that only has the
workload's environment, and it is also loaded standalone by the start-up hook of
``tracekit capture nsys --annotate-torch`` (``torch_autoload/sitecustomize.py``).

Two ways in:

* :func:`annotate` — forward (and optionally backward) hooks on one model's submodules, each
  pushing an NVTX range named by its path (``model.layers.3.self_attn``) and popping it when
  the module returns. Removable, and a context manager.
* :func:`install_global` — PyTorch's *global* module hooks: every module tree called from the
  top (a "root") gets its paths on first use, so a script that builds its model inside
  Hugging Face code still gets per-layer ranges. The start-up hook calls it as soon as
  ``torch`` is imported.

Which modules get a range: those whose *level* (path components below the root, a list
index joined with its list's name: ``model`` 1, ``model.layers.3`` 2,
``model.layers.3.self_attn`` 3) is at most ``depth``, whose path matches one of ``include``
(regular expressions, ``re.search``; all when empty) and none of ``exclude``. The root itself
gets a range named by its class (``Qwen3ForCausalLM``) at level 0.

What it costs: one hook call and one NVTX push/pop per module call (measured on an H100
machine: see ``docs/capture.md``, "Per-module NVTX ranges"). Nothing runs while a module runs
under ``torch.compile`` tracing (``torch.compiler.is_compiling()``: the compiled graph gets no
ranges, and Dynamo sees no Python side effect) or is replayed from a CUDA graph (no Python
runs then).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Annotation", "AnnotationConfig", "annotate", "install_global", "module_level"]

#: The default depth: the root, its children, layers and their direct children
#: (``model.layers.3.self_attn``, ``model.layers.3.mlp``).
DEFAULT_DEPTH = 3


def module_level(path: str) -> int:
    """Level of a module path below its root: named components, a numeric component (a
    ``ModuleList``/``Sequential`` index) joined with the one before it.

    Examples
    --------
    >>> module_level("")
    0
    >>> module_level("model.layers.3.self_attn")
    3
    >>> module_level("transformer.h.11.mlp.c_fc")
    4
    """
    if not path:
        return 0
    return sum(1 for part in path.split(".") if not part.isdigit())


@dataclass(frozen=True)
class AnnotationConfig:
    """Which modules get a range (see the module doc).

    Attributes
    ----------
    depth
        Deepest level that gets a range (``None``: every level).
    include, exclude
        Regular expressions searched in the module path (the root's class name for the root).
    backward
        Also push/pop ranges around each module's backward (``<path>.backward``), through
        full backward pre-hooks and hooks (training).
    """

    depth: int | None = DEFAULT_DEPTH
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    backward: bool = False
    _include_re: tuple[re.Pattern[str], ...] = field(default=(), init=False, repr=False, compare=False)
    _exclude_re: tuple[re.Pattern[str], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.depth is not None and (isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 0):
            msg = f"depth must be a whole number >= 0 (or None for every level), not {self.depth!r}"
            raise ValueError(msg)
        for name in ("include", "exclude"):
            value = getattr(self, name)
            patterns = (value,) if isinstance(value, str) else tuple(value)
            object.__setattr__(self, name, patterns)
            try:
                compiled = tuple(re.compile(p) for p in patterns)
            except re.error as exc:
                msg = f"{name} pattern {exc.pattern!r} is not a regular expression: {exc}"
                raise ValueError(msg) from None
            object.__setattr__(self, f"_{name}_re", compiled)

    def wants(self, path: str, label: str) -> bool:
        """Whether the module at ``path`` (range name ``label``) gets a range."""
        if self.depth is not None and module_level(path) > self.depth:
            return False
        if self._include_re and not any(p.search(label) for p in self._include_re):
            return False
        return not any(p.search(label) for p in self._exclude_re)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the shape of ``TRACEKIT_ANNOTATE_TORCH``)."""
        return {"depth": self.depth, "include": list(self.include), "exclude": list(self.exclude),
                "backward": self.backward}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnnotationConfig:
        return cls(depth=data.get("depth", DEFAULT_DEPTH), include=tuple(data.get("include") or ()),
                   exclude=tuple(data.get("exclude") or ()), backward=bool(data.get("backward", False)))


class _Nvtx:
    """Push/pop of NVTX ranges: ``torch.cuda.nvtx`` (what PyTorch itself uses), else the
    ``nvtx`` package; ``available`` is False when neither can emit."""

    def __init__(self) -> None:
        self.push: Callable[[str], Any]
        self.pop: Callable[[], Any]
        self.available = True
        try:
            import torch.cuda.nvtx as tnvtx

            tnvtx.range_push("tracekit.probe")  # CPU-only builds raise here (no _nvtx binding)
            tnvtx.range_pop()
            self.push, self.pop = tnvtx.range_push, tnvtx.range_pop
            return
        except Exception:  # noqa: BLE001 - any failure means "not this one"
            pass
        try:
            import nvtx

            self.push = lambda name: nvtx.push_range(name)
            self.pop = nvtx.pop_range
            return
        except Exception:  # noqa: BLE001
            pass
        self.available = False
        self.push = lambda name: None
        self.pop = lambda: None


class _RecordFunction:
    """Push/pop of ``torch.profiler`` ranges (what ``record_function`` emits: a
    ``user_annotation`` in a Kineto trace), for mode ``torch``, where NVTX reaches no profiler.
    A pop closes the thread's innermost range, as NVTX's does."""

    def __init__(self) -> None:
        import torch

        enter = torch.ops.profiler._record_function_enter_new
        leave = torch.ops.profiler._record_function_exit._RecordFunction
        open_ranges = threading.local()
        self.available = True

        def push(name: str) -> None:
            stack = getattr(open_ranges, "stack", None)
            if stack is None:
                stack = open_ranges.stack = []
            stack.append(enter(name, None))

        def pop() -> None:
            stack = getattr(open_ranges, "stack", None)
            if stack:
                leave(stack.pop())

        self.push, self.pop = push, pop


#: How ranges are emitted: ``"nvtx"`` (nsys) or ``"record_function"`` (``torch.profiler``).
EMITTERS = ("nvtx", "record_function")

_emitter: _Nvtx | None = None


def _nvtx() -> _Nvtx:
    global _emitter
    if _emitter is None:
        _emitter = _Nvtx()
    return _emitter


def _is_compiling() -> Callable[[], bool]:
    import torch

    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    if fn is None:
        dynamo = getattr(torch, "_dynamo", None)
        fn = getattr(dynamo, "is_compiling", None)
    return fn if fn is not None else (lambda: False)


class _Stack(threading.local):
    """Per thread: for each module call in flight, whether it pushed a range."""

    def __init__(self) -> None:
        self.pushed: list[bool] = []
        self.backward: list[bool] = []


class _Ranges:
    """The hooks' shared state: names, the per-thread stack, the emitter."""

    def __init__(self, config: AnnotationConfig, emit: str = "nvtx") -> None:
        if emit not in EMITTERS:
            msg = f"emit must be one of {', '.join(EMITTERS)}, not {emit!r}"
            raise ValueError(msg)
        self.config = config
        self.stack = _Stack()
        self.emitter: _Nvtx | _RecordFunction = _nvtx() if emit == "nvtx" else _RecordFunction()
        self.compiling = _is_compiling()
        self.count = 0  # ranges pushed (forward and backward)

    def enter(self, label: str | None, stack: list[bool]) -> None:
        if label is None or self.compiling():
            stack.append(False)
            return
        self.emitter.push(label)
        self.count += 1
        stack.append(True)

    def leave(self, stack: list[bool]) -> None:
        if stack and stack.pop():
            self.emitter.pop()


def _root_label(module: Any) -> str:
    """A root's range name: its class (the compiled module's, through ``torch.compile``)."""
    inner = getattr(module, "_orig_mod", None)
    return type(inner if inner is not None else module).__name__


def _is_container(module: Any) -> bool:
    """``ModuleList``/``ModuleDict``: never called, so never given hooks or names."""
    from torch import nn

    return isinstance(module, nn.ModuleList | nn.ModuleDict)


def _named(root: Any) -> Iterator[tuple[str, Any]]:
    """``root.named_modules()``, seen through ``torch.compile``'s wrapper (``_orig_mod.``
    left out of the paths)."""
    inner = getattr(root, "_orig_mod", None)
    tree = inner if inner is not None else root
    yield from tree.named_modules()


class Annotation:
    """Hooks that :func:`annotate` or :func:`install_global` installed; :meth:`remove` takes
    them off. A context manager (the hooks go when the block ends).

    Attributes
    ----------
    config
        Which modules get ranges.
    paths
        The module paths (root: ``""``) that got hooks (:func:`annotate`) or names
        (:func:`install_global`, filled as roots are first called).
    """

    def __init__(self, config: AnnotationConfig, emit: str = "nvtx") -> None:
        self.config = config
        self._ranges = _Ranges(config, emit)
        self._handles: list[Any] = []
        self.paths: list[str] = []

    @property
    def ranges_pushed(self) -> int:
        """How many NVTX ranges the hooks pushed so far."""
        return self._ranges.count

    @property
    def emitting(self) -> bool:
        """Whether NVTX ranges really reach a profiler (``False`` on a PyTorch build without
        NVTX and without the ``nvtx`` package: the hooks run and count, nothing is emitted)."""
        return self._ranges.emitter.available

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> Annotation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"Annotation({len(self.paths)} modules, depth={self.config.depth}, hooks={len(self._handles)})"


def _config(depth: int | None, include: Iterable[str] | str, exclude: Iterable[str] | str, backward: bool) -> AnnotationConfig:
    inc = (include,) if isinstance(include, str) else tuple(include)
    exc = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    return AnnotationConfig(depth=depth, include=inc, exclude=exc, backward=backward)


def annotate(
    model: Any,
    *,
    depth: int | None = DEFAULT_DEPTH,
    include: Iterable[str] | str = (),
    exclude: Iterable[str] | str = (),
    backward: bool = False,
    emit: str = "nvtx",
) -> Annotation:
    """Push an NVTX range named by module path around every selected submodule's forward.

    Parameters
    ----------
    model
        A ``torch.nn.Module`` (a ``torch.compile`` wrapper is seen through).
    depth
        Deepest level that gets a range (root 0, ``model`` 1, ``model.layers.3`` 2,
        ``model.layers.3.self_attn`` 3 …); ``None`` for every module.
    include, exclude
        Regular expressions searched in each path; a module gets a range when it matches
        some ``include`` (or none are given) and no ``exclude``.
    backward
        Also range each module's backward (``<path>.backward``; full backward hooks, which
        PyTorch refuses on modules whose outputs are modified in place).
    emit
        ``"nvtx"`` (for nsys) or ``"record_function"``: ``torch.profiler`` ranges, which a
        Kineto trace holds as ``user_annotation`` events (tracekit reads them as it reads NVTX
        ranges), for a run under ``torch.profiler``.

    Returns
    -------
    Annotation
        Call ``.remove()`` (or use it as a context manager) to take the hooks off.

    Examples
    --------
    >>> import tracekit.torch  # doctest: +SKIP
    >>> with tracekit.torch.annotate(model, depth=3):  # doctest: +SKIP
    ...     model.generate(ids, max_new_tokens=32)
    """
    config = _config(depth, include, exclude, backward)
    ann = Annotation(config, emit)
    ranges = ann._ranges
    if backward:
        _quiet_backward_hooks()
    for path, module in _named(model):
        label = path or _root_label(model)
        if _is_container(module) or not config.wants(path, label):
            continue
        if not path:  # the root: through torch.compile's wrapper, whose call runs outside the compiled code
            module = model
        ann.paths.append(path)
        ann._handles.append(module.register_forward_pre_hook(
            lambda m, args, _label=label: ranges.enter(_label, ranges.stack.pushed)))
        ann._handles.append(module.register_forward_hook(
            lambda m, args, out: ranges.leave(ranges.stack.pushed), always_call=True))
        if backward:
            blabel = f"{label}.backward"
            ann._handles.append(module.register_full_backward_pre_hook(
                lambda m, grad_out, _label=blabel: ranges.enter(_label, ranges.stack.backward)))
            ann._handles.append(module.register_full_backward_hook(
                lambda m, grad_in, grad_out: ranges.leave(ranges.stack.backward)))
    return ann


def _quiet_backward_hooks() -> None:
    """PyTorch warns, at every backward, that a full backward hook fires "with respect to
    module outputs" for a module none of whose inputs need gradients (an embedding fed token
    ids): true and harmless for a range, which only needs the time. That one message is
    silenced; every other warning stays."""
    import warnings

    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs")


class _Global:
    """Names of the modules seen by the global hooks (weakly held)."""

    def __init__(self, ann: Annotation) -> None:
        self.ann = ann
        self.labels: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()

    def label(self, module: Any, stack: list[bool]) -> str | None:
        try:
            return self.labels[module]
        except KeyError:
            pass
        except TypeError:  # not weak-referenceable
            return None
        if stack:  # a module outside every root's tree, called inside one: no range
            return None
        config = self.ann.config
        for path, sub in _named(module):
            label = path or _root_label(module)
            if sub is not module and sub in self.labels:
                continue  # already named under an earlier root
            keep = label if config.wants(path, label) and not _is_container(sub) else None
            self.labels[sub] = keep
            if keep is not None:
                self.ann.paths.append(path)
        if getattr(module, "_orig_mod", None) is not None:  # the compile wrapper itself
            self.labels[module] = self.labels.get(module._orig_mod)
        return self.labels.get(module)


def install_global(
    *,
    depth: int | None = DEFAULT_DEPTH,
    include: Iterable[str] | str = (),
    exclude: Iterable[str] | str = (),
    backward: bool = False,
    emit: str = "nvtx",
) -> Annotation:
    """Range every module tree the program calls, through PyTorch's global module hooks.

    A module called while no annotated module is running is a root: it and its submodules
    are named by path then (``named_modules``), and each later call of a selected one pushes
    its range. Parameters as :func:`annotate`. Returns the :class:`Annotation` (its
    ``remove()`` takes the global hooks off).
    """
    from torch.nn.modules import module as mod

    config = _config(depth, include, exclude, backward)
    ann = Annotation(config, emit)
    ranges = ann._ranges
    names = _Global(ann)

    def pre(module: Any, args: Any) -> None:
        ranges.enter(names.label(module, ranges.stack.pushed), ranges.stack.pushed)

    def post(module: Any, args: Any, out: Any) -> None:
        ranges.leave(ranges.stack.pushed)

    ann._handles.append(mod.register_module_forward_pre_hook(pre))
    try:
        ann._handles.append(mod.register_module_forward_hook(post, always_call=True))
    except TypeError:  # PyTorch before 2.1: no always_call (an exception inside leaves a range open)
        ann._handles.append(mod.register_module_forward_hook(post))
    if backward:
        _quiet_backward_hooks()

        def bpre(module: Any, grad_out: Any) -> None:
            label = names.labels.get(module)
            ranges.enter(None if label is None else f"{label}.backward", ranges.stack.backward)

        def bpost(module: Any, grad_in: Any, grad_out: Any) -> None:
            ranges.leave(ranges.stack.backward)

        ann._handles.append(mod.register_module_full_backward_pre_hook(bpre))
        ann._handles.append(mod.register_module_full_backward_hook(bpost))
    return ann


@contextmanager
def annotated(model: Any, **options: Any) -> Iterator[Annotation]:
    """``with annotated(model, depth=2): …`` — :func:`annotate` for the block only."""
    ann = annotate(model, **options)
    try:
        yield ann
    finally:
        ann.remove()
