"""Chat templates in the real formats of two model families, for the tiny models of tests/support/tiny_models.py.

Condensed from the templates those models ship: the same turn markers, the same tool-call and reasoning
markup, the same instruction text where the service's policy keys on it.
"""

from __future__ import annotations

# Qwen3: ChatML turns, tools listed in <tools>, calls as <tool_call>{"name", "arguments"}</tool_call>, thinking
# in <think> ... </think> (the generation prompt closes an empty one when enable_thinking is false).
QWEN3_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" + (tool | tojson) }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": "
        "<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}
        {{- message.content or '' }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
QWEN3_SPECIAL = ["<|im_start|>", "<|im_end|>"]
# Qwen3 ships these as added tokens that are not special: they stay in the text the parsers read.
QWEN3_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Llama 3.1: header-id turns, tools in the user turn with the JSON call instruction, <|python_tag|> for
# built-in tools, ipython role for results.
LLAMA31_TEMPLATE = """\
{{- bos_token }}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}{%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\\n\\n' + system_message + '<|eot_id|>' }}
{%- if tools and messages %}
    {%- set first_user_message = messages[0].content %}{%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}
    {{- 'Given the following functions, please respond with a JSON for a function call with its proper '
        'arguments that best answers the given prompt.\\n\\n' }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        'Do not use variables.\\n\\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}
    {{- first_user_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role in ['ipython', 'tool'] %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- elif message.tool_calls %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson + '}<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""
LLAMA31_SPECIAL = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
