"""A nanoGPT-style GPT trainer: bf16 autocast, gradient accumulation, AdamW, optional torch.compile.

Reads ``--data DIR/train.bin`` (uint16 token ids) when given; otherwise random token ids.
Configuration by ``--key=value`` arguments, as nanoGPT's configurator.
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

n_layer, n_head, n_embd, block_size, vocab_size, dropout = 12, 12, 768, 1024, 50304, 0.0
batch_size, gradient_accumulation_steps, max_iters, learning_rate = 12, 5, 20, 6e-4
data, compile = "", False
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=")
    globals()[key] = type(globals()[key])(val) if not isinstance(globals()[key], bool) else val == "True"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if self.training else 0, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        print(f"number of parameters: {sum(p.numel() for p in self.parameters()) / 1e6:.2f}M")

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def get_batch(device):
    if data:
        d = np.memmap(f"{data}/train.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(d[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    else:
        x = torch.randint(0, vocab_size, (batch_size, block_size))
        y = torch.randint(0, vocab_size, (batch_size, block_size))
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


device = "cuda"
torch.backends.cuda.matmul.allow_tf32 = True
ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
if compile:
    model = torch.compile(model)
X, Y = get_batch(device)
for it in range(max_iters):
    lr = learning_rate * 0.5 * (1 + math.cos(math.pi * it / max_iters))
    for g in optimizer.param_groups:
        g["lr"] = lr
    for _micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch(device)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}")
print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")
