"""The task and the policy, shared by the trainer and the rollout servers.

Task (verifiable): the prompt is a target number T in [4, 32]; the policy writes 4 digits;
the reward is 1 when the digits sum to T and falls by 0.1 per unit of distance.

Policy: a tiny character-level GRU (≈ 30k parameters) over the vocabulary
'0'..'9', '=' and '^' (start). A prompt "17=" is fed in, then 4 digits are sampled."""

from __future__ import annotations

import io

import torch
from torch import nn

DIGITS = 4
VOCAB = [str(d) for d in range(10)] + ["=", "^"]
EQ, BOS = VOCAB.index("="), VOCAB.index("^")
TARGETS = range(4, 33)


def encode_prompt(target: int) -> list[int]:
    return [BOS] + [VOCAB.index(c) for c in str(target)] + [EQ]


def reward(target: int, digits: list[int]) -> float:
    return max(0.0, 1.0 - 0.1 * abs(sum(digits) - target))


class Policy(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), 32)
        self.gru = nn.GRU(32, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)  # only digits are ever generated

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        out, state = self.gru(self.embed(tokens), state)
        return self.head(out), state

    @torch.no_grad()
    def sample(self, prompts: list[list[int]], generator: torch.Generator | None = None):
        """Sample DIGITS digits per prompt; returns (digits, their log-probs) as lists."""
        logits, state = self._prefill(prompts)
        step_logits = logits
        digits, logps = [], []
        for _ in range(DIGITS):
            dist = torch.distributions.Categorical(logits=step_logits)
            token = dist.sample() if generator is None else torch.multinomial(dist.probs, 1, generator=generator)[:, 0]
            digits.append(token)
            logps.append(dist.log_prob(token))
            out, state = self.forward(token[:, None], state)
            step_logits = out[:, -1]
        return torch.stack(digits, 1).tolist(), torch.stack(logps, 1).tolist()

    def logprobs(self, prompts: list[list[int]], digits: torch.Tensor) -> torch.Tensor:
        """Log-probs of given digit sequences (batch × DIGITS), with gradients."""
        first, state = self._prefill(prompts)
        rest, _ = self.forward(digits[:, :-1], state)
        logits = torch.cat([first[:, None], rest], 1)
        return torch.log_softmax(logits, -1).gather(-1, digits[..., None])[..., 0]

    def _prefill(self, prompts: list[list[int]]):
        # Prompts differ in length ("7=" vs "17="): left-pad with BOS, which the GRU learns to skip.
        width = max(len(p) for p in prompts)
        tokens = torch.tensor([[BOS] * (width - len(p)) + p for p in prompts])
        out, state = self.forward(tokens)
        return out[:, -1], state


def to_bytes(model: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def from_bytes(model: nn.Module, data: bytes) -> None:
    model.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
