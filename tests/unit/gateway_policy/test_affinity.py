"""Cache-affine routing (issue 12): the pure policy, the prompt's block chain and the gateway's
record of what it sent where."""
from __future__ import annotations

import random

import pytest

from laps_agent.gateway.affinity import reported_split
from laps_agent.gateway.prefix import BLOCK_CHARS, BLOCKS_PER_TIER, PrefixRecord, prefix_chain
from laps_agent.policy.routing import AffinityBound, Endpoint, EndpointLoad, choose_route


def ep(name: str) -> Endpoint:
    return Endpoint(name, f"http://{name}:30000", name, 8998)


SHORT = [ep("s0"), ep("s1"), ep("s2")]
LONG = [ep("l0"), ep("l1"), ep("l2")]
GROUPS = {"short": SHORT, "long": LONG}
DECODE = [ep("d0")]


def chat(*contents: str) -> dict:
    roles = ["user", "assistant"]
    return {"messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]}


DEFAULT_BOUND = AffinityBound()


def route(record: PrefixRecord, body: dict, tokens: int, load=None, bound=DEFAULT_BOUND):
    chain = prefix_chain(body, "chat", tokens)
    return choose_route(tokens, 256, GROUPS, DECODE, load or {}, tiebreak=0,
                        held=lambda e: record.held(e.name, chain), bound=bound), chain


def test_later_turns_stick_to_the_pod_that_served_the_earlier_ones():
    record = PrefixRecord()
    body = chat("x " * 600)                       # turn 1: long
    first, chain = route(record, body, 1000)
    assert (first.cls, first.group, first.cached) == ("long", "long", 0)
    record.record(first.prefill.name, chain)
    # Other pods are idler than the one holding the conversation: affinity still wins.
    load = {first.prefill.name: EndpointLoad(pending_requests=2, pending_tokens=500)}
    for turn in range(2, 6):
        body = chat(*[m["content"] for m in body["messages"]], f"answer {turn} " * 5, f"question {turn}")
        d, chain = route(record, body, 1000 + 40 * turn, load)
        assert d.prefill == first.prefill
        assert d.cached > 0
        record.record(d.prefill.name, chain)


def test_a_pod_far_above_its_group_mean_loses_affinity():
    record = PrefixRecord()
    body = chat("x " * 600)
    first, chain = route(record, body, 1000)
    record.record(first.prefill.name, chain)
    bound = AffinityBound(load_factor=1.5, slack_tokens=0)
    later = chat("x " * 600, "answer", "question")
    others = {e.name: EndpointLoad(1, 500) for e in LONG if e != first.prefill}
    # Holder at 3000 pending tokens, the others at 500: mean 1333, bound 2000.
    hot = {**others, first.prefill.name: EndpointLoad(5, 3000)}
    d, _ = route(record, later, 1040, hot, bound)
    assert d.prefill != first.prefill and d.cached == 0 and d.cls == "long"
    # At 700 (mean 567, bound 850) it is busier than the others but keeps the conversation.
    warm = {**others, first.prefill.name: EndpointLoad(2, 700)}
    d, _ = route(record, later, 1040, warm, bound)
    assert d.prefill == first.prefill and d.cached > 0


def test_a_40_token_turn_of_a_1000_token_conversation_is_short_only_where_its_prefix_is_held():
    record = PrefixRecord()
    earlier = chat("x " * 600, "y " * 50)
    later = chat("x " * 600, "y " * 50, "z " * 20)
    tokens = 1040
    cold, _ = route(record, later, tokens)
    assert cold.cls == "long" and cold.cached == 0
    record.record("l1", prefix_chain(earlier, "chat", 1000))
    warm, _ = route(record, later, tokens)
    assert warm.prefill.name == "l1" and warm.cls == "short" and tokens - warm.cached <= 256
    assert not warm.fallback
    # A short-group pod holding it serves it there.
    record.forget("l1")
    record.record("s2", prefix_chain(earlier, "chat", 1000))
    there, _ = route(record, later, tokens)
    assert (there.prefill.name, there.cls, there.group) == ("s2", "short", "short")


def test_without_held_tokens_the_policy_is_the_full_length_one():
    record = PrefixRecord()
    for tokens in (10, 256, 257, 5000):
        d, _ = route(record, chat("q"), tokens)
        plain = choose_route(tokens, 256, GROUPS, DECODE, {})
        assert (d.cls, d.group, d.prefill, d.fallback) == (plain.cls, plain.group, plain.prefill, plain.fallback)


def test_the_record_is_a_bounded_lru_that_evicts_the_oldest_tails_first():
    record = PrefixRecord(blocks_per_pod=6)
    a = prefix_chain(chat("a1", "a2", "a3", "a4"), "chat", 400)
    b = prefix_chain(chat("b1", "b2", "b3"), "chat", 300)
    record.record("p", a)
    assert record.held_blocks("p", a) == 4 and record.held("p", a) == a.ends[3]
    record.record("p", b)                       # 7 blocks > 6: a's last block goes
    assert record.blocks("p") == 6 and record.evictions == 1
    assert record.held_blocks("p", a) == 3      # what is left of `a` is still a prefix of it
    assert record.held_blocks("p", b) == 3
    record.record("p", a)                       # a used again: b's tail goes now
    assert record.held_blocks("p", a) == 4 and record.held_blocks("p", b) == 2
    assert record.held("other", a) == 0



def test_many_distinct_conversations_over_restarting_pods_keep_the_record_bounded():
    from laps_agent.gateway.affinity import CacheAffinity
    from laps_agent.gateway.discovery.membership import Membership
    from laps_agent.gateway.metrics import GatewayMetrics

    record = PrefixRecord(blocks_per_pod=200)
    affinity = CacheAffinity(record, 256, GatewayMetrics())
    for generation in range(10):     # every pod restarted under a new name (a rollout), each time
        pods = [ep(f"g{generation}-p{i}") for i in range(3)]
        affinity.follow(Membership(groups={"short": pods[:1], "long": pods[1:]}, decode=DECODE))
        for conv in range(300):      # 900 blocks per pod sent, 200 remembered
            chain = prefix_chain(chat(f"conversation {generation}/{conv} " * 20, "answer", "question"),
                                 "chat", 200)
            record.record(pods[conv % 3].name, chain)
        assert record.pods() == {p.name for p in pods}
        assert [record.blocks(p.name) for p in pods] == [200, 200, 200]
        assert record.held_blocks(pods[299 % 3].name, chain) == 3   # the newest is held whole

def test_chains_share_prefixes_exactly_when_the_prompts_do():
    text = "w" * (BLOCK_CHARS * 4 + 10)
    short, longer = prefix_chain({"prompt": text}, "completion", 100), prefix_chain({"prompt": text + "more" * 200}, "completion", 300)
    assert len(short) == 4 and longer.hashes[:4] == short.hashes
    changed = prefix_chain({"prompt": "v" + text[1:]}, "completion", 100)
    assert not set(changed.hashes) & set(short.hashes)
    ids = prefix_chain({"input_ids": list(range(200))}, "generate", 200)
    assert len(ids) == 3 and ids.ends == (64, 128, 192)
    assert prefix_chain({"prompt": ["a", "b"]}, "completion", 2) is None


def test_a_long_prompt_is_few_blocks_and_what_a_pod_holds_of_it_is_known_closely():
    rng = random.Random(7)
    words = ["prefill", "decode", "cache", "token", "pod", "KV", "route", "12", "(x)", "\n  "]
    doc = " ".join(rng.choice(words) for _ in range(100_000))         # ~600 KB
    record, before = PrefixRecord(), 0
    for size in (10_000, 40_000, 160_000, 500_000):   # a prompt growing turn by turn, sent to "p"
        chain = prefix_chain({"prompt": doc[:size]}, "completion", size // 4)
        # Blocks grow with the log of the length (fixed 256-character blocks: 39 to 1953).
        assert len(chain) == {10_000: 27, 40_000: 53, 160_000: 84, 500_000: 110}[size]
        # The pod holds the earlier turn: the longer prompt finds it held, to within 1/16.
        held = record.held("p", chain)
        assert before * (1 - 1 / BLOCKS_PER_TIER) <= held <= before
        record.record("p", chain)
        before = size // 4


@pytest.mark.parametrize("body, split", [
    (b'{"usage":{"prompt_tokens":1040,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1000}}}', (1040, 1000)),
    (b'{"meta_info":{"prompt_tokens":12,"cached_tokens":0}}', (12, 0)),
    (b'{"usage":{"prompt_tokens":12}}', None),
])
def test_the_engines_reported_split_is_read_from_the_answer(body, split):
    assert reported_split(body) == split


def test_a_departed_pod_loses_its_record_and_a_relabelled_one_keeps_it():
    from laps_agent.gateway.affinity import CacheAffinity
    from laps_agent.gateway.discovery.membership import Membership
    from laps_agent.gateway.metrics import GatewayMetrics

    record = PrefixRecord()
    affinity = CacheAffinity(record, 256, GatewayMetrics())
    chain = prefix_chain(chat("x " * 600), "chat", 1000)
    for pod in ("s0", "l0", "l1"):
        record.record(pod, chain)
    affinity.follow(Membership(groups={"short": SHORT, "long": LONG}, decode=DECODE))
    assert record.pods() == {"s0", "l0", "l1"}
    # l0 leaves (scale-down, or it restarts elsewhere); s0 moves to the long group.
    affinity.follow(Membership(groups={"short": SHORT[1:], "long": [SHORT[0], *LONG[1:]]}, decode=DECODE))
    assert record.pods() == {"s0", "l1"}
    assert record.held("s0", chain) > 0 and record.held("l0", chain) == 0


def test_a_long_turn_stays_on_the_short_pod_that_holds_its_conversation():
    record = PrefixRecord()
    earlier = chat("x " * 300, "y " * 50)
    later = chat("x " * 300, "y " * 50, "z " * 400)     # a long new message: long work anywhere
    record.record("s1", prefix_chain(earlier, "chat", 450))
    d, _ = route(record, later, 950)
    # Long work, but on the pod holding 450 of its tokens, not recomputed whole on a long pod.
    assert (d.prefill.name, d.group, d.cls) == ("s1", "short", "long") and d.cached > 0
    assert not d.fallback
    # A long pod holding as much keeps it in the long group; so does holding nothing at all.
    record.record("l2", prefix_chain(earlier, "chat", 450))
    assert route(record, later, 950)[0].prefill.name == "l2"
    fresh, _ = route(PrefixRecord(), later, 950)
    assert (fresh.group, fresh.cls, fresh.cached) == ("long", "long", 0)


def test_a_shared_system_prompt_on_a_short_pod_does_not_pull_long_prompts_into_the_short_group():
    record = PrefixRecord()
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly. " * 4}
    first = {"messages": [system, {"role": "user", "content": "hi"}]}       # ~60 tokens: short
    d, chain = route(record, first, 60)
    assert d.group == "short"
    record.record(d.prefill.name, chain)
    # Other users, the same system prompt (~45 tokens), long questions: the short pod would save
    # only the system prompt, less than a short prompt's work; the long group serves them.
    for user in range(3):
        body = {"messages": [system, {"role": "user", "content": f"user {user} " + "lorem ipsum " * 300}]}
        d, chain = route(record, body, 900)
        assert (d.group, d.cls, d.fallback) == ("long", "long", False), user
        record.record(d.prefill.name, chain)


def test_at_threshold_zero_nothing_held_anywhere_sends_long_work_to_the_long_group():
    # Threshold 0 (every prompt long: `laps gateway --length-threshold 0`, `laps sim`): a margin of
    # "at least 0 more" must not make a short pod holding nothing as good a home as a long one.
    d = choose_route(900, 0, GROUPS, DECODE, {}, tiebreak=0, held=lambda e: 0, bound=AffinityBound())
    assert (d.group, d.cls, d.fallback) == ("long", "long", False)


def test_with_warmed_answers_the_previous_answer_counts_as_held_where_its_turn_was_served():
    warm, cold = PrefixRecord(answers_warmed=True), PrefixRecord()
    question = "please summarise this document: " + "lorem ipsum " * 300   # ~1000 tokens
    answer = "the document says " + "something " * 120                     # a long answer
    turn1 = chat(question)
    for record in (warm, cold):
        d, chain = route(record, turn1, 1000)
        record.record(d.prefill.name, chain)
    holder = d.prefill
    turn2 = chat(question, answer, "thanks, and in one line?")
    # The pod was warmed with the answer: only the new message is left, a short prefill there.
    warmed, _ = route(warm, turn2, 1300)
    plain, _ = route(cold, turn2, 1300)
    assert warmed.prefill == plain.prefill == holder
    assert 1300 - warmed.cached < 40 and warmed.cls == "short"
    assert 1300 - plain.cached > 256 and plain.cls == "long"
    # Only an answer right after what the pod holds counts: another pod holds nothing of it.
    other = next(e for e in LONG if e != holder)
    assert warm.held(other.name, prefix_chain(turn2, "chat", 1300)) == 0
    # A user message there (no answer in between) is not assumed held.
    two_users = {"messages": [{"role": "user", "content": question}, {"role": "user", "content": answer}]}
    chain = prefix_chain(two_users, "chat", 1300)
    assert warm.held(holder.name, chain) == chain.ends[0] < 1000
