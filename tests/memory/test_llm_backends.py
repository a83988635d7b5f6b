"""The `openai` backend against a real OpenAI-compatible HTTP server on loopback (scripted per test),
through `LLMRunner` where retries and quarantine matter; the `vllm` backend against a fake `LLM`."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, AsyncIterator, Callable, ContextManager, Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from memory.errors import ConfigError, LLMError, LLMTransientError, OptionalDependencyError
from memory.llm.base import LLMRequest
from memory.llm.openai_backend import OpenAIBackend
from memory.llm.runner import LLMRunner
from memory.llm.structured import decoding_schema
from memory.llm.vllm_backend import VLLMBackend, vllm_module

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
    "additionalProperties": False,
}
OTHER_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


LLAMACPP_REJECTION = ("1 validation error for CreateChatCompletionRequest\nresponse_format.type\n  Input "
                      "should be 'text' or 'json_object' [type=literal_error, input_value='json_schema']")


def _request(text: str, schema: dict[str, Any] = SCHEMA, task: str = "extract") -> LLMRequest:
    return LLMRequest(task=task, prompt_version="test-v1",
                      messages=[{"role": "system", "content": "Answer in JSON."},
                                {"role": "user", "content": text}],
                      schema=schema)


# -- a scripted OpenAI-compatible server ---------------------------------------------------------
@dataclass
class Script:
    """What the server does with each next request: a queue of actions, then `default`."""

    actions: deque[str] = field(default_factory=deque)
    default: str = "valid"
    by_text: dict[str, str] = field(default_factory=dict)  # user message -> action, every time
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    llamacpp: bool = False  # reject what llama-cpp-python's server rejects, the way it does
    strict: bool = False    # refuse what OpenAI's strict structured outputs refuse, the way it does
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, body: dict[str, Any]) -> str:
        with self.lock:
            self.bodies.append(body)
            user = body["messages"][1]["content"]
            if user in self.by_text:
                return self.by_text[user]
            return self.actions.popleft() if self.actions else self.default


def _completion(body: dict[str, Any], content: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def strict_problem(node: Any, where: tuple[str, ...] = ()) -> str | None:
    """What OpenAI's strict mode says of a schema object that leaves a property optional or allows others."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            if missing := [k for k in props if k not in node.get("required", [])]:
                return (f"In context={where}, 'required' is required to be supplied and to be an array including "
                        f"every key in properties. Missing '{missing[0]}'.")
            if node.get("additionalProperties") is not False:
                return f"In context={where}, 'additionalProperties' is required to be supplied and to be false."
        for k, v in node.items():
            if (found := strict_problem(v, where + (k,))) is not None:
                return found
    if isinstance(node, list):
        return next((f for i, v in enumerate(node) if (f := strict_problem(v, where + (str(i),))) is not None), None)
    return None


#: a reason answer as a strict-mode model gives it: the optional supersede fields present, null
INSIGHT_WITH_NULLS = json.dumps({"extended_insight": [
    {"inference_type": "extension", "key": "job", "date": "2024-03-01", "value": "works in Berlin",
     "supersedes": None, "superseded_by": None}]})


def _app(state: dict[str, Script]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        script = state["script"]
        body = await request.json()
        action = script.next(body)
        if script.llamacpp and body.get("response_format", {}).get("type") != "json_object":
            # llama-cpp-python 0.3.16: pydantic rejects the body, its error handler answers HTTP 500
            return JSONResponse({"error": {"message": LLAMACPP_REJECTION, "type": "internal_server_error",
                                           "param": None, "code": None}}, status_code=500)
        if script.strict and (problem := strict_problem(body["response_format"]["json_schema"]["schema"])):
            name = body["response_format"]["json_schema"]["name"]
            return JSONResponse({"error": {"message": f"Invalid schema for response_format '{name}': {problem}",
                                           "type": "invalid_request_error", "param": "response_format",
                                           "code": None}}, status_code=400)
        with script.lock:
            script.in_flight += 1
            script.max_in_flight = max(script.max_in_flight, script.in_flight)
        try:
            if action == "slow":
                await asyncio.sleep(0.05)
            if action == "hang":
                await asyncio.sleep(1.5)
            if action == "429":
                return JSONResponse({"error": {"message": "slow down", "type": "rate_limit"}}, status_code=429,
                                    headers={"retry-after": "0", "retry-after-ms": "10"})
            if action == "text":       # a proxy's page with status 200
                return PlainTextResponse("upstream busy, try later")
            if action == "cut":        # a 200 body cut short
                return Response('{"id": "chatcmpl-test", "choi', media_type="application/json")
            if action == "drip":       # one byte every 0.1 s: each read is quick, the whole answer is not
                async def drip() -> AsyncIterator[bytes]:
                    for ch in json.dumps(_completion(body, json.dumps({"answer": "late"}))).encode():
                        await asyncio.sleep(0.1)
                        yield bytes([ch])
                return StreamingResponse(drip(), media_type="application/json")
            if action in ("500", "401", "400"):
                # x-should-retry: the SDK's own retry loop would obey it even on a 4xx; ours never does
                return JSONResponse({"error": {"message": f"scripted {action}"}}, status_code=int(action),
                                    headers={"retry-after-ms": "10", "x-should-retry": "true"})
            user = body["messages"][1]["content"]
            content = {"malformed": '{"answer": "unfinished', "length": '{"answer": "cut at the li',
                       "wrong": '{"answer": ""}', "insight": INSIGHT_WITH_NULLS}.get(action, json.dumps({"answer": user}))
            return JSONResponse(_completion(body, content, "length" if action == "length" else "stop"))
        finally:
            with script.lock:
                script.in_flight -= 1

    return app


@pytest.fixture(scope="module")
def server(serve_app: Callable[..., ContextManager[str]]) -> Iterator[tuple[str, dict[str, Script]]]:
    state = {"script": Script()}
    with serve_app(_app(state), access_log=False, timeout_graceful_shutdown=1) as base:
        yield f"{base}/v1", state


@pytest.fixture
def script(server: tuple[str, dict[str, Script]]) -> Script:
    server[1]["script"] = Script()
    return server[1]["script"]


def _backend(server: tuple[str, dict[str, Script]], **kw: Any) -> OpenAIBackend:
    opts: dict[str, Any] = dict(model="test-model", base_url=server[0], concurrency=4, timeout_s=5.0,
                                max_retries=2)
    opts.update(kw)
    return OpenAIBackend(**opts)


# -- openai ----------------------------------------------------------------------------------------
def test_valid_answers_in_order_with_tokens(server: Any, script: Script) -> None:
    script.default = "slow"
    backend = _backend(server)
    requests = [_request(f"q{i}") for i in range(6)]
    responses = backend.complete(requests)
    assert [json.loads(r.text)["answer"] for r in responses] == [f"q{i}" for i in range(6)]
    assert all(r.error is None and r.tokens_in == 11 and r.tokens_out == 7 for r in responses)


def test_request_carries_model_and_json_schema(server: Any, script: Script) -> None:
    _backend(server, max_tokens=123, temperature=0.0).complete([_request("hello", task="reason")])
    (body,) = script.bodies
    assert body["model"] == "test-model"
    assert body["messages"][1] == {"role": "user", "content": "hello"}
    bounded = decoding_schema(_request("hello", task="reason"), 123)  # the schema, bounded to fit 123 tokens
    assert bounded["properties"]["answer"]["maxLength"] == 200
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "reason", "schema": bounded, "strict": True}}
    assert body["max_completion_tokens"] == 123 and body["temperature"] == 0.0


def test_a_strict_server_takes_every_schema_and_nulls_stand_for_absent(server: Any, script: Script) -> None:
    """OpenAI's strict mode refuses a schema with an optional property (the reason prompt's
    supersedes / superseded_by) or one allowing others: every schema goes out with all properties
    required, the optional ones nullable; a null answered for one is read as the property left out,
    and the answer validates against the prompt's own schema."""
    from memory.prompts.premem import REASON_SCHEMA

    assert strict_problem(REASON_SCHEMA) is not None and strict_problem(OTHER_SCHEMA) is not None
    script.strict, script.default = True, "insight"
    runner = LLMRunner(_backend(server))
    answers, bad = runner.run([_request("reason over F1, F2", REASON_SCHEMA, task="reason")])
    assert bad == [] and runner.stats.calls == 1
    (insight,) = answers[0]["extended_insight"]
    assert insight == {"inference_type": "extension", "key": "job", "date": "2024-03-01", "value": "works in Berlin"}
    sent = script.bodies[0]["response_format"]["json_schema"]["schema"]
    item = sent["properties"]["extended_insight"]["items"]
    assert item["properties"]["supersedes"]["anyOf"][1] == {"type": "null"} and "supersedes" in item["required"]


def test_the_dialect_is_negotiated_once_per_server(server: Any, script: Script) -> None:
    """llama.cpp rejects `json_schema` with a 500: the first request is sent again as `json_object` with
    `max_tokens` (llama.cpp ignores `max_completion_tokens`), never retried as if the 500 were passing,
    and every later request of the backend goes out in that dialect at once."""
    script.llamacpp = True
    backend = _backend(server, max_tokens=77)
    responses = backend.complete([_request(f"q{i}") for i in range(4)])
    assert [json.loads(r.text)["answer"] for r in responses] == ["q0", "q1", "q2", "q3"]
    assert backend.dialect is not None and backend.dialect.name == "llama.cpp"
    first, *rest = script.bodies
    assert first["response_format"]["type"] == "json_schema" and len(rest) == 4
    bounded = decoding_schema(_request("q0"), 77)
    assert all(b["response_format"] == {"type": "json_object", "schema": bounded} and b["max_tokens"] == 77
               and "max_completion_tokens" not in b for b in rest)
    script.bodies.clear()
    backend.complete([_request("again")])
    assert [b["response_format"]["type"] for b in script.bodies] == ["json_object"]


def test_a_validation_error_is_permanent_even_as_a_500() -> None:
    import httpx
    import openai

    from memory.llm.openai_backend import classify, is_dialect_rejection

    def status_error(code: int, message: str) -> openai.APIStatusError:
        req = httpx.Request("POST", "http://x/v1/chat/completions")
        body = {"message": message}
        return openai.APIStatusError(message, response=httpx.Response(code, json={"error": body}, request=req),
                                     body=body)

    rejection = status_error(500, LLAMACPP_REJECTION)
    assert classify(rejection) == "rejected" and is_dialect_rejection(rejection)
    assert classify(status_error(500, "llama_decode returned -1")) == "transient"
    assert not is_dialect_rejection(status_error(400, "Requested tokens (5000) exceed context window of 4096"))
    assert is_dialect_rejection(status_error(400, "Unsupported parameter: 'max_completion_tokens'"))


def test_concurrency_bound_is_respected(server: Any, script: Script) -> None:
    script.default = "slow"
    responses = _backend(server, concurrency=3).complete([_request(f"q{i}") for i in range(12)])
    assert all(r.error is None for r in responses)
    assert len(script.bodies) == 12
    assert script.max_in_flight == 3


@pytest.mark.parametrize("status", ["429", "500"])
def test_transient_status_is_retried_by_the_backend(server: Any, script: Script, status: str) -> None:
    script.actions.extend([status])
    (resp,) = _backend(server).complete([_request("again")])
    assert resp.error is None and json.loads(resp.text) == {"answer": "again"}
    assert len(script.bodies) == 2


def test_retries_stop_at_max_retries_and_the_sdk_adds_none(server: Any, script: Script) -> None:
    script.default = "500"
    (resp,) = _backend(server, max_retries=2).complete([_request("down")])
    assert resp.text is None and resp.error_kind == "transient" and "500" in resp.error
    assert len(script.bodies) == 3  # one call + max_retries retries, nothing from the SDK on top
    script.bodies.clear()
    (resp,) = _backend(server, max_retries=0).complete([_request("down")])
    assert resp.error_kind == "transient" and len(script.bodies) == 1


def test_retry_policy_is_named_and_honours_retry_after() -> None:
    import httpx
    import openai

    from memory.llm.openai_backend import MAX_RETRY_DELAY_S, is_retryable, retry_delay

    def status_error(code: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
        req = httpx.Request("POST", "http://x/v1/chat/completions")
        return openai.APIStatusError("scripted", response=httpx.Response(code, headers=headers, request=req),
                                     body=None)

    assert all(is_retryable(status_error(c)) for c in (408, 409, 429, 500, 502, 503))
    assert not any(is_retryable(status_error(c, {"x-should-retry": "true"})) for c in (400, 401, 403, 404, 422))
    assert is_retryable(openai.APITimeoutError(request=httpx.Request("POST", "http://x")))
    assert retry_delay(0, status_error(429, {"retry-after-ms": "250"})) == 0.25
    assert retry_delay(0, status_error(429, {"retry-after": "2"})) == 2.0
    assert 0.375 <= retry_delay(0, status_error(500)) <= 0.5
    assert 0.75 * MAX_RETRY_DELAY_S <= retry_delay(10, status_error(429, {"retry-after": "3600"})) <= MAX_RETRY_DELAY_S


def test_auth_and_bad_request_are_not_retried(server: Any, script: Script) -> None:
    script.actions.extend(["401", "400"])
    r401, r400 = _backend(server, concurrency=1).complete([_request("a"), _request("b")])
    assert r401.text is None and r401.error_kind == "fatal" and "401" in r401.error
    assert r400.text is None and r400.error_kind == "rejected" and "400" in r400.error
    assert len(script.bodies) == 2


def test_malformed_then_valid_through_runner(server: Any, script: Script) -> None:
    script.actions.extend(["malformed"])
    runner = LLMRunner(_backend(server))
    answers, bad = runner.run([_request("fix me")])
    assert answers == [{"answer": "fix me"}] and bad == []
    assert runner.stats.calls == 2 and runner.stats.retries == 1 and runner.stats.tokens_in == 22
    reask = script.bodies[1]["messages"]
    assert len(reask) == 3 and reask[-1]["role"] == "user" and "not valid JSON" in reask[-1]["content"]


def test_an_answer_cut_at_the_token_limit_says_so(server: Any, script: Script) -> None:
    script.by_text["long"] = "length"
    cut, whole = _backend(server).complete([_request("long"), _request("short")])
    assert cut.truncated and cut.text == '{"answer": "cut at the li' and not whole.truncated


def test_malformed_twice_is_quarantined_with_raw_text(server: Any, script: Script) -> None:
    script.actions.extend(["malformed", "wrong"])
    runner = LLMRunner(_backend(server))
    answers, bad = runner.run([_request("hopeless")])
    assert answers == [None]
    (q,) = bad
    assert q.raw == '{"answer": ""}' and "schema violation" in q.reason
    assert q.request.messages[-1]["content"] == "hopeless"  # the original request, not the re-ask
    assert runner.stats.quarantined == 1 and runner.stats.calls == 2


@pytest.mark.parametrize("action", ["text", "cut"])
def test_a_200_that_is_not_a_chat_completion_is_retried_then_transient(server: Any, script: Script,
                                                                       action: str) -> None:
    script.actions.extend([action])
    (resp,) = _backend(server).complete([_request("second time")])
    assert resp.error is None and json.loads(resp.text) == {"answer": "second time"}
    script.default = action
    (resp,) = _backend(server, max_retries=1).complete([_request("never")])
    assert resp.error_kind == "transient" and "MalformedBodyError" in resp.error


def test_a_trickling_answer_ends_at_the_deadline(server: Any, script: Script) -> None:
    """httpx's timeout bounds each read; the call as a whole ends at 2 x timeout_s."""
    script.default = "drip"
    start = time.monotonic()
    (resp,) = _backend(server, timeout_s=0.3, max_retries=0).complete([_request("drip")])
    assert resp.error_kind == "transient" and "DeadlineError" in resp.error
    assert time.monotonic() - start < 3


def test_timeout_ends_in_transient_error_from_runner(server: Any, script: Script) -> None:
    script.by_text["slow one"] = "hang"
    backend = _backend(server, timeout_s=0.3, max_retries=1)
    runner = LLMRunner(backend)
    start = time.monotonic()
    with pytest.raises(LLMTransientError) as err:
        runner.run([_request("slow one"), _request("fine")])
    assert time.monotonic() - start < 5
    assert err.value.failed == 1 and "APITimeoutError" in str(err.value)
    assert len(script.bodies) == 3  # the hanging one twice (one backend retry), the other once


def test_auth_failure_is_not_transient(server: Any, script: Script) -> None:
    script.default = "401"
    with pytest.raises(LLMError) as err:
        LLMRunner(_backend(server)).run([_request("a")])
    assert not isinstance(err.value, LLMTransientError)


def test_works_from_worker_threads(server: Any, script: Script) -> None:
    backend = _backend(server)
    results: dict[int, list[Any]] = {}

    def work(n: int) -> None:
        results[n] = backend.complete([_request(f"t{n}-{i}") for i in range(3)])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(json.loads(r.text)["answer"] == f"t{n}-{i}" for n in range(3) for i, r in enumerate(results[n]))


def test_model_is_required() -> None:
    with pytest.raises(ConfigError, match="model"):
        OpenAIBackend(model="")


# -- vllm ------------------------------------------------------------------------------------------
class FakeLLM:
    """Speaks `vllm.LLM.chat`'s signature and returns RequestOutput-shaped objects."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def chat(self, messages: Any, sampling_params: Any = None, use_tqdm: bool = True,
             chat_template: str | None = None, **kwargs: Any) -> list[Any]:
        self.calls.append({"messages": messages, "sampling_params": sampling_params, "use_tqdm": use_tqdm})
        outs = []
        for conv in messages:
            text = json.dumps({"answer": conv[-1]["content"]})
            cut = conv[-1]["content"] == "long"              # cut at max_tokens
            outs.append(SimpleNamespace(prompt_token_ids=list(range(5)),
                                        outputs=[SimpleNamespace(text=text[:9] if cut else text, token_ids=[1, 2, 3],
                                                                 finish_reason="length" if cut else "stop")]))
        return outs


def _schema_of(params: Any) -> dict[str, Any]:
    return params.json_schema if hasattr(params, "json_schema") else params.structured_outputs.json


def test_vllm_one_chat_call_per_batch_with_params_per_schema() -> None:
    fake = FakeLLM()
    backend = VLLMBackend(model="m", max_tokens=512, temperature=0.0, llm=fake)
    requests = [_request("a"), _request("b", schema=OTHER_SCHEMA), _request("c")]
    responses = backend.complete(requests)
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call["use_tqdm"] is False and len(call["messages"]) == 3
    params = call["sampling_params"]
    assert isinstance(params, list) and len(params) == 3
    assert all(p.max_tokens == 512 and p.temperature == 0.0 for p in params)
    assert [_schema_of(p) for p in params] == [decoding_schema(r, 512) for r in requests]
    assert params[0] is params[2]
    assert [json.loads(r.text)["answer"] for r in responses] == ["a", "b", "c"]
    assert all(r.tokens_in == 5 and r.tokens_out == 3 and not r.truncated for r in responses)
    cut, = backend.complete([_request("long")])
    assert cut.truncated and cut.text == '{"answer"'


class ContextLimitedLLM(FakeLLM):
    """vLLM refuses a whole batch when one prompt is longer than the model's context."""

    def chat(self, messages: Any, sampling_params: Any = None, use_tqdm: bool = True,
             chat_template: str | None = None, **kwargs: Any) -> list[Any]:
        if any(len(conv[-1]["content"]) > 20 for conv in messages):
            self.calls.append({"messages": messages, "refused": True})
            raise ValueError("The decoder prompt (length 9000) is longer than the maximum model length of 8192.")
        return super().chat(messages, sampling_params, use_tqdm, chat_template, **kwargs)


def test_vllm_one_overlong_prompt_is_rejected_alone() -> None:
    fake = ContextLimitedLLM()
    texts = ["a", "b", "c", "x" * 40, "d", "e"]
    answers, bad = LLMRunner(VLLMBackend(model="m", llm=fake)).run([_request(t) for t in texts])
    assert answers == [{"answer": t} if len(t) < 20 else None for t in texts]
    assert len(bad) == 1 and bad[0].raw is None and "maximum model length" in bad[0].reason
    assert bad[0].request.messages[-1]["content"] == "x" * 40
    assert len(fake.calls) <= 2 * 3 + 1               # halved down to the one prompt: logarithmic, not one per prompt
    with pytest.raises(LLMError, match="rejected all"):          # every prompt too long: a configuration problem
        LLMRunner(VLLMBackend(model="m", llm=ContextLimitedLLM())).run([_request("y" * 30), _request("z" * 30)])


class NoTemplateLLM(FakeLLM):
    def chat(self, messages: Any, sampling_params: Any = None, use_tqdm: bool = True,
             chat_template: str | None = None, **kwargs: Any) -> list[Any]:
        self.calls.append({"messages": messages})
        raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")


@pytest.mark.parametrize("n", [1, 6])
def test_vllm_another_value_error_fails_the_batch_not_a_prompt(n: int) -> None:
    """Only the context-length refusal is halved down to one prompt: any other ValueError (no chat
    template, a schema vLLM cannot compile) is the run's problem, even for a batch of one."""
    fake = NoTemplateLLM()
    with pytest.raises(LLMError, match="chat_template is not set"):
        LLMRunner(VLLMBackend(model="m", llm=fake)).run([_request(str(i)) for i in range(n)])
    assert len(fake.calls) == 1

def test_vllm_through_runner_caches_nothing_without_cache() -> None:
    fake = FakeLLM()
    answers, bad = LLMRunner(VLLMBackend(model="m", llm=fake)).run([_request("x"), _request("y")])
    assert answers == [{"answer": "x"}, {"answer": "y"}] and bad == [] and len(fake.calls) == 1


@pytest.mark.skipif(vllm_module() is not None, reason="vllm is installed")
def test_vllm_missing_is_an_optional_dependency_error() -> None:
    with pytest.raises(OptionalDependencyError, match="vllm"):
        VLLMBackend(model="some/model")


def test_the_decoding_schema_fits_the_token_limit_and_stays_within_the_original() -> None:
    """A small model repeating items must close its JSON before max_tokens: arrays and free strings are
    bounded for decoding only; what validates against the bounded schema validates against the original."""
    import jsonschema

    from memory import prompts
    from memory.llm.structured import CHARS_PER_TOKEN, decoding_schema, portable_pattern

    request = prompts.extract_request({"user_id": "u", "session_id": "s", "participants": ["Ann"], "messages": [
        {"message_id": "m1", "speaker": "Ann", "text": "I bought a bike.", "ts": "2024-03-02T10:00:00"}]})
    small, large = decoding_schema(request, 192), decoding_schema(request, 2048)
    item = small["properties"]["Factual_Information"]
    assert item["maxItems"] == 1 and item["items"]["properties"]["value"]["maxLength"] == 24
    assert large["properties"]["Factual_Information"]["maxItems"] >= 6
    assert request.schema["properties"]["Factual_Information"].get("maxItems") is None  # the original is untouched
    answer = {k: [{"subject": "Ann", "key": "bike", "value": "bought a bike", "message_id": "m1",
                   "date": "2024-03-02"}] for k in prompts.CATEGORY_KEYS}
    assert len(json.dumps(answer)) <= 192 * CHARS_PER_TOKEN
    for schema in (small, large, request.schema):
        jsonschema.validate(answer, schema)
    assert item["items"]["properties"]["message_id"] == {"type": "string", "enum": ["m1"]}  # cites what it saw
    unbounded = decoding_schema(dataclasses.replace(request, context={}))
    assert unbounded == json.loads(json.dumps(request.schema).replace("\\\\d", "[0-9]"))
    assert portable_pattern(r"^(?:Add\(\)|Merge\([0-2],\s*\S[\s\S]*\))$") == \
        '^(Add\\(\\)|Merge\\([0-2], *[^ "\\\\][^"\\\\]*\\))$'
