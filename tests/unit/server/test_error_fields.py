"""error_fields.message_field: the message item vLLM refused item by item ("N validation errors for
ValidatorIterator", locations starting at the item), found by validating the body's messages again with vLLM's own
message type."""

from __future__ import annotations

import pytest

from service.server.openai_compat.error_fields import message_field, unnamed_field

REFUSAL = "7 validation errors for ValidatorIterator"
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "messages,field",
    [
        # a Responses-API part in a chat user message: vLLM's parser map has the type, the user role's schema not
        ([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "messages[0].content[0].type"),
        ([USER, {"role": "user", "content": [{"type": "output_text", "text": "hi"}]}], "messages[1].content[0].type"),
        ([USER, {"role": "assistant", "content": "a", "tool_calls": [{"id": 1}]}], "messages[1].tool_calls[0].id"),
        # /v1/chat/completions/batch: a list of conversations
        (
            [[USER], [USER, {"role": "user", "content": [{"type": "input_text", "text": "x"}]}]],
            "messages[1][1].content[0].type",
        ),
        # nothing refused item by item: the field stays unnamed rather than guessed
        ([USER], None),
        ([{"role": "wizard", "content": "x"}], None),
    ],
)
def test_the_refused_item_is_named(messages, field):
    assert message_field(REFUSAL, {"messages": messages}) == field


def test_other_refusals_and_bodies_are_left_alone():
    bad_part = {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    assert message_field("The decoder prompt cannot be empty", bad_part) is None
    assert message_field(REFUSAL, {"prompt": "hi"}) is None
    assert message_field(REFUSAL, None) is None
    assert message_field(REFUSAL, {"messages": "hi"}) is None


def test_the_message_words_come_first_then_the_constraint_then_the_items():
    body = {"messages": [USER], "structured_outputs": {"regex": "a("}}
    assert unnamed_field("top_k must be 0 (disable), or at least 1, got -5.", body) == "top_k"
    assert unnamed_field("Failed to transform regex into a grammar: bad", body) == "structured_outputs.regex"
    assert unnamed_field("Something else", body) is None
