"""Pure analyses over tracekit's tables: frames in, frames out (no I/O, no plotting).

Modules by topic: attribution, breakdowns, torch_ops, families, gpu_time, launch, iterations, memory, metrics (and the NCCL/rank analyses).
"""
