"""Pure analyses over tracekit's tables: frames in, frames out (no I/O, no plotting).

Modules by topic: attribution, breakdowns, layers (layer and block of an NVTX path, forwards as steps), torch_ops, families, gpu_time, launch, memory (copies, memory over time, memory per NVTX range: layer_memory), metrics (and the NCCL/rank analyses),
hta_views (HolisticTraceAnalysis's five views with its definitions).
The run's structure (start-up, warm-up, steady iterations, forward passes, requests, training
phases) lives in ``run/``.
"""
