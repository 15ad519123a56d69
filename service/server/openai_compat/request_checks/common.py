"""What every API's checks share: the problem found, a lone surrogate anywhere, scalar types, sampling ranges
and JSON schemas."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
from jsonschema.protocols import Validator
from jsonschema.validators import Draft202012Validator, validator_for

from service.server.openai_compat.scalar_fields import wrong_type

# A JSON "\ud800" escape decodes to half of a UTF-16 pair, which no UTF-8 text can hold.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# How a lone surrogate reaches a parsed body (json.loads decodes bytes with "surrogatepass"): the escape \udXXX, its
# UTF-8 bytes ED A0-BF, or a UTF-16/32 body (JSON starts with ASCII, so those hold a NUL byte). A whole pair matches
# too; only the walk tells them apart.
# One pattern each: an alternation would cost the regex engine its literal-prefix scan (0.18 ms for 36 KB, not 0.02).
SURROGATE_BYTES = (re.compile(rb"\\u[dD][89a-fA-F]"), re.compile(rb"\xed[\xa0-\xbf]"), re.compile(rb"\x00"))


LOGIT_BIAS_RANGE = (-100.0, 100.0)


PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's, for presence_penalty and frequency_penalty


@dataclass(frozen=True)
class RequestProblem:
    message: str
    param: str  # the offending field, e.g. "messages[2].role"


def check_lone_surrogate(body: Mapping[str, Any]) -> RequestProblem | None:
    for where, text in strings_of(body):
        found = LONE_SURROGATE.search(text)
        if found is not None:
            return RequestProblem(
                f"{where} is not valid Unicode text: it holds a lone surrogate \\u{ord(found.group()):04x} (half of a "
                "UTF-16 pair)",
                where,
            )
    return None


def strings_of(body: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, string) of every string in a JSON body, keys included (a key's path is its object's). Walked with a
    stack, not recursion: a body nested as deep as the JSON parser allows must not overflow Python's stack."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            yield where or "body", value
        elif isinstance(value, Mapping):
            for key, item in value.items():
                yield where or "body", key
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):  # numbers (a prompt's token ids) are not pushed: they hold no text
            stack.extend(
                (f"{where}[{i}]", item)
                for i, item in enumerate(value)
                if item is not None and not isinstance(item, int | float)
            )


def check_scalar_type(path: str, body: Mapping[str, Any]) -> RequestProblem | None:
    wrong = wrong_type(path, body)
    return None if wrong is None else RequestProblem(*wrong)


def check_top_logprobs(top: Any) -> RequestProblem | None:
    """OpenAI's range starts at 0; vLLM reads -1 as "the whole vocabulary" and refuses it naming logprobs."""
    if isinstance(top, int) and not isinstance(top, bool) and top < 0:
        return RequestProblem(f"top_logprobs must be between 0 and 20, got {top}", "top_logprobs")
    return None


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_sampling_ranges(body: Mapping[str, Any]) -> RequestProblem | None:
    low, high = PENALTY_RANGE
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if is_number(value) and not low <= value <= high:
            return RequestProblem(f"{name} must be between {low:g} and {high:g}, got {value}", name)
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n < 1:
        return RequestProblem(f"n must be at least 1, got {n}", "n")
    # vLLM keeps the last k tokens of the prompt: 0 keeps none ("The decoder prompt cannot be empty", no param).
    if is_number(truncate := body.get("truncate_prompt_tokens")) and truncate == 0:
        return RequestProblem(
            "truncate_prompt_tokens must be -1 (the model's context) or at least 1 (the prompt's last tokens kept), "
            "got 0",
            "truncate_prompt_tokens",
        )
    return None


def check_best_of(body: Mapping[str, Any]) -> RequestProblem | None:
    """OpenAI's best_of generates that many completions and returns the n best; the engine cannot rank them, so
    only best_of == n (every completion returned) is served."""
    best_of, n = body.get("best_of"), body.get("n")
    n = 1 if n is None else n
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (best_of, n)):
        return None  # absent, or a type vLLM's schema names
    if best_of < n:
        return RequestProblem(f"best_of must be at least n: best_of={best_of}, n={n}", "best_of")
    if best_of > n:
        return RequestProblem(
            f"best_of={best_of} above n={n} is not supported: the engine does not rank completions; ask for "
            f"n={best_of} and pick, or leave best_of out",
            "best_of",
        )
    return None


def check_logit_bias(body: Mapping[str, Any]) -> RequestProblem | None:
    bias = body.get("logit_bias")
    if not isinstance(bias, Mapping):
        return None
    low, high = LOGIT_BIAS_RANGE
    for token, value in bias.items():
        if is_number(value) and not low <= value <= high:
            return RequestProblem(
                f"logit_bias[{token}] = {value} is out of range: biases go from {low:g} to {high:g}",
                f"logit_bias[{token}]",
            )
    return None


def schema_problem(schema: Any, param: str) -> RequestProblem | None:
    if not isinstance(schema, Mapping):
        return None  # vLLM's own validation names the field
    if not isinstance(schema.get("$schema", ""), str):
        return RequestProblem(f"{param} is not a valid JSON Schema: $schema must be a URI string", param)
    meta = meta_schema_check(validator_for(schema, default=Draft202012Validator))  # also for an unknown $schema
    error = next(meta.iter_errors(schema), None) if meta is not None else None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.instance_path)
    return RequestProblem(
        f"{param} is not a valid JSON Schema: {error.message}" + (f" (at {where})" if where else ""), param
    )


@functools.cache
def meta_schema_check(draft: type[Validator]) -> jsonschema_rs.Validator | None:
    """jsonschema-rs's check against a draft's meta-schema, compiled once. python-jsonschema (which still says which
    draft a schema declares, without fetching anything) took 5 ms per 20-property schema, on the event loop: 265 ms
    for a request with 50 tools. None for draft 3, which jsonschema-rs does not have: such a schema is left to vLLM's
    grammar compiler."""
    try:
        return jsonschema_rs.validator_for(draft.META_SCHEMA)
    except jsonschema_rs.ValidationError:
        return None
