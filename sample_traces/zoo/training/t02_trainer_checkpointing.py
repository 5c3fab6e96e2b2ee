"""HF Trainer with gradient checkpointing (the forward recomputed inside the backward) and
gradient accumulation 2, bf16, a Llama-shaped model (6 layers); no evaluation."""
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from common import batches, llama
from tclock import TrainClock, dry

clock = TrainClock("t02_trainer_checkpointing")
ACCUM, STEPS = 2, dry(20, 4)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.cat(batches(1, n, dry(512, 16), dry(8192, 256), 2))

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Clocked(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("step")

    def on_substep_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("micro")

    def on_pre_optimizer_step(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("micro")
        clock.mark("optimizer:start")

    def on_optimizer_step(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("optimizer:end")

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("end")


args = TrainingArguments(output_dir="/tmp/t02", per_device_train_batch_size=4, gradient_accumulation_steps=ACCUM,
                         max_steps=STEPS, learning_rate=1e-4, bf16=torch.cuda.is_available(), gradient_checkpointing=True,
                         save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True, logging_steps=10)
Trainer(model=llama(layers=6), args=args, train_dataset=Tokens(4 * ACCUM * STEPS), callbacks=[Clocked()]).train()
clock.report(accumulation=ACCUM, gradient_checkpointing=True)
