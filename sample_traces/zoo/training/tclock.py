"""The training zoo's own clock: CUDA events recorded at the program's own step, micro-batch
and phase boundaries (``mark``), read once at the end (no extra syncs), and one line
``TRUTH {json}``: per optimizer step its time (``step_ms``: one step's start to the next's),
its micro-batches and the summed time of each phase the program marks (``forward``,
``backward``, ``optimizer``: from the phase's start mark to its end mark, GPU clock), and the
evaluations, checkpoint saves and other periodic work with their times. ``ZOO_DRY=1`` shrinks
sizes for a CPU dry run (host times stand in for events)."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

CUDA = torch.cuda.is_available()
DRY = bool(os.environ.get("ZOO_DRY"))


def dry(full, small):  # noqa: ANN001, ANN201
    return small if DRY else full


class TrainClock:
    def __init__(self, program: str) -> None:
        self.program = program
        self.marks: list[tuple[str, float, object]] = []

    def mark(self, label: str) -> None:
        ev = None
        if CUDA:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        self.marks.append((label, time.perf_counter(), ev))

    def _ms(self, a, b) -> float:  # noqa: ANN001
        if a[2] is not None and b[2] is not None:
            return float(a[2].elapsed_time(b[2]))
        return 1e3 * (b[1] - a[1])

    def report(self, **extra) -> dict:  # noqa: ANN003
        if CUDA:
            torch.cuda.synchronize()
        steps: list[dict] = []
        periodic: list[dict] = []
        open_phase: dict[str, tuple] = {}
        cur: dict | None = None
        starts = [m for m in self.marks if m[0] == "step"]
        for i, m in enumerate(self.marks):
            label = m[0]
            if label == "step":
                cur = {"step": len(steps), "micro": 0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0, "_start": m}
                steps.append(cur)
            elif label == "micro" and cur is not None:
                cur["micro"] += 1
            elif label.endswith(":start"):
                open_phase[label[:-6]] = m
            elif label.endswith(":end") and label[:-4] in open_phase:
                name = label[:-4]
                ms = self._ms(open_phase.pop(name), m)
                if name in ("forward", "backward", "optimizer") and cur is not None:
                    cur[name] += ms
                else:
                    periodic.append({"what": name, "ms": round(ms, 3), "after_step": len(steps) - 1})
            elif label == "end" and cur is not None:
                cur["_end"] = m
        for i, st in enumerate(steps):
            nxt = starts[i + 1] if i + 1 < len(starts) else st.get("_end")
            st["step_ms"] = round(self._ms(st["_start"], nxt), 3) if nxt is not None else None
            for k in ("forward", "backward", "optimizer"):
                st[k] = round(st[k], 3)
            st.pop("_start", None)
            st.pop("_end", None)
        timed = [s["step_ms"] for s in steps if s["step_ms"] is not None]
        truth = {"program": self.program, "steps": steps, "periodic": periodic,
                 "step_ms_median": round(statistics.median(timed[2:] or timed), 3) if timed else None,
                 "torch": torch.__version__, **extra}
        print("TRUTH " + json.dumps(truth), flush=True)
        return truth
