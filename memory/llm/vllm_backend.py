"""The `vllm` backend: offline batch inference with `vllm.LLM.chat` and structured outputs.

One `chat` call per batch; vLLM schedules it. A batch may mix schemas, so every prompt gets its
own sampling params (one object per distinct schema, a list paired with the prompts):
`SamplingParams(max_tokens=..., temperature=..., structured_outputs=StructuredOutputsParams(json=schema))`.
`max_tokens` is always set: vLLM's default is 16. A prompt longer than the model's context makes
vLLM refuse the whole batch (a ValueError): the batch is split until that prompt alone is rejected. The constrained schema comes from the request
builder the `openai` backend uses too (`memory.llm.structured.decoding_schema`), so both backends
decode against the same schema and token limit, and the runner validates and quarantines both alike.

The engine is loaded once per process and model (module cache) and lazily, on the first batch.
Tests inject `llm=`, any object with `LLM.chat`'s signature returning RequestOutput-shaped objects;
when vllm is not installed such a fake receives `SimpleSamplingParams` (`.max_tokens`,
`.temperature`, `.json_schema`) instead of vLLM's classes.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

from memory.errors import ConfigError, LLMError, OptionalDependencyError
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.llm.structured import decoding_schema

log = logging.getLogger(__name__)

#: how vLLM words a prompt longer than the model's context ("The decoder prompt (length 9000) is longer
#: than the maximum model length of 8192", "... exceeds max_model_len"): the only refusal halving isolates
_TOO_LONG = re.compile(r"maximum model length|max_model_len|maximum context length", re.IGNORECASE)

_ENGINES: dict[str, Any] = {}
_ENGINES_LOCK = threading.Lock()
_CHAT_LOCKS: dict[int, threading.Lock] = {}


@dataclass(frozen=True)
class SimpleSamplingParams:
    """What an injected fake `llm` receives when vllm is not installed."""

    max_tokens: int
    temperature: float
    json_schema: dict[str, Any]


def vllm_module() -> Any | None:
    """The `vllm` package, or None when it is not installed."""
    try:
        import vllm
    except ImportError:
        return None
    return vllm


def _engine(model: str, engine_kwargs: dict[str, Any]) -> Any:
    """The process-wide `vllm.LLM` for this model (loading takes minutes and most of the GPU)."""
    key = f"{model}|{json.dumps(engine_kwargs, sort_keys=True, default=str)}"
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            vllm = vllm_module()
            if vllm is None:
                raise OptionalDependencyError("vllm", "vllm")
            log.info("vllm: loading %s", model)
            _ENGINES[key] = vllm.LLM(model=model, **engine_kwargs)
        return _ENGINES[key]


@register_backend("vllm")
class VLLMBackend(LLMBackend):
    """Offline structured-output batch inference on the local GPU(s)."""

    name = "vllm"
    live = True
    default_model = ""

    def __init__(self, model: str = "", max_tokens: int = 2048, temperature: float = 0.0, *,
                 llm: Any | None = None, engine_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(model)
        if llm is None and vllm_module() is None:
            raise OptionalDependencyError("vllm", "vllm")
        if llm is None and not self.model:
            raise ConfigError("the vllm backend needs a model: set MNEMO_LLM_MODEL to a Hugging Face id or path",
                              backend="vllm")
        if max_tokens < 1:
            raise ConfigError(f"vllm backend: max_tokens must be >= 1, got {max_tokens}", backend="vllm")
        self.model = self.model or "injected"
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.engine_kwargs = dict(engine_kwargs or {})
        self._llm = llm

    @property
    def llm(self) -> Any:
        if self._llm is None:
            self._llm = _engine(self.model, self.engine_kwargs)
        return self._llm

    def sampling_params(self, schema: dict[str, Any]) -> Any:
        vllm = vllm_module()
        if vllm is None:
            return SimpleSamplingParams(self.max_tokens, self.temperature, schema)
        from vllm.sampling_params import StructuredOutputsParams

        return vllm.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                                   structured_outputs=StructuredOutputsParams(json=schema))

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        if not requests:
            return []
        by_schema: dict[str, Any] = {}
        params = []
        for r in requests:
            schema = decoding_schema(r, self.max_tokens)
            key = json.dumps(schema, sort_keys=True)
            if key not in by_schema:
                by_schema[key] = self.sampling_params(schema)
            params.append(by_schema[key])
        llm = self.llm
        with _CHAT_LOCKS.setdefault(id(llm), threading.Lock()):  # one batch at a time per engine
            return self._chat(llm, requests, params)

    def _chat(self, llm: Any, requests: list[LLMRequest], params: list[Any]) -> list[LLMResponse]:
        """One `chat` call; vLLM refuses a whole batch with a ValueError when one prompt does not fit
        (longer than the model's context, `_TOO_LONG`): the batch is halved until that prompt stands
        alone, and it alone is `rejected` (quarantined by the runner) while the others are answered.
        Any other error fails the batch (`LLMError`), as a configuration problem would."""
        try:
            outputs = llm.chat([list(r.messages) for r in requests], sampling_params=params, use_tqdm=False)
        except ValueError as exc:
            if not _TOO_LONG.search(str(exc)):      # a chat template, a schema, a bug: the whole run's problem
                raise LLMError(f"vllm chat failed for a batch of {len(requests)}: {exc}", backend="vllm",
                               model=self.model) from exc
            if len(requests) == 1:
                log.warning("vllm rejected a %s prompt: %s", requests[0].task, exc)
                return [LLMResponse.failure("rejected", f"vllm: {exc}")]
            half = len(requests) // 2
            return self._chat(llm, requests[:half], params[:half]) + self._chat(llm, requests[half:], params[half:])
        except Exception as exc:  # the engine failed as a whole, not one request
            raise LLMError(f"vllm chat failed for a batch of {len(requests)}: {exc}", backend="vllm",
                           model=self.model) from exc
        if len(outputs) != len(requests):
            raise LLMError(f"vllm returned {len(outputs)} outputs for {len(requests)} prompts", backend="vllm")
        return [self._response(r, out) for r, out in zip(requests, outputs)]

    def _response(self, request: LLMRequest, out: Any) -> LLMResponse:
        tokens_in = len(out.prompt_token_ids or [])
        if not out.outputs:
            return LLMResponse(text=None, tokens_in=tokens_in)
        first = out.outputs[0]
        cut = getattr(first, "finish_reason", None) == "length"
        if cut:
            log.warning("vllm: %s answer cut at max_tokens=%d", request.task, self.max_tokens)
        return LLMResponse(text=first.text, tokens_in=tokens_in, tokens_out=len(first.token_ids or []), truncated=cut)

    def close(self) -> None:
        self._llm = None  # the engine stays cached for the process; drop `_ENGINES` to free the GPU
