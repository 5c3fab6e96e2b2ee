"""The generation loop inside a worker process started with fork, as serving front ends start
their engine: the parent never touches CUDA and waits. A Llama-shaped model (8 layers),
batch 1, a warm-up then four requests of different prompts, 50 ms apart. Capture with
``--trace-fork-before-exec=true`` (nsys follows forked children only then)."""
import multiprocessing as mp
import time


def worker() -> None:
    import torch

    from clock import Clock
    from common import dry, llama, prompt

    model = llama(8)
    clock = Clock("g12_fork_child")
    clock.watch(model, "llama8")
    with torch.inference_mode():
        for i, (p, n, warm) in enumerate([(64, 4, True), (512, 16, False), (128, 16, False), (1024, 16, False), (256, 16, False)]):
            ids = prompt(model, dry(p, 16), seed=i)
            n = dry(n, 4)
            with clock.request(prompt=ids.shape[1], new=n, batch=1, warmup=warm):
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, streamer=clock)
            time.sleep(0.05)
    clock.report()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    import ctypes

    ctypes.CDLL(None).exit(0)  # libc's exit: the profiler flushes its buffers in the exit handlers


if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=worker)
    p.start()
    while p.is_alive():
        time.sleep(0.02)
    p.join()
