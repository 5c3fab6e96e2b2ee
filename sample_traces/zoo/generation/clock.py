"""The zoo programs' own clock: what each generation program measures of itself, never read
from a profiler.

- ``Clock.watch(model, name)``: a CUDA event recorded when each forward of ``model`` starts
  (forward pre-hook) and ends (forward hook), so each request knows how many forwards each
  model ran and when, on the GPU's own timeline.
- ``Clock`` is also a ``generate()`` streamer (``put``/``end``): each time ``generate()``
  hands out new tokens (it copies them to the host first) the host time and a CUDA event are
  noted; the first ``put`` of a call is the prompt.
- ``with clock.request(prompt=…, new=…, batch=…, warmup=…):`` around one request.

At the end ``clock.report()`` prints one line ``TRUTH {json}``: per request the prompt and
new tokens, the forwards per model, ``ttft_ms`` (GPU clock: the request's first forward
start to the first new token handed out; without a streamer, to the first forward's end),
``ttft_host_ms`` (the call's start to the first new token, host clock), ``tpot_ms`` and
``tpot_p90_ms`` (median and 90th percentile of the intervals between consecutive tokens
handed out, GPU clock; without a streamer, between consecutive decode forwards' starts),
``fwd_interval_ms`` (median interval between the decode forwards' starts of the first
watched model), ``total_ms`` (host). Events are read once at the end: no extra syncs.
On a machine without CUDA (a dry run) host times stand in for events.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time

import torch

CUDA = torch.cuda.is_available()


class _Stamp:
    __slots__ = ("event", "host")

    def __init__(self) -> None:
        self.host = time.perf_counter()
        self.event = None
        if CUDA:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()


def _ms(a: _Stamp, b: _Stamp) -> float:
    if a.event is not None and b.event is not None:
        return float(a.event.elapsed_time(b.event))
    return 1e3 * (b.host - a.host)


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


class Clock:
    def __init__(self, program: str) -> None:
        self.program = program
        self.requests: list[dict] = []
        self.cur: dict | None = None
        self.models: list[str] = []
        self.extra: dict = {}

    # -- forwards -------------------------------------------------------------------------
    def watch(self, model: torch.nn.Module, name: str) -> None:
        self.models.append(name)

        def pre(_m, _args, _kwargs=None):  # noqa: ANN001
            if self.cur is not None:
                self.cur["fwd"].setdefault(name, []).append([_Stamp(), None])

        def post(_m, _args, _out, _kwargs=None):  # noqa: ANN001
            if self.cur is not None and self.cur["fwd"].get(name):
                self.cur["fwd"][name][-1][1] = _Stamp()

        model.register_forward_pre_hook(pre)
        model.register_forward_hook(post)

    # -- streamer ---------------------------------------------------------------------------
    def put(self, value: torch.Tensor) -> None:
        if self.cur is None:
            return
        self.cur["puts"].append((_Stamp(), int(value.numel())))

    def end(self) -> None:
        pass

    @contextlib.contextmanager
    def request(self, **info):  # noqa: ANN003
        self.cur = {"info": info, "fwd": {}, "puts": [], "t0": _Stamp()}
        try:
            yield self
        finally:
            if CUDA:
                torch.cuda.synchronize()
            self.cur["t1"] = _Stamp()
            self.requests.append(self.cur)
            self.cur = None

    # -- the truth --------------------------------------------------------------------------
    def report(self, **extra) -> dict:  # noqa: ANN003
        if CUDA:
            torch.cuda.synchronize()
        out = []
        for r in self.requests:
            row = dict(r["info"])
            fwd = r["fwd"]
            row["forwards"] = {k: len(v) for k, v in fwd.items()}
            main = fwd.get(self.models[0], []) if self.models else []
            puts = r["puts"][1:]  # the first put is the prompt
            row["total_ms"] = round(1e3 * (r["t1"].host - r["t0"].host), 3)
            if puts:
                row["tokens_handed_out"] = sum(n for _, n in puts)
                row["ttft_host_ms"] = round(1e3 * (puts[0][0].host - r["t0"].host), 3)
                firsts = [v[0][0] for v in fwd.values() if v]
                if firsts:  # from the request's first forward of any model (a draft, an encoder)
                    first = min(firsts, key=lambda s: s.host)
                    row["ttft_ms"] = round(_ms(first, puts[0][0]), 3)
                gaps = [_ms(a[0], b[0]) for a, b in zip(puts, puts[1:])]
                if gaps:
                    row["tpot_ms"] = round(statistics.median(gaps), 3)
                    row["tpot_p90_ms"] = round(_p90(gaps), 3)
            elif main and main[0][1] is not None:
                row["ttft_ms"] = round(_ms(main[0][0], main[0][1]), 3)
            if len(main) > 2:
                starts = [a for a, _ in main[1:]]  # the decode forwards
                iv = [_ms(a, b) for a, b in zip(starts, starts[1:])]
                row["fwd_interval_ms"] = round(statistics.median(iv), 3)
                row["fwd_interval_p90_ms"] = round(_p90(iv), 3)
                if "tpot_ms" not in row:
                    row["tpot_ms"], row["tpot_p90_ms"] = row["fwd_interval_ms"], row["fwd_interval_p90_ms"]
            if main and main[0][1] is not None:
                row["prefill_forward_ms"] = round(_ms(main[0][0], main[0][1]), 3)
            out.append(row)
        truth = {"program": self.program, "requests": out, **self.extra, **extra,
                 "torch": torch.__version__}
        try:
            import transformers

            truth["transformers"] = transformers.__version__
        except ImportError:
            pass
        print("TRUTH " + json.dumps(truth), flush=True)
        return truth


def device_and_dtype() -> tuple[str, torch.dtype]:
    return ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
