"""HF Trainer as people fine-tune with it: bf16, gradient accumulation 4, an evaluation every 8
optimizer steps, a Llama-shaped model (4 layers) on random tokens. A TrainerCallback is the
clock: optimizer steps, micro-batches, the optimizer's own step, the evaluations."""
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from common import batches, llama
from tclock import TrainClock, dry

clock = TrainClock("t01_trainer_accum")
ACCUM, EVAL_EVERY, STEPS = 4, 8, dry(24, 4)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.cat(batches(1, n, dry(256, 16), dry(8192, 256), seed))

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

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        if state.global_step % EVAL_EVERY == 0:
            clock.mark("evaluate:start")  # the trainer evaluates right after this callback

    def on_evaluate(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("evaluate:end")

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
        clock.mark("end")


args = TrainingArguments(output_dir="/tmp/t01", per_device_train_batch_size=4, per_device_eval_batch_size=8,
                         gradient_accumulation_steps=ACCUM, max_steps=STEPS, learning_rate=1e-4,
                         bf16=torch.cuda.is_available(), eval_strategy="steps", eval_steps=EVAL_EVERY, logging_steps=EVAL_EVERY,
                         save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=llama(), args=args, train_dataset=Tokens(4 * ACCUM * STEPS, 0), eval_dataset=Tokens(32, 1),
                  callbacks=[Clocked()])
trainer.train()
clock.report(accumulation=ACCUM, eval_every=EVAL_EVERY)
