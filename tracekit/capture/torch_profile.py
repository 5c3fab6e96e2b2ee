"""``torch.profiler`` on an unmodified program: the profiler started as soon as ``torch`` is
imported, one profiler step per optimizer step, the trace written when the schedule ends or the
program exits.

Runs *inside* the profiled program, so it imports nothing but the standard library and
``torch`` (no polars, no tracekit loaders); the start-up hook of ``tracekit capture torch``
(``torch_autoload/sitecustomize.py``) loads it from its file when ``TRACEKIT_TORCH_PROFILE``
holds its configuration (JSON):

``out``
    The folder the traces go to (made if missing): ``<host>_<pid>[.rank<RANK>].pt.trace.json.gz``,
    one per process (each torchrun worker writes its own).
``skip``, ``steps``
    With ``steps`` > 0: a schedule of ``skip`` optimizer steps waited, one warmed up, then
    ``steps`` recorded (a step is one ``Optimizer.step()``, caught by PyTorch's global optimizer
    hook, so gradient accumulation's micro-batches are one step); the trace is written when they
    are done. With ``steps`` = 0 (the default) the whole run is recorded and written at exit; each
    optimizer step still opens a ``ProfilerStep#N`` range. A program that never steps an
    optimizer (inference, ``generate()``) is recorded whole either way: a schedule would wait
    for a step that never comes, so it is only used once the first step is seen.
``record_shapes``, ``profile_memory``, ``with_stack``, ``with_modules``
    ``torch.profiler.profile``'s options (shapes on by default, the others off: a stack per op
    makes traces several times larger).

It never stops the program: a problem is printed once to stderr, prefixed ``tracekit:``.
A program that leaves with ``os._exit`` skips the exit hook: its whole-run trace is not written
(a schedule's trace is, when its steps are done).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from typing import Any

__all__ = ["TorchProfile", "install"]


def _say(message: str) -> None:
    print(f"tracekit: {message}", file=sys.stderr, flush=True)


class TorchProfile:
    """One process's profiler (see the module doc)."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.out = str(config.get("out") or ".")
        self.skip = int(config.get("skip", 0) or 0)
        self.steps = int(config.get("steps", 0) or 0)
        self.options = {k: bool(config.get(k, k == "record_shapes")) for k in ("record_shapes", "profile_memory", "with_stack", "with_modules")}
        self.prof: Any = None
        self.written: str | None = None
        self.optimizer_steps = 0

    @property
    def path(self) -> str:
        rank = os.environ.get("RANK")
        name = f"{socket.gethostname()}_{os.getpid()}" + (f".rank{rank}" if rank is not None else "") + ".pt.trace.json.gz"
        return os.path.join(self.out, name)

    def _activities(self) -> list[Any]:
        acts = [self.torch.profiler.ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            acts.append(self.torch.profiler.ProfilerActivity.CUDA)
        return acts

    def start(self) -> None:
        """Record from now; the optimizer hook steps the profiler."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_step)
        # an explicit always-record schedule: without one the profiler opens no ProfilerStep#N ranges
        always = self.torch.profiler.ProfilerAction.RECORD
        self.prof = self.torch.profiler.profile(activities=self._activities(), schedule=lambda _step: always, **self.options)
        atexit.register(self.finish)
        self.prof.start()

    def _on_step(self, *_: Any) -> None:
        self.optimizer_steps += 1
        prof = self.prof
        if prof is None:
            return
        if self.steps and self.optimizer_steps == 1:
            # a training run: from here on, a schedule of skip, 1 warm-up, steps recorded
            prof.stop()
            sched = self.torch.profiler.schedule(wait=max(self.skip - 1, 0), warmup=1, active=self.steps, repeat=1)
            self.prof = self.torch.profiler.profile(activities=self._activities(), schedule=sched, on_trace_ready=self._ready,
                                                    **self.options)
            self.prof.start()
            return
        prof.step()

    def _ready(self, prof: Any) -> None:
        self._export(prof)
        self.prof = None

    def _export(self, prof: Any) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = self.path
        tmp = path[: -len(".json.gz")] + ".partial.json.gz"
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)
        self.written = path
        _say(f"torch.profiler trace written: {path}")

    def finish(self) -> None:
        """Stop recording and write the trace (at exit), unless a schedule already wrote it."""
        prof, self.prof = self.prof, None
        if prof is None or self.written:
            return
        try:
            prof.stop()  # a schedule stopped while recording writes its trace here (on_trace_ready)
            if self.steps and self.optimizer_steps:
                if not self.written:  # still waiting or warming up: nothing to write
                    _say(f"the program stepped its optimizer {self.optimizer_steps} times, not past the schedule's "
                         f"{self.skip} skipped steps: nothing was recorded; skip fewer, or record the whole run (steps 0)")
                    return
                _say(f"the program stepped its optimizer {self.optimizer_steps} times, fewer than the schedule's "
                     f"{self.skip + self.steps}: the steps recorded so far are written")
            if not self.written:
                self._export(prof)
        except Exception as exc:  # noqa: BLE001 - at exit, the program's own result matters more
            _say(f"could not write the torch.profiler trace ({type(exc).__name__}: {exc})")


#: Launchers that import torch but run no GPU work of their own (torchrun's agent): not profiled.
LAUNCHERS = ("torch/distributed/run.py", "torch/distributed/launch.py", "/torchrun")
#: The same launchers run as ``python -m MODULE``.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _module_run(argv: list[str]) -> str | None:
    """The module of ``python [options] -m MODULE …`` (``sys.orig_argv``), else ``None``."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-W", "-X"):  # an option with its value in the next argument
            i += 2
            continue
        if not arg.startswith("-") or arg == "-c" or arg == "-":
            return None
        i += 1
    return None


def is_launcher() -> bool:
    """Whether this process is torchrun's launcher (:data:`LAUNCHERS`, :data:`LAUNCHER_MODULES`).
    With ``python -m torch.distributed.run`` torch is imported while Python still looks for the
    module, when ``sys.argv[0]`` is only ``-m``: the interpreter's own arguments tell."""
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    if argv0.endswith(LAUNCHERS):
        return True
    return _module_run(list(getattr(sys, "orig_argv", []))) in LAUNCHER_MODULES


def install(config: dict[str, Any]) -> TorchProfile | None:
    """Start a :class:`TorchProfile` with ``config``; ``None`` (and one line on stderr) when
    PyTorch's profiler cannot start, or (silently) in a launcher (:func:`is_launcher`), whose
    workers are profiled each in their own process."""
    if is_launcher():
        return None
    try:
        p = TorchProfile(config)
        p.start()
        return p
    except Exception as exc:  # noqa: BLE001 - the program must run regardless
        _say(f"torch.profiler could not start ({type(exc).__name__}: {exc}); the program runs without it")
        return None
