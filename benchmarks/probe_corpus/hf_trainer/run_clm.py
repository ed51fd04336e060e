"""A ``run_clm``-style causal-LM pre-training with the Hugging Face ``Trainer``, from scratch.

The model comes from a local config (``--config_name``, a GPT-2 small config in ``gpt2-small/``),
so no weights are downloaded; the data are synthetic token blocks unless ``--train_file`` (a text
file, tokenised by whitespace hashing) is given. ``TrainingArguments`` as in run_clm: fp16,
gradient accumulation, ``save_steps``, ``logging_steps``, ``report_to`` default.
"""
import argparse

import torch
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator


class Blocks(Dataset):
    def __init__(self, n, block_size, vocab, path=""):
        self.block_size, self.vocab = block_size, vocab
        self.ids = []
        if path:
            with open(path) as fh:
                self.ids = [hash(w) % vocab for w in fh.read().split()]
        self.n = len(self.ids) // block_size if self.ids else n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ids:
            x = torch.tensor(self.ids[i * self.block_size:(i + 1) * self.block_size])
        else:
            x = torch.randint(0, self.vocab, (self.block_size,))
        return {"input_ids": x, "labels": x.clone()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config_name", required=True)
    p.add_argument("--train_file", default="")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--block_size", type=int, default=512)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=5e-4)
    p.add_argument("--num_train_epochs", type=float, default=1.0)
    p.add_argument("--max_steps", type=int, default=-1)
    p.add_argument("--save_steps", type=int, default=500)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    config = AutoConfig.from_pretrained(args.config_name)
    model = AutoModelForCausalLM.from_config(config)
    n = sum(t.numel() for t in model.parameters())
    print(f"Training new model from scratch - Total size={n / 2**20:.2f}M params")
    train = Blocks(20000, args.block_size, config.vocab_size, args.train_file)
    targs = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, learning_rate=args.learning_rate,
        num_train_epochs=args.num_train_epochs, max_steps=args.max_steps, fp16=args.fp16, bf16=args.bf16,
        save_steps=args.save_steps, logging_steps=50, warmup_steps=100, weight_decay=0.1,
        dataloader_num_workers=4)
    trainer = Trainer(model=model, args=targs, train_dataset=train, data_collator=default_data_collator)
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    if torch.cuda.is_available():
        print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
