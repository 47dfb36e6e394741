"""What a client may send: the OpenAI request bodies of ``/v1/completions`` and
``/v1/chat/completions``, checked field by field before anything reaches the engine.

Types and ranges are the OpenAI API's (the ``openai`` SDK's ``completion_create_params``
and ``chat/completion_create_params``); a field the server cannot honour with anything
but its default (``n`` > 1, ``logprobs``, ``tools``, penalties, ...) is refused rather than
silently ignored. Fields this server does not know are ignored, as vLLM's server does, so
that clients written for other OpenAI-compatible servers keep working. Every refusal is an
:class:`InvalidRequest` whose :meth:`~InvalidRequest.body` is the OpenAI error body,
naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: OpenAI's limits (API reference): sampling temperature, nucleus mass, stop sequences.
MAX_TEMPERATURE = 2.0
MAX_STOP_SEQUENCES = 4
#: ``seed`` is a signed 64-bit integer in the API.
SEED_RANGE = (-(2**63), 2**63 - 1)
#: What this server generates when the client names no ``max_tokens`` (the completions API's default).
DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class InvalidRequest(Exception):
    """A request the server refuses; carries the HTTP status and the OpenAI error fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Sampling:
    """How to generate, as the engine and the response writer need it."""

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class Prompt:
    """What to generate from: text to tokenize, or token ids the client tokenized itself."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class CompletionRequest:
    chat: bool
    model: str | None
    prompt: Prompt
    sampling: Sampling

    @property
    def prompt_param(self) -> str:
        """The field a too-long prompt is blamed on."""
        return "messages" if self.chat else "prompt"


# ----------------------------------------------------------------------------- field readers
#: How OpenAI's errors name a JSON value's type (bool before int: a JSON true is a Python int too).
_KIND_NAMES = ((bool, "a boolean"), (int, "an integer"), (float, "a decimal"), (str, "a string"),
               (list, "an array"), (dict, "an object"))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _KIND_NAMES if isinstance(value, kind)), "an object")


def _wrong_type(name: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"Invalid type for '{name}': expected {expected}, but got {_kind(value)} instead.",
                          name, "invalid_type")


def _in_range(name: str, value: float, low: float, high: float, kind: str) -> None:
    if not value >= low:  # written so that NaN fails too
        raise InvalidRequest(f"Invalid '{name}': {kind} below minimum value. Expected a value >= {low:g}, "
                             f"but got {value!r} instead.", name, f"{kind}_below_min_value")
    if not value <= high:
        raise InvalidRequest(f"Invalid '{name}': {kind} above maximum value. Expected a value <= {high:g}, "
                             f"but got {value!r} instead.", name, f"{kind}_above_max_value")


def _number(body: Mapping[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(name, "a decimal", value)
    _in_range(name, float(value), low, high, "decimal")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(name, "an integer", value)
    _in_range(name, value, low, high, "integer")
    return value


def _boolean(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _wrong_type(name, "a boolean", value)
    return value


def _string(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _wrong_type(name, "a string", value)
    return value


def _unsupported(name: str, value: Any, supported: str) -> InvalidRequest:
    return InvalidRequest(f"Unsupported value: '{name}' is {value!r}; this server supports only {supported}.",
                          name, "unsupported_value")


# ----------------------------------------------------------------------------- the shared fields
def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _wrong_type("stop", "a string or an array of strings", value)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"Invalid 'stop': array too long. Expected at most {MAX_STOP_SEQUENCES} "
                             f"sequences, but got {len(stops)} instead.", "stop", "array_above_max_length")
    return tuple(s for s in stops if s)


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                             "stream_options", "invalid_value")
    if not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    return _boolean(options, "include_usage")


def _defaults_only(body: Mapping[str, Any], checks: Mapping[str, tuple[Callable[[Any], bool], str]]) -> None:
    """Fields the server accepts only at their default: anything else is refused, not ignored."""
    for name, (is_default, supported) in checks.items():
        value = body.get(name)
        if value is not None and not is_default(value):
            raise _unsupported(name, value, supported)


def _zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _sampling(body: Mapping[str, Any], max_tokens_fields: tuple[str, ...]) -> Sampling:
    _string(body, "model")
    _string(body, "user")
    for name in ("frequency_penalty", "presence_penalty"):
        _number(body, name, -2.0, 2.0, 0.0)
    n = _integer(body, "n", 1, 128)
    if n not in (None, 1):
        raise _unsupported("n", n, "1 (one choice per request)")
    if body.get("logit_bias") is not None and not isinstance(body["logit_bias"], dict):
        raise _wrong_type("logit_bias", "an object", body["logit_bias"])
    _defaults_only(body, {"frequency_penalty": (_zero, "0"), "presence_penalty": (_zero, "0"),
                          "logit_bias": (lambda v: v == {}, "an empty map")})
    max_tokens = None
    for name in max_tokens_fields:  # the first one set wins (chat: max_completion_tokens over max_tokens)
        value = _integer(body, name, 1, 2**63 - 1)
        max_tokens = value if max_tokens is None else max_tokens
    stream = _boolean(body, "stream")
    return Sampling(max_tokens=max_tokens,
                    temperature=_number(body, "temperature", 0.0, MAX_TEMPERATURE, 1.0),
                    top_p=_number(body, "top_p", 0.0, 1.0, 1.0),
                    seed=_integer(body, "seed", *SEED_RANGE),
                    stop=_stop(body), stream=stream, include_usage=_stream_options(body, stream))


# ----------------------------------------------------------------------------- completions
def _token_ids(name: str, value: list[Any]) -> tuple[int, ...]:
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _wrong_type(name, "an array of integers (token ids)", value)
    return tuple(value)


def _completion_prompt(body: Mapping[str, Any]) -> Prompt:
    if "prompt" not in body or body["prompt"] is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    value = body["prompt"]
    if isinstance(value, list) and value and all(isinstance(p, str | list) for p in value):
        if len(value) != 1:  # several prompts are several choices: the same as n > 1
            raise _unsupported("prompt", f"an array of {len(value)} prompts", "one prompt per request")
        value = value[0]
    if isinstance(value, str):
        prompt = Prompt(text=value)
    elif isinstance(value, list):
        prompt = Prompt(token_ids=_token_ids("prompt", value))
    else:
        raise _wrong_type("prompt", "a string, an array of strings or an array of token ids", value)
    if not (prompt.text or prompt.token_ids):
        raise InvalidRequest("Invalid 'prompt': empty. Expected a non-empty prompt.", "prompt", "empty_array")
    return prompt


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    """A ``/v1/completions`` body, checked; raises :class:`InvalidRequest` naming the first bad field."""
    prompt = _completion_prompt(body)
    if body.get("suffix") is not None:
        _string(body, "suffix")
    _integer(body, "best_of", 1, 20)
    _integer(body, "logprobs", 0, 5)
    _boolean(body, "echo")
    _defaults_only(body, {"best_of": (lambda v: v == 1, "1"), "echo": (lambda v: v is False, "false"),
                          "logprobs": (lambda v: False, "null (no log probabilities)"),
                          "suffix": (lambda v: v == "", "no suffix")})
    return CompletionRequest(False, body.get("model"), prompt, _sampling(body, ("max_tokens",)))


# ----------------------------------------------------------------------------- chat
def _content_text(index: int, content: Any) -> str:
    """A message's text: a string, or an array of text parts (any other part is refused)."""
    name = f"messages[{index}].content"
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _wrong_type(name, "a string or an array of content parts", content)
    texts = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _wrong_type(name, "an array of content parts (objects with a 'type')", content)
        if part["type"] != "text":
            raise _unsupported(f"{name}.type", part["type"], "'text' parts (this model reads text only)")
        if not isinstance(part.get("text"), str):
            raise _wrong_type(f"{name}.text", "a string", part.get("text"))
        texts.append(part["text"])
    return "".join(texts)


def chat_prompt(body: Mapping[str, Any]) -> str:
    """The messages rendered as this model's prompt (it has no chat template of its own)."""
    if "messages" not in body or body["messages"] is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array", messages)
    if not messages:
        raise InvalidRequest("Invalid 'messages': empty array. Expected an array with minimum length 1, "
                             "but got an empty array instead.", "messages", "empty_array")
    lines = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _wrong_type(f"messages[{index}]", "an object", message)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequest(f"Invalid value for 'messages[{index}].role': {role!r}. Supported values are: "
                                 f"{', '.join(sorted(CHAT_ROLES))}.", f"messages[{index}].role", "invalid_value")
        lines.append(f"{role}: {_content_text(index, message.get('content'))}\n")
    return "".join(lines) + "assistant:"


def parse_chat(body: Mapping[str, Any]) -> CompletionRequest:
    """A ``/v1/chat/completions`` body, checked; raises :class:`InvalidRequest` naming the first bad field."""
    prompt = Prompt(text=chat_prompt(body))
    _boolean(body, "logprobs")
    _integer(body, "top_logprobs", 0, 20)
    if body.get("tools") is not None and not isinstance(body["tools"], list):
        raise _wrong_type("tools", "an array", body["tools"])
    if body.get("response_format") is not None and not isinstance(body["response_format"], dict):
        raise _wrong_type("response_format", "an object", body["response_format"])
    _defaults_only(body, {
        "logprobs": (lambda v: v is False, "false"),
        "top_logprobs": (lambda v: False, "null (no log probabilities)"),
        "tools": (lambda v: v == [], "no tools"), "functions": (lambda v: v == [], "no functions"),
        "tool_choice": (lambda v: v in ("none", "auto"), "'none' or 'auto' (no tools)"),
        "function_call": (lambda v: v in ("none", "auto"), "'none' or 'auto'"),
        "response_format": (lambda v: v.get("type") == "text", "{'type': 'text'}"),
    })
    return CompletionRequest(True, body.get("model"), prompt,
                             _sampling(body, ("max_completion_tokens", "max_tokens")))


def context_length_exceeded(request: CompletionRequest, prompt_tokens: int, max_tokens: int,
                            context: int) -> InvalidRequest:
    """OpenAI's answer to a prompt plus completion longer than the model's context."""
    return InvalidRequest(
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {request.prompt_param}, {max_tokens} in the "
        f"completion). Please reduce the length of the {request.prompt_param} or completion.",
        request.prompt_param, "context_length_exceeded")
