"""The OpenAI wire format, as pure functions: request bodies -> ``Call`` fields, ``Answer``
-> response bodies and SSE chunks, errors in OpenAI's shape.

Requests are checked by hand rather than by a strict model: real clients send fields we
do not use (``user``, ``metadata``, ``parallel_tool_calls``...), which must pass, while a
bad value of a field we do use is a 400 naming that ``param``.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from .modes import Answer, Choice, ModeError, Sampling
from .tools import ToolParser


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _bad(param: str, message: str) -> ModeError:
    return ModeError(400, f"{param}: {message}", code="invalid_value", param=param)


def parse_sampling(body: dict, kind: str) -> Sampling:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _bad("max_tokens", "must be a positive integer")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise _bad("stop", "must be a string or a list of up to 4 non-empty strings")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 2):
        raise _bad("temperature", "must be a number between 0 and 2")
    top_p = body.get("top_p")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 <= top_p <= 1):
        raise _bad("top_p", "must be a number between 0 and 1")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise _bad("n", "must be an integer between 1 and 128")
    logprobs = body.get("logprobs")
    if kind == "chat":
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("logprobs", "must be a boolean")
    elif logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise _bad("logprobs", "must be an integer between 0 and 5")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad("seed", "must be an integer")
    want_logprobs = bool(logprobs) if kind == "chat" else logprobs is not None
    return Sampling(max_tokens=max_tokens, stop=tuple(stop), temperature=temperature, top_p=top_p,
                    n=n, logprobs=want_logprobs, seed=seed)


def parse_request(body: Any, kind: str) -> dict:
    """The ``Call`` fields of a request body (all but caller and index); ``ModeError`` 400."""
    if not isinstance(body, dict):
        raise ModeError(400, "the body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "must be a non-empty string")
    fields: dict[str, Any] = {"kind": kind, "model": model, "sampling": parse_sampling(body, kind), "request": body}
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise _bad("messages", "must be a non-empty list of objects with a role")
        fields["messages"] = messages
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list) or not all(
                    isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
                    and isinstance(t["function"].get("name"), str) for t in tools):
                raise _bad("tools", "must be a list of {type: function, function: {name, ...}}")
            fields["tools"] = tools
        choice = body.get("tool_choice")
        if choice is not None and choice not in ("none", "auto", "required") and not (
                isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str)):
            raise _bad("tool_choice", "must be none, auto, required or {type: function, function: {name}}")
        fields["tool_choice"] = choice
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("prompt", "must be a string (or a list of one string)")
        fields["prompt"] = prompt
    return fields


def finish(choice: Choice, tools: list | None, tool_choice: Any, parser: ToolParser) -> tuple[str | None, list[dict], str]:
    """A choice's (content, tool_calls, finish_reason) as the caller sees them."""
    if choice.tool_calls is not None:
        content, calls = choice.text, list(choice.tool_calls)
    elif tools and tool_choice != "none":
        content, calls = parser(choice.text)
    else:
        content, calls = choice.text, []
    reason = "tool_calls" if calls and choice.finish_reason == "stop" else choice.finish_reason
    return content, calls, reason


def _chat_logprobs(choice: Choice) -> dict | None:
    if choice.logprobs is None:
        return None
    tokens = choice.tokens or [""] * len(choice.logprobs)
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, choice.logprobs)]}


def _completion_logprobs(choice: Choice) -> dict | None:
    if choice.logprobs is None:
        return None
    tokens = choice.tokens or [""] * len(choice.logprobs)
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": choice.logprobs, "top_logprobs": None, "text_offset": offsets}


def usage(answer: Answer) -> dict:
    prompt = len(answer.prompt_ids or ())
    completion = sum(len(c.completion_ids or ()) for c in answer.choices)
    if answer.response and isinstance(answer.response.get("usage"), dict):
        return answer.response["usage"]
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def response_body(kind: str, rid: str, created: int, model: str, answer: Answer, finished: list,
                  want_logprobs: bool) -> dict:
    """The non-streaming body; ``finished`` holds each choice's ``finish()``."""
    choices = []
    for i, (choice, (content, calls, reason)) in enumerate(zip(answer.choices, finished)):
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": i, "message": message, "finish_reason": reason,
                            "logprobs": _chat_logprobs(choice) if want_logprobs else None})
        else:
            choices.append({"index": i, "text": choice.text, "finish_reason": reason,
                            "logprobs": _completion_logprobs(choice) if want_logprobs else None})
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "choices": choices, "usage": usage(answer)}


def sse_event(kind: str, rid: str, created: int, model: str, choices: list, **extra) -> str:
    """One SSE ``data:`` event of a streamed answer."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def piece_events(kind: str, rid: str, created: int, model: str, piece: Choice, want_logprobs: bool,
                 *, first: bool) -> Iterator[str]:
    """The events of one piece of a choice streamed as it is generated (``Generator.stream``):
    the role first, then the piece's text; the finish comes from ``end_events``."""
    def event(choices: list) -> str:
        return sse_event(kind, rid, created, model, choices)

    if kind == "chat":
        if first:
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        if piece.text or piece.completion_ids:
            yield event([{"index": 0, "delta": {"content": piece.text}, "finish_reason": None,
                          "logprobs": _chat_logprobs(piece) if want_logprobs else None}])
    elif piece.text or piece.completion_ids:
        yield event([{"index": 0, "text": piece.text, "finish_reason": None,
                      "logprobs": _completion_logprobs(piece) if want_logprobs else None}])


def end_events(kind: str, rid: str, created: int, model: str, answer: Answer, reason: str,
               include_usage: bool) -> Iterator[str]:
    """The finish chunk of a piece-by-piece stream, its usage if asked, and ``[DONE]``."""
    delta = {"delta": {}} if kind == "chat" else {"text": ""}
    yield sse_event(kind, rid, created, model, [{"index": 0, **delta, "logprobs": None, "finish_reason": reason}])
    if include_usage:
        yield sse_event(kind, rid, created, model, [], usage=usage(answer))
    yield "data: [DONE]\n\n"


def sse_events(kind: str, rid: str, created: int, model: str, answer: Answer, finished: list,
               want_logprobs: bool, include_usage: bool) -> Iterator[str]:
    """The streamed answer as SSE ``data:`` events, ending with ``data: [DONE]``.
    Each choice comes as a role chunk, a content chunk, its tool calls and a finish chunk."""
    def event(choices: list, **extra) -> str:
        return sse_event(kind, rid, created, model, choices, **extra)

    for i, (choice, (content, calls, reason)) in enumerate(zip(answer.choices, finished)):
        if kind == "chat":
            yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
            if content:
                yield event([{"index": i, "delta": {"content": content}, "finish_reason": None,
                              "logprobs": _chat_logprobs(choice) if want_logprobs else None}])
            if calls:
                deltas = [{"index": j, **call} for j, call in enumerate(calls)]
                yield event([{"index": i, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}])
            yield event([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
        else:
            yield event([{"index": i, "text": choice.text, "finish_reason": reason,
                          "logprobs": _completion_logprobs(choice) if want_logprobs else None}])
    if include_usage:
        yield event([], usage=usage(answer))
    yield "data: [DONE]\n\n"
