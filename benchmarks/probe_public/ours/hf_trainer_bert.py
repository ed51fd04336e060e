"""Ours, not upstream: a Hugging Face ``Trainer`` fine-tuning script in the shape of transformers' run_glue.py.

Written for the public probe corpus (benchmarks/probe_public) because huggingface/transformers is over the
fetch limit and its example scripts need ``datasets``/``evaluate`` (on neither machine). It reads a GLUE-style
CSV (``sentence,label``), tokenizes with the model directory's WordPiece tokenizer, builds the model from the
directory's ``config.json`` (random initialisation: no weights are downloaded) and trains with ``Trainer``.

Usage::

    python hf_trainer_bert.py --model_dir DIR --train_file train.csv --validation_file dev.csv \
        --output_dir out [any TrainingArguments flag]
"""
import csv
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


@dataclass
class DataArguments:
    model_dir: str = field(metadata={"help": "folder with config.json and the tokenizer files"})
    train_file: str = field(metadata={"help": "CSV with columns sentence,label"})
    validation_file: str = field(metadata={"help": "CSV with columns sentence,label"})
    max_seq_length: int = field(default=128)


class CsvDataset(torch.utils.data.Dataset):
    """Tokenized rows of a ``sentence,label`` CSV, padded to ``max_len``."""

    def __init__(self, path, tokenizer, max_len):
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        enc = tokenizer([r["sentence"] for r in rows], padding="max_length", truncation=True, max_length=max_len)
        self.items = [{k: enc[k][i] for k in enc} | {"labels": int(r["label"])} for i, r in enumerate(rows)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {k: torch.tensor(v) for k, v in self.items[i].items()}


def accuracy(pred):
    return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}


def main():
    data_args, training_args = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(data_args.model_dir)
    config = AutoConfig.from_pretrained(data_args.model_dir, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    train = CsvDataset(data_args.train_file, tokenizer, data_args.max_seq_length)
    dev = CsvDataset(data_args.validation_file, tokenizer, data_args.max_seq_length)
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                      compute_metrics=accuracy)
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
