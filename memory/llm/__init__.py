"""LLM backends chosen by name: rules (default), openai, vllm, replay; see `memory.llm.base`."""
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, get_backend, register_backend

__all__ = ["LLMBackend", "LLMRequest", "LLMResponse", "get_backend", "register_backend"]
