"""A run_glue-style sequence-classification fine-tune with Hugging Face transformers, fp16.

The model is built from a local config (``--config_name``, a BERT-base-sized config when absent),
so no weights are downloaded; the data are synthetic token ids unless ``--train_file`` (one
``label<TAB>text`` per line, tokenised by whitespace hashing) is given. The loop is the one
``run_glue_no_trainer`` uses (AdamW, linear warm-up schedule, GradScaler); ``hf_trainer/`` is the
``Trainer`` kind.
"""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup


class Tokens(Dataset):
    def __init__(self, n, seq_len, vocab, path=""):
        self.rows = []
        if path:
            for line in open(path):
                label, text = line.rstrip("\n").split("\t", 1)
                ids = [hash(w) % vocab for w in text.split()][:seq_len]
                self.rows.append((ids + [0] * (seq_len - len(ids)), int(label)))
        self.n, self.seq_len, self.vocab = (len(self.rows) or n), seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.rows:
            ids, label = self.rows[i]
            ids = torch.tensor(ids)
        else:
            ids, label = torch.randint(0, self.vocab, (self.seq_len,)), i % 2
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor(label)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config_name", default="")
    p.add_argument("--train_file", default="")
    p.add_argument("--output_dir", default="out-glue")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--per_device_train_batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=2e-5)
    p.add_argument("--max_steps", type=int, default=100)
    p.add_argument("--fp16", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = BertConfig.from_pretrained(args.config_name) if args.config_name else BertConfig(num_labels=2)
    model = BertForSequenceClassification(config).to(device)
    loader = DataLoader(Tokens(4096, args.max_seq_length, config.vocab_size, args.train_file),
                        batch_size=args.per_device_train_batch_size, shuffle=True, num_workers=2)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.max_steps // 10, args.max_steps)
    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)
    model.train()
    step = 0
    while step < args.max_steps:
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.float16, enabled=args.fp16):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 20 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= args.max_steps:
                break
    if torch.cuda.is_available():
        print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
