"""Fast paths added for throughput must agree with the slow paths they shortcut.

* The backend simulator reads a gap-free SendMessages reply, as the broker
  renders it, with one regex; anything else with lxml (column-wise XPaths,
  or per element when there is a ``Gap``). Every reading must move the stream
  cursors alike.
* The relay codec (orjson when installed) writes the standard module's text.
* The backend simulator builds its envelope with one f-string per message
  unless poison marks are set; the bytes are what build_envelope writes.
* The broker and the simulators pick uvloop when it is installed and leave
  asyncio's loop otherwise; either way the policy yields a working loop.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from lxml import etree

from broker_contracts import relay
from broker_contracts.soap import BUNDLE_MAX_BYTES, BUNDLE_MAX_MESSAGES, AcceptStatus
from broker_service import soap_codec
from broker_service.__main__ import use_fastest_event_loop
from broker_simulators import target_rules
from broker_simulators.backend import BackendSettings, BackendSimulator, _plain_results, build_envelope

ACCEPTED, DUPLICATE, GAP = AcceptStatus.ACCEPTED, AcceptStatus.DUPLICATE, AcceptStatus.GAP


def simulator() -> BackendSimulator:
    sim = BackendSimulator(BackendSettings(broker_urls=["http://u"], streams=3, messages_per_stream=50))
    for source in sim.sources:
        source.next_to_send = 7  # where the lane stood after building the bundle
    return sim


def take(sim: BackendSimulator, results: list[soap_codec.AcceptResult], reply: bytes | None = None) -> bool:
    reply = reply or soap_codec.render_send_messages(3, results)
    generations = {source.name: source.generation for source in sim.sources}
    return sim._take_reply(
        reply, status=200, sent=len(results), elapsed=0.01, generations=generations, url="u"
    )


def test_regex_column_wise_and_per_element_readings_agree() -> None:
    a, b, c = (f"orders-{i:04d}" for i in range(3))
    results: list[soap_codec.AcceptResult] = [
        (a, 1, DUPLICATE, None), (a, 2, ACCEPTED, None), (b, 4, ACCEPTED, None),
        (a, 3, ACCEPTED, None), (b, 5, ACCEPTED, None),
    ]  # fmt: skip
    reply = soap_codec.render_send_messages(3, results)
    assert _plain_results(reply) is not None  # the broker's own rendering takes the regex
    # The same reply with other prefixes is still a valid SOAP reply; it takes the lxml path.
    prefixed = reply.replace(b"tns:", b"b:").replace(b"xmlns:tns=", b"xmlns:b=")
    assert _plain_results(prefixed) is None
    fast, column, slow = simulator(), simulator(), simulator()
    assert take(fast, results)
    assert take(column, results, prefixed)
    root = etree.fromstring(soap_codec.render_send_messages(3, results))
    slow._apply_results(
        root.findall(".//{http://broker.failover.dev/soap/v1}result"),
        {source.name: source.generation for source in slow.sources},
    )
    expected = [(a, 4), (b, 6), (c, 7)]
    for sim in (fast, column, slow):
        assert [(s.name, s.next_to_send) for s in sim.sources] == expected
        assert (sim.accepted, sim.duplicates) == (4, 1)


def test_a_gap_takes_the_per_element_reading_and_rewinds_the_stream() -> None:
    a, b = "orders-0000", "orders-0001"
    sim = simulator()
    results: list[soap_codec.AcceptResult] = [(a, 1, ACCEPTED, None), (b, 9, GAP, 5), (b, 10, GAP, 5)]
    assert _plain_results(soap_codec.render_send_messages(3, results)) is None
    assert take(sim, results)
    assert (sim.by_name[a].next_to_send, sim.by_name[b].next_to_send, sim.gaps) == (2, 5, 2)


def test_a_fault_reply_is_not_taken() -> None:
    sim = simulator()
    fault = soap_codec.SoapFaultError(soap_codec.FaultCode.BROKER_INACTIVE, "inactive", client=False)
    reply = soap_codec.render_fault(fault)
    assert not sim._take_reply(reply, status=500, sent=1, elapsed=0.0, generations={}, url="u")
    assert not sim._take_reply(b"<not xml", status=200, sent=1, elapsed=0.0, generations={}, url="u")
    assert sim.faults == {"BROKER_INACTIVE": 1, "unparseable-reply": 1}
    assert all(type(key) is str for key in sim.faults)  # orjson needs plain str keys in /sim/status


@pytest.mark.parametrize("install", [use_fastest_event_loop, target_rules.use_fastest_event_loop])
def test_the_chosen_event_loop_runs(install: object) -> None:
    try:
        assert callable(install)
        install()
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(asyncio.sleep(0, result=42)) == 42
        finally:
            loop.close()
        pytest.importorskip("uvloop")
        assert type(asyncio.get_event_loop_policy()).__module__.startswith("uvloop")
    finally:
        asyncio.set_event_loop_policy(None)


def test_the_relay_codec_writes_what_the_standard_json_module_writes() -> None:
    # The journal and the relay may be written by either codec and read by the other.
    lxml_key = etree.fromstring("<a>s-\u00e9</a>").xpath("string(/a)")  # a str subclass, as lxml returns
    body = {
        "messages": [("s-\u00e9", 1, 'm"1\\', "p\u2028\x1f\x7f/</x>\U0001f600"), ("s", 2**62, "", "")],
        "streams": {lxml_key: 3, "plain": 4},
        "reasons": {},
    }
    assert relay.dumps(body) == relay._stdlib_dumps(body)
    assert relay.loads(relay.dumps(body)) == json.loads(relay._stdlib_dumps(body))
    with pytest.raises(ValueError):
        relay.loads(b"{not json")


def test_rendered_result_heads_are_escaped_cached_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soap_codec, "_RESULT_HEADS", {})
    monkeypatch.setattr(soap_codec, "_RESULT_HEADS_MAX", 2)
    for name in ("a&b", "c", "d<", "a&b"):
        reply = soap_codec.render_send_messages(1, [(name, 1, ACCEPTED, None), (name, 3, GAP, 2)])
        streams = etree.fromstring(reply).findall(".//{http://broker.failover.dev/soap/v1}stream")
        assert [element.text for element in streams] == [name, name]
        assert len(soap_codec._RESULT_HEADS) <= 2


@pytest.mark.parametrize("poison", [[], [("orders-0001", 2, 1)]])
def test_the_backend_builds_the_same_envelope_on_its_fast_path(
    poison: list[tuple[str, int, int | None]],
) -> None:
    sim = BackendSimulator(
        BackendSettings(
            broker_urls=["http://u"], streams=3, payload_bytes=80, per_stream_in_bundle=2, poison=poison
        )
    )
    picked = sim._bundle_for(sim.sources, 0)
    messages = [
        (source.name, seq, f"{source.name}-{seq}", sim.payload(source.name, seq))
        for source, first, take in picked
        for seq in range(first, first + take)
    ]
    body, count = sim._bundle_body(picked)
    assert (body, count) == (build_envelope("acme", "1000", messages), 6)
    parsed = soap_codec.parse_request(body)
    assert isinstance(parsed, soap_codec.SendMessagesRequest) and parsed.seqs == [1, 2, 1, 2, 1, 2]


@pytest.mark.parametrize(("payload_bytes", "bundle_size"), [(20_000, 100), (100, 5_000)])
def test_the_backend_never_builds_a_bundle_past_the_contracts_bounds(
    payload_bytes: int, bundle_size: int
) -> None:
    """Large payloads or a large --bundle-size make smaller bundles, not bundles the broker refuses."""
    sim = BackendSimulator(
        BackendSettings(
            broker_urls=["http://u"],
            streams=2,
            messages_per_stream=10_000,
            bundle_size=bundle_size,
            per_stream_in_bundle=10_000,
            payload_bytes=payload_bytes,
        )
    )
    body, count = sim._bundle_body(sim._bundle_for(sim.sources, 0))
    assert 1 < count <= BUNDLE_MAX_MESSAGES
    assert len(body) <= BUNDLE_MAX_BYTES
