"""Request fields the builtin engine does not implement, in each dialect, with the values that ask
for nothing (what clients send by default). Any other value is refused with a 400 naming the
field: an answer that silently lacks what was asked for is worse (a harness asking for logprobs
would score nothing, a penalty would not apply, `n: 2` would get one sample). Stock SGLang
behind the same gateway implements them all."""
from __future__ import annotations

from typing import Any

from laps_agent.engine.http.api_error import ApiError

# The top level of an OpenAI body (/v1/completions, /v1/chat/completions).
OPENAI_BODY: dict[str, tuple] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "logit_bias": (None, {}), "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0), "repetition_penalty": (None, 1), "min_tokens": (None, 0),
    "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"), "response_format": (None, {"type": "text"}),
    # SGLang's (and vLLM's) extensions to the OpenAI body, which clients of those servers send.
    "min_p": (None, 0), "regex": (None,), "json_schema": (None,), "ebnf": (None,),
    "skip_special_tokens": (None, True), "no_stop_trim": (None, False),
    # vLLM's (SGLang reads some of them too).
    "include_stop_str_in_output": (None, False), "guided_json": (None,), "guided_regex": (None,),
    "guided_choice": (None,), "guided_grammar": (None,), "structured_outputs": (None,),
    "prompt_logprobs": (None,), "typical_p": (None, 1), "use_beam_search": (None, False),
}

# SGLang's /generate `sampling_params` (sglang/srt/sampling/sampling_params.py). Stock SGLang
# refuses keys it does not know; these are the ones it knows and this engine does not implement.
SGLANG_SAMPLING: dict[str, tuple] = {
    "n": (None, 1), "beam_width": (None, 1), "min_p": (None, 0), "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0), "repetition_penalty": (None, 1), "min_new_tokens": (None, 0),
    "json_schema": (None,), "regex": (None,), "ebnf": (None,), "structural_tag": (None,),
    "stop_regex": (None, []), "logit_bias": (None, {}), "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True), "no_stop_trim": (None, False), "watermark": (None,),
}

# The top level of SGLang's /generate body (GenerateReqInput): outputs and inputs it cannot serve.
SGLANG_GENERATE: dict[str, tuple] = {
    "return_logprob": (None, False), "top_logprobs_num": (None, 0), "token_ids_logprob": (None,),
    "return_hidden_states": (None, False), "lora_path": (None,), "image_data": (None,),
    "video_data": (None,), "audio_data": (None,), "input_embeds": (None,),
    "custom_logit_processor": (None,),
}


def refuse_unsupported(body: dict, table: dict[str, tuple], where: str = "") -> None:
    """400 for the first field of `table` in `body` that asks for something; `where` prefixes
    its name in the message (`sampling_params.`)."""
    for key, neutral in table.items():
        if key in body and not asks_nothing(body[key], neutral):
            raise ApiError(400, f"{where}{key}={body[key]!r} is not implemented by this engine; "
                                f"leave it out, or serve the model with the SGLang backend")


def asks_nothing(value: Any, neutral: tuple) -> bool:
    for n in neutral:
        if n is None or isinstance(n, bool):
            if value is n:
                return True
        elif isinstance(n, int):   # 0 and 0.0 alike, never False/True
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == n:
                return True
        elif value == n:
            return True
    return False
