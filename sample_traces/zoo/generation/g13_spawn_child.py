"""The generation loop in a spawned worker process (a fresh interpreter, as
``multiprocessing`` with ``spawn`` and most job launchers start one). A Llama-shaped model
(8 layers), batch 2, a warm-up then three requests."""
import multiprocessing as mp


def worker() -> None:
    import torch

    from clock import Clock
    from common import dry, llama, prompt

    model = llama(8)
    clock = Clock("g13_spawn_child")
    clock.watch(model, "llama8")
    with torch.inference_mode():
        for i, (p, n, warm) in enumerate([(32, 4, True), (96, 20, False), (700, 20, False), (200, 20, False)]):
            ids = prompt(model, dry(p, 16), batch=2, seed=i)
            n = dry(n, 4)
            with clock.request(prompt=ids.shape[1], new=n, batch=2, warmup=warm):
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, streamer=clock)
    clock.report()


if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=worker)
    p.start()
    p.join()
