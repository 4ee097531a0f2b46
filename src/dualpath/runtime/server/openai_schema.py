"""OpenAI request bodies (strict pydantic models) and OpenAI-style error responses (HTTP 400
with `{"error": {"message", "type", "param", "code"}}` naming the offending field)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from dualpath.runtime.api import MAX_CHOICES, MAX_TOP_LOGPROBS

# OpenAI parameters we do not implement: accepted only with a neutral value, else a 400
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "tools": (None, []), "functions": (None, []), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "response_format": (None, {"type": "text"}),
}

# ---- request bodies ----------------------------------------------------------------------------


def _stop_list(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and any(s == "" for s in value):
        raise ValueError("stop strings must not be empty")
    return value


def _message_text(value: Any) -> Any:
    """OpenAI content: a string or a list of text parts (joined)."""
    if not isinstance(value, list):
        return value
    if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value):
        raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
    return "".join(p["text"] for p in value)


def _one_prompt(value: Any) -> Any:
    """A string or a list of token ids; a list holding one of those is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(type(t) is int and t >= 0 for t in value):
        return value
    raise ValueError("prompt must be one string or one list of non-negative token ids")


# What the validators above accept, for /openapi.json (the fields' Python types are what they return)
_TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_STOP_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1},
                          {"type": "array", "items": {"type": "string", "minLength": 1}}, {"type": "null"}]}
_PROMPT_SCHEMA = {"anyOf": [{"type": "string"}, _TOKEN_IDS_SCHEMA,
                            {"type": "array", "items": {"anyOf": [{"type": "string"}, _TOKEN_IDS_SCHEMA]},
                             "minItems": 1, "maxItems": 1}]}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, BeforeValidator(_message_text)]


class _GenerationBody(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)  # the engines' messages carry a signed 64-bit int
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: Annotated[list[str] | None, BeforeValidator(_stop_list), WithJsonSchema(_STOP_SCHEMA)] = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)  # choices from one prefill, sharing its KV blocks
    # vLLM extensions; trace replay sets min_tokens = max_tokens to force exactly that many tokens
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    # vLLM's: the prompt's cached blocks are keyed under it (core/blocks.py: salted_root), so only
    # requests with the same salt share them
    cache_salt: str | None = Field(None, min_length=1)
    # vLLM's: the prompt's token ids and each choice's generated ones in the response
    return_token_ids: bool | None = None


class ChatCompletionBody(_GenerationBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)  # OpenAI's newer name for max_tokens
    # each sampled token's logprob, and the top_logprobs most likely tokens' (server/logprobs.py)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionBody(_GenerationBody):
    prompt: Annotated[str | list[int], BeforeValidator(_one_prompt), WithJsonSchema(_PROMPT_SCHEMA)]
    # each sampled token's logprob and the `logprobs` most likely tokens' (OpenAI allows 5, vLLM 20)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


# ---- errors ------------------------------------------------------------------------------------


class RequestError(Exception):
    """A client mistake found after parsing: answered with `status` and an OpenAI error body."""

    def __init__(self, message: str, param: str | None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   kind: str = "invalid_request_error") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """FastAPI's error location ("body", "messages", 0, "role") as OpenAI writes it: messages.[0].role."""
    parts = [f"[{p}]" if isinstance(p, int) else str(p) for p in loc[1:]]
    return ".".join(parts) or None


def _validation_response(exc: RequestValidationError, content_type: str) -> JSONResponse:
    error = exc.errors()[0]
    param = _param_of(tuple(error.get("loc", ())))
    if error.get("type") == "json_invalid":
        return error_response(400, f"the request body is not valid JSON: {error.get('msg')}", None, "invalid_json")
    if param is None:
        if error.get("type") == "missing":
            return error_response(400, "the request body is empty: send a JSON object", None, "missing_body")
        if not content_type.startswith("application/json"):
            return error_response(400, "send the body as JSON, with 'Content-Type: application/json'", None,
                                  "invalid_content_type")
        return error_response(400, "the request body must be a JSON object", None, "invalid_body")
    cause = (error.get("ctx") or {}).get("error")
    detail = str(cause) if isinstance(cause, Exception) else error.get("msg", "invalid value")
    return error_response(400, f"{param}: {detail}", param, error.get("type"))


