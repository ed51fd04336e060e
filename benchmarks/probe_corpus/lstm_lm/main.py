"""Word-level LSTM language model in the style of the PyTorch word_language_model example.

Reads ``--data DIR/train.txt`` when given; otherwise a synthetic corpus (33,278-word vocabulary,
Wikitext-2 sized) is made in-process. Truncated BPTT with a carried hidden state.
"""
import argparse
import os

import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        return self.decoder(self.drop(output)).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(self.nlayers, bsz, self.nhid), w.new_zeros(self.nlayers, bsz, self.nhid))


def corpus(path, ntokens):
    if path:
        words = open(os.path.join(path, "train.txt")).read().split()
        vocab = {w: i for i, w in enumerate(sorted(set(words)))}
        return torch.tensor([vocab[w] for w in words]), len(vocab)
    return torch.randint(0, ntokens, (2_000_000,)), ntokens


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="")
    p.add_argument("--emsize", type=int, default=650)
    p.add_argument("--nhid", type=int, default=650)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--lr", type=float, default=20)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--cuda", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if args.cuda else "cpu")
    data, ntokens = corpus(args.data, 33278)
    nbatch = data.size(0) // args.batch_size
    data = data[: nbatch * args.batch_size].view(args.batch_size, -1).t().contiguous().to(device)
    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    hidden = model.init_hidden(args.batch_size)
    model.train()
    for step, i in enumerate(range(0, data.size(0) - 1, args.bptt)):
        seq_len = min(args.bptt, len(data) - 1 - i)
        x, y = data[i:i + seq_len], data[i + 1:i + 1 + seq_len].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        optimizer.zero_grad()
        output, hidden = model(x, hidden)
        loss = criterion(output, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.2f}")
        if args.max_steps and step + 1 >= args.max_steps:
            break
    if args.cuda:
        print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
