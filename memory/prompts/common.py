"""What every prompt module shares: the two-message chat a request carries."""
from __future__ import annotations

__all__ = ["chat"]


def chat(system: str, user: str) -> list[dict[str, str]]:
    """OpenAI-style chat messages: one system message, one user message."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
