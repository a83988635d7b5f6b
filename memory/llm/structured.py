"""One structured-output request builder for every live backend (`openai` over HTTP, `vllm` offline).

What a real server taught us (llama-cpp-python's OpenAI-compatible server, see README "LLM backends"):
- servers speak different *dialects* of structured output: OpenAI and vLLM take
  `response_format={"type": "json_schema", "json_schema": {...}}` and `max_completion_tokens`;
  llama.cpp rejects `json_schema` (a pydantic validation error returned as HTTP 500) but takes
  `{"type": "json_object", "schema": ...}`, and silently ignores `max_completion_tokens` (an answer
  then runs on to the end of the context window), so it needs `max_tokens`;
- a validation error of the request body is permanent even when it comes back as a 5xx.
The schema the decoder is constrained by and the token limit are the same for every backend.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from memory.llm.base import LLMRequest

__all__ = ["Dialect", "DIALECTS", "chat_body", "decoding_schema", "portable_pattern", "is_validation_error",
           "names_a_dialect_field", "strict_form", "without_null_optionals"]


@dataclass(frozen=True)
class Dialect:
    """How one kind of server wants a JSON-schema-constrained chat completion asked for."""

    name: str
    response_format: Literal["json_schema", "json_object"]
    token_param: Literal["max_completion_tokens", "max_tokens"]


#: tried in this order against an unknown server; the first one it accepts is kept for that server
DIALECTS: tuple[Dialect, ...] = (
    Dialect("openai", "json_schema", "max_completion_tokens"),   # OpenAI, vLLM, SGLang
    Dialect("llama.cpp", "json_object", "max_tokens"),           # llama-cpp-python's server
)

#: request fields that differ between dialects: a rejection naming one of them is a dialect problem
_DIALECT_FIELDS = re.compile(r"response_format|json_schema|json_object|max_completion_tokens|max_tokens|strict",
                             re.IGNORECASE)
#: how pydantic / FastAPI word a request-body validation error (llama.cpp returns it as HTTP 500)
_VALIDATION = re.compile(r"validation error|Input should be|Extra inputs are not permitted|Field required",
                         re.IGNORECASE)


#: characters a token of JSON answer holds at least (English words, quotes, keys); sizes the bounds below
CHARS_PER_TOKEN = 4
#: (items per array, characters per string) tried in turn, most generous first, until the worst-case
#: answer fits the token limit
_BOUNDS = ((16, 4000), (16, 2000), (16, 1000), (16, 500), (16, 200), (12, 120), (8, 120), (8, 80), (6, 80), (4, 80), (4, 48), (2, 48), (1, 48), (1, 24))


def decoding_schema(request: LLMRequest, max_tokens: int | None = None) -> dict[str, Any]:
    """The JSON schema the decoder is constrained by: the request's own, with every `pattern` in the regex
    subset grammar converters take (`portable_pattern`: llama.cpp's converter writes `\\d` into a GBNF
    literal, the grammar fails to parse and the answer comes back unconstrained), and, given the token
    limit, arrays and strings without bounds bounded so that the longest answer the grammar allows fits
    (`_BOUNDS`): a small model repeating items forever then closes its JSON instead of being cut into an
    invalid answer; `message_id` citations are held to the ids of the messages the request shows
    (`context["messages"]`); and in the form strict servers require (`strict_form`: OpenAI refuses a
    schema with an optional property). Answers are still validated against (and cached under) the
    original schema, once an optional property answered null is dropped (`without_null_optionals`)."""
    schema = _portable(request.schema)
    shown = [m["message_id"] for m in request.context.get("messages", []) if isinstance(m, dict) and "message_id" in m]
    if shown:
        schema = _citing(schema, shown)
    if max_tokens is None:
        return strict_form(schema)
    bounded = schema
    for items, chars in _BOUNDS:
        bounded = _bounded(schema, items, chars)
        if _worst_chars(bounded) <= max_tokens * CHARS_PER_TOKEN:
            break
    return strict_form(bounded)


def strict_form(node: Any) -> Any:
    """`node` as OpenAI's strict structured outputs take it: every object lists all its properties as
    required and allows no others, a property that was optional may be null instead (`anyOf` with
    null). vLLM and llama.cpp decode the same form."""
    if isinstance(node, list):
        return [strict_form(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_form(v) if k in ("items", "anyOf") else v for k, v in node.items()}
    props = node.get("properties")
    if isinstance(props, dict):
        required = set(node.get("required", []))
        out["properties"] = {k: strict_form(v) if k in required else {"anyOf": [strict_form(v), {"type": "null"}]}
                             for k, v in props.items()}
        out["required"] = list(props)
        out["additionalProperties"] = False
    return out


def without_null_optionals(answer: Any, schema: Any) -> Any:
    """`answer` without the null values of properties `schema` does not require: how a model
    constrained by `strict_form` leaves an optional property out."""
    if isinstance(answer, list) and isinstance(schema, dict):
        return [without_null_optionals(v, schema.get("items")) for v in answer]
    if not (isinstance(answer, dict) and isinstance(schema, dict) and isinstance(schema.get("properties"), dict)):
        return answer
    props, required = schema["properties"], set(schema.get("required", []))
    return {k: without_null_optionals(v, props.get(k)) for k, v in answer.items()
            if not (v is None and k in props and k not in required)}


#: regex spellings llama.cpp's schema-to-grammar converter breaks on, and an equal or stricter spelling
#: it takes (inside a JSON string, so no quote or backslash): non-capturing groups assert in the
#: converter (HTTP 500), `\\d`, `\\s`, `\\S` become GBNF escapes that do not parse
_PORTABLE_REGEX = (("(?:", "("), ("[\\s\\S]", '[^"\\\\]'), ("\\s", " "), ("\\S", '[^ "\\\\]'),
                   ("\\d", "[0-9]"))


def portable_pattern(pattern: str) -> str:
    """`pattern` in the regex subset grammar converters take (matching the same strings or fewer)."""
    for old, new in _PORTABLE_REGEX:
        pattern = pattern.replace(old, new)
    return pattern


def _portable(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (portable_pattern(v) if k == "pattern" and isinstance(v, str) else _portable(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_portable(v) for v in node]
    return node


def _citing(node: Any, ids: list[str]) -> Any:
    """`node` with every `message_id` string property held to the ids the prompt shows: a model that
    invents a citation otherwise loses the whole item (parsers drop items citing unknown messages)."""
    if isinstance(node, list):
        return [_citing(v, ids) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _citing(v, ids) for k, v in node.items()}
    props = node.get("properties")
    if isinstance(props, dict) and isinstance(props.get("message_id"), dict) \
            and props["message_id"].get("type") == "string":
        out["properties"] = {**out["properties"], "message_id": {"type": "string", "enum": list(ids)}}
    return out


def _bounded(node: Any, items: int, chars: int) -> Any:
    """`node` with arrays held to `items` and free strings (no enum, pattern, const) to `chars`, never
    below their own minimum nor above their own maximum."""
    if isinstance(node, list):
        return [_bounded(v, items, chars) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _bounded(v, items, chars) if k in ("properties", "items", "anyOf", "oneOf", "allOf") else v
           for k, v in node.items()}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _bounded(v, items, chars) for k, v in node["properties"].items()}
    if node.get("type") == "array":
        out["maxItems"] = max(min(items, int(node.get("maxItems", items))), int(node.get("minItems", 0)))
    if node.get("type") == "string" and not {"enum", "pattern", "const"} & set(node):
        out["maxLength"] = max(min(chars, int(node.get("maxLength", chars))), int(node.get("minLength", 0)))
    return out


def _worst_chars(node: Any) -> int:
    """The longest JSON text (in characters) `node` admits, roughly; unbounded parts count 10,000."""
    if not isinstance(node, dict):
        return 16
    kind = node.get("type")
    if "enum" in node:
        return max(len(str(v)) for v in node["enum"]) + 2
    if kind == "object":
        props = node.get("properties", {})
        return 2 + sum(len(k) + 4 + _worst_chars(v) for k, v in props.items()) if props else 10_000
    if kind == "array":
        return 2 + int(node.get("maxItems", 1_000)) * (_worst_chars(node.get("items", {})) + 2)
    if kind == "string":
        return 2 + (32 if "pattern" in node and "maxLength" not in node else int(node.get("maxLength", 10_000)))
    return 16


def chat_body(request: LLMRequest, dialect: Dialect, *, max_tokens: int, temperature: float) -> dict[str, Any]:
    """Keyword arguments of one chat-completions call in `dialect` (model and client aside)."""
    schema = decoding_schema(request, max_tokens)
    if dialect.response_format == "json_schema":
        response_format: dict[str, Any] = {"type": "json_schema",
                                           "json_schema": {"name": request.task, "schema": schema, "strict": True}}
    else:
        response_format = {"type": "json_object", "schema": schema}
    return {"messages": request.messages, "response_format": response_format,
            dialect.token_param: max_tokens, "temperature": temperature}


def is_validation_error(message: str) -> bool:
    """Does a server's error message say the request body itself was invalid (permanent)?"""
    return bool(_VALIDATION.search(message))


def names_a_dialect_field(message: str) -> bool:
    """Does a rejection name a field that another dialect spells differently (worth trying the next)?"""
    return bool(_DIALECT_FIELDS.search(message))
