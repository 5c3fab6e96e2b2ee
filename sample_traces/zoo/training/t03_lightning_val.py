"""PyTorch Lightning with a validation loop every 6 training steps: a small convolutional image
classifier, bf16-mixed, channels_last, random images. A Lightning Callback is the clock."""
import lightning as L
import torch
from torch import nn

from tclock import TrainClock, dry

clock = TrainClock("t03_lightning_val")
VAL_EVERY, STEPS = dry(6, 2), dry(24, 4)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        c = dry(128, 8)
        self.body = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                  *[m for _ in range(4) for m in (nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())],
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 100))

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        return nn.functional.cross_entropy(self.body(x.to(memory_format=torch.channels_last)), y)

    def validation_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.body(x), y))

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Clocked(L.Callback):
    def on_train_batch_start(self, *a):  # noqa: ANN002
        clock.mark("step")
        clock.mark("micro")

    def on_before_optimizer_step(self, *a):  # noqa: ANN002
        clock.mark("optimizer:start")

    def on_train_batch_end(self, *a):  # noqa: ANN002
        clock.mark("optimizer:end")

    def on_validation_start(self, *a):  # noqa: ANN002
        clock.mark("evaluate:start")

    def on_validation_end(self, *a):  # noqa: ANN002
        clock.mark("evaluate:end")

    def on_train_end(self, *a):  # noqa: ANN002
        clock.mark("end")


def data(n: int, seed: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    side = dry(64, 16)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 3, side, side, generator=g), torch.randint(0, 100, (n,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=dry(64, 4))


gpu = torch.cuda.is_available()
trainer = L.Trainer(max_steps=STEPS, val_check_interval=VAL_EVERY, limit_val_batches=4, num_sanity_val_steps=0,
                    precision="bf16-mixed" if gpu else "32-true", accelerator="gpu" if gpu else "cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, callbacks=[Clocked()])
trainer.fit(Net(), data(dry(64, 4) * STEPS, 0), data(256, 1))
clock.report(val_every=VAL_EVERY)
