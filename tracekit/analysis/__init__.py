"""Pure analyses over tracekit's tables: frames in, frames out (no I/O, no plotting).

One topic per module: attribution, breakdowns, torch_ops, gpu_time, launch, iterations, memory, metrics.
"""
