"""Peak memory of the GPU-metric samples: the eager ``trace.gpu_metrics`` vs a lazy
``trace.scan("gpu_metrics")`` query collected with polars' streaming engine.

One mode per process (run it under ``/usr/bin/time -v`` for the peak RSS; the script also
prints ``ru_maxrss``); ``TRACEKIT_CACHE`` decides whether the column cache is cold or warm.

* ``eager`` — ``trace.gpu_metrics`` (every sample, labelled), then the mean ``sms_active``
  per device computed from it;
* ``scan-one`` — the same mean from ``trace.scan("gpu_metrics")`` filtered on
  ``metric == "sms_active"`` (the filter reaches the read: other metrics' samples are not read);
* ``scan-all`` — the mean of every metric per device, over all samples, streamed.

    /usr/bin/time -v python benchmarks/bench_gpu_metrics.py MODE [--file benchmarks/out/gm250k.sqlite]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import polars as pl

import tracekit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["eager", "scan-one", "scan-all"])
    parser.add_argument("--file", type=Path, default=Path("benchmarks/out/gm250k.sqlite"))
    args = parser.parse_args()
    t0 = time.perf_counter()
    trace = tracekit.open(args.file)
    one = pl.col("metric") == "sms_active"
    if args.mode == "eager":
        frame = trace.gpu_metrics
        rows = frame.height
        result = frame.filter(one).group_by("device_id").agg(pl.col("value").mean()).sort("device_id")
    elif args.mode == "scan-one":
        result = (trace.scan("gpu_metrics").filter(one).group_by("device_id").agg(pl.col("value").mean())
                  .sort("device_id").collect(engine="streaming"))
        rows = -1
    else:
        result = (trace.scan("gpu_metrics").group_by("device_id", "metric").agg(pl.col("value").mean(), pl.len())
                  .sort("device_id", "metric").collect(engine="streaming"))
        rows = int(result["len"].sum())
    seconds = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mode": args.mode, "seconds": round(seconds, 2), "rows": rows, "peak_rss_mb": round(rss_mb),
                      "sms_active": result.head(4).rows() if args.mode != "scan-all" else result.height}))


if __name__ == "__main__":
    main()
