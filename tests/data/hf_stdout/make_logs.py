"""Write the HF Trainer console logs of tests/data/hf_stdout (see tests/data/README.md).

python make_logs.py run_bars bars > bars.log 2>&1     # with the progress bars
python make_logs.py run_plain plain > plain.log 2>&1  # disable_tqdm=True
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.set_num_threads(1)


class Shifted(Dataset):
    """Sequences 0..7 repeated, each shifted by a random offset: learnable in 200 steps."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        base = torch.arange(32) % 8
        self.x = (base[None, :] + torch.randint(0, 8, (n, 1), generator=g)) % 64

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main(out: str, bars: bool) -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    config.bos_token_id = config.eos_token_id = 0
    args = TrainingArguments(
        output_dir=out,
        max_steps=200,
        per_device_train_batch_size=8,
        logging_steps=10,
        eval_strategy="steps",
        eval_steps=50,
        save_steps=50,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=not bars,
        save_total_limit=2,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=Shifted(512, 0),
        eval_dataset=Shifted(64, 1),
    )
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "bars")
