"""JAX/Flax training: a small transformer-style MLP stack (flax.linen) with optax AdamW, the
train step jitted; the loss read back every step (as a loop that logs it does). JAX has no
CUDA events here: the clock is the host's, each step ending when its loss is on the host."""
import json
import time

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

DRY = False
try:
    import os

    DRY = bool(os.environ.get("ZOO_DRY"))
except Exception:  # noqa: BLE001
    pass


class Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):  # noqa: ANN001, ANN204
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * self.width)(h)
        return x + nn.Dense(self.width)(nn.gelu(h))


class Model(nn.Module):
    width: int
    depth: int

    @nn.compact
    def __call__(self, x):  # noqa: ANN001, ANN204
        x = nn.Dense(self.width)(x)
        for _ in range(self.depth):
            x = Block(self.width)(x)
        return nn.Dense(10)(x)


width, depth, batch = (64, 2, 8) if DRY else (1024, 8, 512)
model = Model(width, depth)
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (batch, 256))
y = jax.random.randint(key, (batch,), 0, 10)
params = model.init(key, x)
opt = optax.adamw(1e-3)
state = opt.init(params)


@jax.jit
def train_step(params, state, x, y):  # noqa: ANN001, ANN201
    def loss_fn(p):  # noqa: ANN001, ANN202
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


steps = []
for i in range(4 if DRY else 40):
    t = time.perf_counter()
    params, state, loss = train_step(params, state, x, y)
    float(loss)  # the loss on the host: the step is done
    steps.append({"step": i, "micro": 1, "step_ms": round(1e3 * (time.perf_counter() - t), 3)})
timed = sorted(s["step_ms"] for s in steps[2:])
print("TRUTH " + json.dumps({"program": "t10_jax_flax", "steps": steps, "periodic": [], "clock": "host",
                             "step_ms_median": timed[len(timed) // 2], "jax": jax.__version__}), flush=True)
