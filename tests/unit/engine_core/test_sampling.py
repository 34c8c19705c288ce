from __future__ import annotations

import pytest
import torch

from laps_agent.engine.model.sampling import SamplingError, SamplingParams, StopState, sample_tokens


def chars(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def feed(state: StopState, text: str) -> str:
    released = ""
    for ch in text:
        released += state.add(ord(ch))
        if state.finished:
            break
    return released


@pytest.mark.parametrize("raw,needle", [
    ({"temperature": -0.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_tokens": 1.5}, "max_new_tokens"),
    ({"top_k": -3}, "top_k"), ({"stop": [""]}, "stop"), ({"seed": "x"}, "seed"),
    ({"temperature": "hot"}, "sampling_params"),
])
def test_bad_parameters_are_rejected_with_a_message(raw, needle):
    with pytest.raises(SamplingError, match=needle):
        SamplingParams.from_dict(raw)


def test_max_tokens_is_an_alias_and_top_k_zero_means_off():
    p = SamplingParams.from_dict({"max_tokens": 7, "top_k": 0, "stop": "END"})
    assert p.max_new_tokens == 7 and p.top_k == -1 and p.stop == ("END",)


def test_greedy_and_top_k_one_pick_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 1.0]])
    greedy = SamplingParams(temperature=0.0)
    topk1 = SamplingParams(temperature=1.5, top_k=1)
    assert sample_tokens(logits, [greedy, topk1], [0, 0]) == [1, 0]


def test_seeded_sampling_depends_only_on_seed_and_step():
    logits = torch.zeros(1, 50)
    p = SamplingParams(temperature=1.0, seed=42)
    runs = [[sample_tokens(logits, [p], [step])[0] for step in range(20)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # still random across steps
    other = [sample_tokens(logits, [SamplingParams(temperature=1.0, seed=43)], [s])[0] for s in range(20)]
    assert other != runs[0]


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.9, 0.05, 0.03, 0.02]]))
    p = SamplingParams(temperature=1.0, top_p=0.5, seed=1)
    assert {sample_tokens(logits, [p], [s])[0] for s in range(30)} == {0}


def test_top_k_limits_the_candidates():
    logits = torch.tensor([[4.0, 3.9, 3.8, -1.0, -1.0]])
    p = SamplingParams(temperature=2.0, top_k=2, seed=5)
    assert {sample_tokens(logits, [p], [s])[0] for s in range(60)} == {0, 1}


def test_stop_string_is_removed_and_never_streamed():
    state = StopState(SamplingParams(stop=("END",)), frozenset(), chars)
    released = feed(state, "hello ENDworld")
    assert state.finished and state.finish_reason == "stop" and state.matched_stop == "END"
    assert released == "hello " and state.text == "hello "


def test_partial_stop_prefix_is_held_back_then_released():
    state = StopState(SamplingParams(stop=("STOP",), max_new_tokens=6), frozenset(), chars)
    assert feed(state, "abST") == "ab"  # "ST" might start "STOP"
    assert state.add(ord("x")) == "STx"
    assert state.add(ord("y")) == "y" and state.finish_reason == "length"


def test_stop_token_ids_and_eos_end_without_text():
    state = StopState(SamplingParams(stop_token_ids=frozenset({ord("#")})), frozenset({ord("$")}), chars)
    assert feed(state, "ab#cd") == "ab" and state.matched_stop == ord("#")
    eos = StopState(SamplingParams(), frozenset({ord("$")}), chars)
    assert feed(eos, "ab$cd") == "ab" and eos.finish_reason == "stop"
    ignoring = StopState(SamplingParams(ignore_eos=True, max_new_tokens=4), frozenset({ord("$")}), chars)
    assert feed(ignoring, "ab$cdef") == "ab$c" and ignoring.finish_reason == "length"


@pytest.mark.parametrize("text", ["hello world, this is a test", "héllo wörld — ünïcode ✓ 東京 🙂 done"])
def test_streamed_text_equals_the_decoded_text(tiny_loaded, text):
    tok = tiny_loaded.tokenizer
    ids = tok.encode(text)
    state = StopState(SamplingParams(max_new_tokens=len(ids) + 1), frozenset(), tok.decode)
    streamed = "".join(state.add(t) for t in ids)
    assert streamed == tok.decode(ids)
    assert "\ufffd" not in streamed


def sentencepiece_decode():
    """The decoder Llama 2 and Mistral ship in tokenizer.json (▁ for a space, stripped once at
    the start of a text), over a word vocabulary."""
    from tokenizers import Tokenizer, decoders, models

    words = ["<unk>", "<s>", "</s>", "▁The", "▁capital", "▁of", "▁France", "▁is", "▁Paris", ".", "▁It"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


def test_the_first_token_keeps_its_space_after_the_prompt():
    """SGLang and vLLM answer "The capital of France is" with " Paris. It is": the output is
    decoded after the prompt's last tokens. Decoded alone, a SentencePiece decoder strips the
    first token's space and prompt and completion ran together ("isParis")."""
    decode = sentencepiece_decode()
    prompt, output = [1, 3, 4, 5, 6, 7], [8, 9, 10, 7]
    state = StopState(SamplingParams(max_new_tokens=4), frozenset({2}), decode, context=prompt)
    deltas = [state.add(t) for t in output]
    assert deltas == [" Paris", ".", " It", " is"] and state.finish_reason == "length"
    assert decode(prompt) + "".join(deltas) == decode(prompt + output)
    # A stop string may begin with that space.
    stopped = StopState(SamplingParams(stop=(" Paris",)), frozenset({2}), decode, context=prompt)
    assert stopped.add(8) == "" and stopped.finish_reason == "stop"


def test_a_prompt_ending_inside_a_character_is_no_context():
    # One token a byte. The prompt's last byte begins "é" (C3 A9) and the output's first ends
    # it: the output decodes alone, as a lone continuation byte (U+FFFD), as it did before.
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    state = StopState(SamplingParams(max_new_tokens=2), frozenset(), decode, context=list(b"caf\xc3"))
    assert state.add(0xA9) + state.add(ord("!")) == "\ufffd!"
    whole = StopState(SamplingParams(max_new_tokens=3), frozenset(), decode, context=list(b"caf"))
    assert "".join(whole.add(b) for b in "é!".encode()) == "é!"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_sampling_works_on_cuda_logits():
    """A seeded request's generator lives on the logits' device (a CPU generator cannot drive
    multinomial over CUDA logits, which used to fail the whole batch)."""
    logits = torch.randn(3, 500, device="cuda")
    params = [SamplingParams(temperature=0.9, seed=7), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.9, top_p=0.8, top_k=50, seed=7)]
    first = sample_tokens(logits, params, [0, 0, 0])
    assert first == sample_tokens(logits, params, [0, 0, 0])  # seeded: reproducible
    assert first[1] == int(logits[1].argmax())


# Byte-level tokens, decoded as a byte-level BPE tokenizer does (an unfinished or invalid UTF-8
# sequence becomes U+FFFD): 1 "a", 2 " " + the lead byte of 本, 3 the rest of 本, 4 a lead byte
# (0xC4) that no continuation byte follows here.
BYTE_TOKENS = {1: b"a", 2: b" \xe6", 3: b"\x9c\xac", 4: b"\xc4"}


def byte_decode(ids: list[int]) -> str:
    return b"".join(BYTE_TOKENS[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("ids,eos", [([1, 2], False), ([1, 2], True), ([1, 4, 4], False), ([1, 4, 4], True)])
def test_text_pending_a_utf8_continuation_is_not_lost_at_the_end(ids, eos):
    """An answer that ends (length or EOS) inside a character, or on bytes that never form one,
    keeps them as decoded (U+FFFD), as SGLang answers and decode(output_ids) reads: they were
    dropped, so the text silently lacked what the counted tokens said."""
    state = StopState(SamplingParams(max_new_tokens=len(ids) + (1 if eos else 0)), frozenset({9}), byte_decode)
    released = "".join(state.add(t) for t in ids + ([9] if eos else []))
    assert state.finished and state.finish_reason == ("stop" if eos else "length")
    assert released == state.text == byte_decode(ids)


def test_a_character_completed_later_is_released_whole():
    state = StopState(SamplingParams(max_new_tokens=3), frozenset(), byte_decode)
    assert [state.add(t) for t in (1, 2, 3)] == ["a", "", " 本"]


def test_a_stop_string_in_the_text_released_at_the_end_still_stops():
    """The pending bytes may carry whole characters (" " + a lead byte): released at the end,
    they are searched for stop strings like any other text."""
    state = StopState(SamplingParams(stop=(" ",)), frozenset({9}), byte_decode)
    released = "".join(state.add(t) for t in (1, 2, 9))
    assert released == state.text == "a" and state.finish_reason == "stop" and state.matched_stop == " "


def test_a_run_of_bytes_that_never_form_a_character_keeps_the_window_small():
    """A model stuck on bytes that never complete (a degenerate or badly sampled one) kept every
    one of them pending: each step decoded the whole run again, O(n^2) on the engine thread
    (1.6 s for 4095 tokens of the tiny model), and all of it was dropped at the end."""
    widths = []

    def decode(ids: list[int]) -> str:
        widths.append(len(ids))
        return byte_decode(ids)

    n = 2000
    state = StopState(SamplingParams(max_new_tokens=n), frozenset(), decode)
    released = "".join(state.add(4) for _ in range(n))
    assert released == "\ufffd" * n and state.finish_reason == "length"
    assert max(widths) <= 16


def test_a_character_split_over_many_tokens_is_not_broken_by_the_window_bound():
    """Bytes that do complete a character are never released before it completes, however many
    tokens they take (here one byte per token, after a long run of stray lead bytes)."""
    tokens = {**BYTE_TOKENS, 5: b"\xf0", 6: b"\x9f", 7: b"\x99", 8: b"\x82"}  # 🙂 in four tokens
    decode = lambda ids: b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
    ids = [4] * 10 + [5, 6, 7, 8, 1]
    state = StopState(SamplingParams(max_new_tokens=len(ids)), frozenset(), decode)
    released = [state.add(t) for t in ids]
    assert "".join(released) == decode(ids) == "\ufffd" * 10 + "🙂a"
