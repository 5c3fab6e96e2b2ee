"""Serve a request load with the continuous-batching engine of ``engine.py``.

``--layout inproc``: the client loop and the engine share one process (an offline benchmark
with arrival times). ``--layout child``: the way vLLM runs: the parent is the API server (it
asks CUDA how many devices there are, as servers do at start-up, and nothing more on the
GPU) and the engine runs in a child process started with ``multiprocessing``'s ``fork``;
requests go to the engine and results come back over queues. Without
``--trace-fork-before-exec=true`` nsys does not follow that child, so the engine's kernels
are missing from the capture while GPU metrics (device-wide) still show the GPU busy.

The load, as ``vllm bench serve`` sends it: one single test request first (then a pause),
then ``--requests`` requests with Poisson arrivals at ``--rate`` per second. Each process
prints JSON: per request the time to first token (from its arrival) and time per output
token, and the engine's step count: the ground truth the tracekit reading is compared with.
Nothing emits NVTX and nothing calls ``cudaProfilerStart``: the whole run is captured.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import time


def serve(engine, requests, out_q=None):  # type: ignore[no-untyped-def]
    """Run the engine until every request has finished, admitting each at its arrival time."""
    pending = sorted(requests, key=lambda r: r.arrival)
    done = []
    while pending or engine.waiting or engine.running:
        now = time.perf_counter()
        while pending and pending[0].arrival <= now:
            engine.add(pending.pop(0))
        if not engine.waiting and not engine.running:
            time.sleep(max(0.0, min(pending[0].arrival - now, 0.05)))
            continue
        finished = engine.step()
        done.extend(finished)
        if out_q is not None:
            for r in finished:
                out_q.put((r.rid, len(r.out)))
    return done


def engine_main(args, in_q, out_q):  # type: ignore[no-untyped-def]
    """The engine process: build, warm up, then serve what the API server forwards."""
    from engine import Engine, latency_summary

    engine = Engine(layers=args.layers, slots=args.slots, device=args.device)
    engine.warm_up()
    out_q.put("ready")
    while True:
        batch = in_q.get()
        if batch is None:
            break
        now = time.perf_counter()
        for r in batch:  # arrival offsets relative to when the batch was sent
            r.arrival = now + r.arrival
        done = serve(engine, batch, out_q)
        out_q.put(("summary", {"steps": engine.steps, **latency_summary(done)}))
        engine.steps = 0
    out_q.put("bye")
    out_q.close()
    out_q.join_thread()
    if engine.device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    # multiprocessing ends a forked child with os._exit, which skips the C exit handlers where
    # the profiler writes its last buffers of GPU activity: leave through libc's exit instead
    import ctypes

    ctypes.CDLL(None).exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=["inproc", "child"], default="inproc")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rate", type=float, default=8.0, help="arrivals per second")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    from engine import Request, Shape, latency_summary, make_requests

    vocab = Shape(1).vocab
    test = [Request(1000, list(range(1, 129)), 16, 0.0)]
    load = make_requests(args.requests, args.rate, 7, vocab, 0.0)
    report = {"layout": args.layout, "n_requests": args.requests, "rate": args.rate, "layers": args.layers, "pid": os.getpid()}
    if args.layout == "inproc":
        from engine import Engine

        engine = Engine(layers=args.layers, slots=args.slots, device=args.device)
        engine.warm_up()
        t0 = time.perf_counter()
        for r in test:
            r.arrival = t0
        first = serve(engine, test)
        steps_test = engine.steps
        time.sleep(0.5)  # the benchmark client's pause after its test request
        t0 = time.perf_counter()
        for r in load:
            r.arrival += t0
        done = serve(engine, load)
        report.update({"test_request": latency_summary(first)["requests"], "test_steps": steps_test,
                       "load_steps": engine.steps - steps_test, "load_s": round(time.perf_counter() - t0, 3),
                       **latency_summary(done)})
    else:
        import multiprocessing as mp

        import torch

        ctx = mp.get_context("fork")  # before the API server touches CUDA (a forked child cannot use it after)
        in_q, out_q = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=engine_main, args=(args, in_q, out_q), daemon=True)
        proc.start()
        report["engine_pid"] = proc.pid
        if args.device == "cuda":  # what an API server asks at start-up: a few CUDA runtime calls, no kernels
            report["cuda_devices_seen_by_api_server"] = torch.cuda.device_count()
            report["device_name"] = torch.cuda.get_device_name(0)
        assert out_q.get(timeout=600) == "ready"
        summaries = []
        for batch in (test, load):
            in_q.put(batch)
            while True:
                msg = out_q.get(timeout=600)
                if isinstance(msg, tuple) and msg[0] == "summary":
                    summaries.append(msg[1])
                    break
            time.sleep(0.5)
        in_q.put(None)
        try:
            out_q.get(timeout=60)
        except queue.Empty:
            pass
        proc.join(timeout=60)
        report.update({"test_request": summaries[0]["requests"], "test_steps": summaries[0]["steps"],
                       "load_steps": summaries[1]["steps"], "requests_done": summaries[1]["requests"]})
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
