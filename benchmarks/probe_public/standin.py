"""Stand-in data for the public probe corpus: small files in the formats the upstream scripts read offline.

Each generator writes under ``dest`` (a folder, or a file where the manifest names one) and is deterministic
(seeded). Shapes that set GPU memory follow the real data (MNIST 28x28, Cora 2,708 nodes x 1,433 features,
WikiText-2's 33,278-word vocabulary, GPT-2's 50,257 tokens, BERT-base's 30,522-token vocabulary); how many
samples there are is cut down so that a first evaluation pass comes within seconds of the start.
Needs numpy, Pillow and torch (and transformers for ``bert_base_dir``).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from typing import Callable, Dict

import numpy as np

RNG_SEED = 29


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng([RNG_SEED, sum(map(ord, tag))])


def _jpeg(rng: np.random.Generator, w: int, h: int) -> bytes:
    """A smooth random RGB JPEG of ``w`` x ``h`` pixels (small noise upsampled: a few KiB)."""
    from PIL import Image
    small = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    small.resize((w, h), Image.BICUBIC).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def mnist_raw(dest: str, n_train: int = 2048) -> None:
    """torchvision ``MNIST(dest)``: ``dest/MNIST/raw/*-ubyte`` (idx format), ``n_train`` train and 1,024 test images."""
    raw = os.path.join(dest, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    rng = _rng("mnist")
    for prefix, n in (("train", n_train), ("t10k", 1024)):
        with open(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), "wb") as fh:
            fh.write(struct.pack(">IIII", 2051, n, 28, 28) + rng.integers(0, 256, n * 784, dtype=np.uint8).tobytes())
        with open(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), "wb") as fh:
            fh.write(struct.pack(">II", 2049, n) + rng.integers(0, 10, n, dtype=np.uint8).tobytes())


def lightning_mnist(dest: str) -> None:
    """``lightning.pytorch.demos`` MNIST: ``dest/MNIST/complete/{training,test}.pt`` (uint8 images, labels)."""
    import torch
    out = os.path.join(dest, "MNIST", "complete")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(RNG_SEED)
    for name, n in (("training.pt", 2048), ("test.pt", 1024)):
        torch.save((torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g),
                    torch.randint(0, 10, (n,), generator=g)), os.path.join(out, name))


def image_folder(dest: str, n_train: int = 320) -> None:
    """ImageFolder tree ``dest/{train,val}/cNN/*.jpg``: 10 classes, ``n_train`` train and 256 val JPEGs of
    96x96."""
    rng = _rng("imagefolder")
    for split, n in (("train", n_train), ("val", 256)):
        for i in range(n):
            d = os.path.join(dest, split, f"c{i % 10:02d}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"{i:05d}.jpg"), "wb") as fh:
                fh.write(_jpeg(rng, 96, 96))


def bsds300(dest: str) -> None:
    """BSDS300 layout ``dest/{train,test}/*.jpg``: 200 train and 100 test JPEGs of 481x321 (the real sizes)."""
    rng = _rng("bsds")
    for split, n in (("train", 200), ("test", 100)):
        os.makedirs(os.path.join(dest, split), exist_ok=True)
        for i in range(n):
            with open(os.path.join(dest, split, f"{i:05d}.jpg"), "wb") as fh:
                fh.write(_jpeg(rng, 481, 321))


def vgg16_weights(dest: str) -> None:
    """``$TORCH_HOME/hub/checkpoints/vgg16-397923af.pth``: a randomly initialised VGG-16 state dict (528 MiB)."""
    import torch
    import torchvision
    out = os.path.join(dest, "hub", "checkpoints")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(RNG_SEED)
    torch.save(torchvision.models.vgg16().state_dict(), os.path.join(out, "vgg16-397923af.pth"))


def wikitext2(dest: str) -> None:
    """``dest/{train,valid,test}.txt``: random words of a 33,278-word vocabulary, WikiText-2's token counts."""
    rng = _rng("wikitext")
    os.makedirs(dest, exist_ok=True)
    vocab = np.array([f"w{i}" for i in range(33278 - 1)])  # + <eos>
    for name, n_tokens in (("train.txt", 2_088_628), ("valid.txt", 217_646), ("test.txt", 245_569)):
        words = vocab[rng.integers(0, len(vocab), n_tokens)]
        lines = [" " + " ".join(words[i:i + 100]) + " " for i in range(0, n_tokens, 100)]
        with open(os.path.join(dest, name), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def cora(dest: str) -> None:
    """``dest/cora.{content,cites}``: 2,708 papers x 1,433 binary features, 7 classes, 5,429 citations."""
    rng = _rng("cora")
    os.makedirs(dest, exist_ok=True)
    ids = rng.choice(1_200_000, 2708, replace=False)
    labels = ["Case_Based", "Genetic_Algorithms", "Neural_Networks", "Probabilistic_Methods",
              "Reinforcement_Learning", "Rule_Learning", "Theory"]
    feats = (rng.random((2708, 1433)) < 0.0127).astype(np.int8)
    with open(os.path.join(dest, "cora.content"), "w") as fh:
        for pid, row in zip(ids, feats):
            fh.write(f"{pid}\t" + "\t".join(map(str, row)) + f"\t{labels[rng.integers(7)]}\n")
    with open(os.path.join(dest, "cora.cites"), "w") as fh:
        for a, b in rng.choice(ids, (5429, 2)):
            fh.write(f"{a}\t{b}\n")


def sine_wave(dest: str) -> None:
    """``traindata.pt``: 100 sine waves of 1,000 float64 samples (a numpy array, as the example expects)."""
    import torch
    rng = _rng("sine")
    x = np.arange(1000)[None, :] + rng.integers(-80, 80, (100, 1))
    torch.save(np.sin(x / 20.0).astype("float64"), dest)


def nanogpt_char(dest: str) -> None:
    """nanoGPT ``shakespeare_char``: ``train.bin``/``val.bin`` (uint16, 65 symbols) and ``meta.pkl``."""
    rng = _rng("charbin")
    os.makedirs(dest, exist_ok=True)
    chars = sorted(set("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
    for name, n in (("train.bin", 1_003_854), ("val.bin", 111_540)):
        rng.integers(0, len(chars), n).astype(np.uint16).tofile(os.path.join(dest, name))
    with open(os.path.join(dest, "meta.pkl"), "wb") as fh:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, fh)


def nanogpt_gpt2(dest: str) -> None:
    """nanoGPT ``openwebtext``: ``train.bin``/``val.bin`` of random GPT-2 token ids (uint16; 1M and 100k)."""
    rng = _rng("owt")
    os.makedirs(dest, exist_ok=True)
    for name, n in (("train.bin", 1_000_000), ("val.bin", 100_000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(os.path.join(dest, name))


def char_text(dest: str) -> None:
    """minGPT chargpt ``input.txt``: 1 MB of random characters from 65 symbols."""
    rng = _rng("chartext")
    chars = np.array(list("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
    with open(dest, "w") as fh:
        fh.write("".join(chars[rng.integers(0, len(chars), 1_000_000)]))


_BERT_WORDS = 30522 - 5


def bert_base_dir(dest: str) -> None:
    """A model folder: BERT-base ``config.json`` and a 30,522-token WordPiece vocabulary (no weights)."""
    from transformers import BertConfig, BertTokenizerFast
    os.makedirs(dest, exist_ok=True)
    vocab = os.path.join(dest, "vocab.txt")
    with open(vocab, "w") as fh:
        fh.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(_BERT_WORDS)]))
    BertTokenizerFast(vocab_file=vocab).save_pretrained(dest)
    BertConfig().save_pretrained(dest)


def glue_csv(dest: str) -> None:
    """``dest/{train,dev}.csv`` (``sentence,label``): 2,048 and 512 rows of 20-150 words."""
    rng = _rng("glue")
    os.makedirs(dest, exist_ok=True)
    for name, n in (("train.csv", 2048), ("dev.csv", 512)):
        with open(os.path.join(dest, name), "w") as fh:
            fh.write("sentence,label\n")
            for _ in range(n):
                words = rng.integers(0, _BERT_WORDS, rng.integers(20, 150))
                fh.write(" ".join(f"w{w}" for w in words) + f",{rng.integers(2)}\n")


def site(dest: str, wheels: str = "") -> None:
    """``dest``: pure-Python packages the examples import that the venvs lack (six; requests and its needs),
    unpacked from the wheels in ``wheels`` (``setup_corpus.py`` downloads them with ``pip download``)."""
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(wheels)):
        if name.endswith("-none-any.whl"):
            with zipfile.ZipFile(os.path.join(wheels, name)) as zf:
                zf.extractall(dest)


GENERATORS: Dict[str, Callable[[str], None]] = {
    f.__name__: f for f in (mnist_raw, lightning_mnist, image_folder, bsds300, vgg16_weights, wikitext2, cora,
                            sine_wave, nanogpt_char, nanogpt_gpt2, char_text, bert_base_dir, glue_csv)}
# Pure-Python only (the same files serve Python 3.11 here and 3.12 there); requests runs without
# charset-normalizer (a warning), which has no pure-Python wheel.
SITE_WHEELS = ["six==1.17.0", "requests==2.32.3", "urllib3==2.2.3", "idna==3.10", "certifi==2024.8.30"]


def describe() -> Dict[str, str]:
    """Each generator's one-line description (for the manifest table)."""
    return {k: (f.__doc__ or "").split("\n")[0] for k, f in dict(GENERATORS, site=site).items()}


if __name__ == "__main__":
    print(json.dumps(describe(), indent=1))
