"""What both fine-tuning loops share: the data, the model, the param groups and the eval pass.

The task: a small character-level language model on the GPL-3 text that every Debian system
ships. The "pretrained" embedding is frozen (as a LoRA job freezes its base); every other
param trains, split as Hugging Face's Trainer does by default: weight decay for weights,
none for biases and LayerNorm.
"""
import torch
import torch.nn.functional as F
from torch import nn

TEXT = "/usr/share/common-licenses/GPL-3"
CONTEXT, DIM, BATCH = 32, 64, 32


def load_text():
    """The text as a tensor of character ids, and the vocabulary size."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text]), len(vocab)


def batch(data, step, micro, rank=0, world=1):
    """Rank `rank`'s share of micro-batch `micro` of `step`: the same global batch whatever
    the world size, so runs at different rank counts see the same samples."""
    generator = torch.Generator().manual_seed(1000 * step + micro)
    starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=generator)
    starts = starts.chunk(world)[rank]
    x = torch.stack([data[s:s + CONTEXT] for s in starts])
    y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
    return x, y


class CharModel(nn.Module):
    """Embedding (frozen), two residual MLP blocks with LayerNorm, and a head."""

    def __init__(self, vocab):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, DIM)
        self.embed.requires_grad_(False)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.GELU(),
                          nn.Linear(4 * DIM, DIM)) for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, vocab)

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        logits = self.head(self.norm(h)).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def param_groups(model, weight_decay=0.1):
    """Weights decay; biases and LayerNorm do not (Hugging Face Trainer's default split)."""
    no_decay = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm)
                for p in m.parameters()}
    no_decay |= {id(p) for n, p in model.named_parameters() if n.endswith("bias")}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if id(p) not in no_decay],
             "weight_decay": weight_decay},
            {"params": [p for p in trainable if id(p) in no_decay], "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model, data):
    """Mean loss over four fixed held-out batches."""
    model.eval()
    losses = [model(*batch(data, -1 - i, 0)).item() for i in range(4)]
    model.train()
    return sum(losses) / len(losses)
