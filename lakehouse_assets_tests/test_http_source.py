"""The HTTP source (``lakehouse serve``) on loopback with real clients: events are acknowledged
once durable, every bad request gets its 4xx and lands nothing, a retried Idempotency-Key lands
once (also across a killed server), and the pipeline commits what was posted exactly once."""

from __future__ import annotations

import gzip
import json
import random
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config
from lakehouse_assets_tests.http_server import HttpServer, request
from lakehouse_assets_tests.test_pipeline import _duckdb_rows

ORDERS_TOKEN = "orders-token-7f3a9c"
CLICKS_TOKEN = "clicks-token-51be20"
CLICKS_STREAM = {
    "name": "clicks",
    "source": {"landing": {"http": {"tokens": [CLICKS_TOKEN]}}},
    "table_identifier": "web.clicks",
    "auto_create": True,
    "schema": {"columns": [{"name": "click_id", "type": "long"}]},
}


def http_config(**http: object) -> dict:
    orders = {**ORDERS_STREAM, "source": {"landing": {"http": {"tokens": ["${env:ORDERS_HTTP_TOKEN}"]}}}}
    return {"catalog": {"type": "hadoop"}, "http": http, "streams": [orders, CLICKS_STREAM]}


@pytest.fixture
def http_home(lakehouse_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORDERS_HTTP_TOKEN", ORDERS_TOKEN)
    write_config(tmp_path, http_config(), monkeypatch)
    return lakehouse_home


@pytest.fixture
def server(http_home: Path, tmp_path: Path):
    with HttpServer(tmp_path / "serve.log") as running:
        yield running


def post(
    server: HttpServer,
    body: bytes,
    stream: str = "orders",
    token: str | None = ORDERS_TOKEN,
    client: httpx.Client | None = None,
    **headers: str,
):
    """POST ``body`` to ``stream`` with ``token`` and ``headers`` (``Idempotency_Key=`` for
    ``Idempotency-Key``), on ``client``'s connections or a new one."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    url = f"{server.url}/v1/streams/{stream}/events"
    if client is not None:
        return client.post(url, content=body, headers=named, timeout=30)
    return request("POST", url, content=body, headers=named, timeout=30)


def landed_lines(stream: str = "orders") -> list[bytes]:
    """Every line of the stream's landing files, oldest file first (no temporary file counted)."""
    directory = landing_dir(LakehousePaths.from_env(), load_config().stream(stream))
    return [
        line for landed in list_landing_files(directory) for line in (directory / landed.name).read_bytes().splitlines()
    ]


def ndjson(*events: str) -> bytes:
    return "".join(f"{event}\n" for event in events).encode()


def test_posted_events_land_as_sent_in_each_accepted_form(server):
    plain = post(server, ndjson(order_event(1), order_event(2)), Content_Type="application/x-ndjson")
    zipped = post(server, gzip.compress(ndjson(order_event(3))), Content_Encoding="gzip")
    array = post(
        server,
        json.dumps([json.loads(order_event(4)), json.loads(order_event(5))]).encode(),
        Content_Type="application/json",
    )
    empty = post(server, b"\n\n")

    assert [plain.status_code, zipped.status_code, array.status_code, empty.status_code] == [200] * 4
    assert [plain.json()["events"], zipped.json()["events"], array.json()["events"], empty.json()["events"]] == [
        2,
        1,
        2,
        0,
    ]
    assert [json.loads(line)["order_id"] for line in landed_lines()] == [1, 2, 3, 4, 5]
    assert [
        landed.name.split("-")[1:3]
        for landed in list_landing_files(landing_dir(LakehousePaths.from_env(), load_config().stream("orders")))
    ] == [["http", "2"], ["http", "1"], ["http", "2"]]


BAD_REQUESTS = [
    # (what is wrong, body, headers, status, the message names)
    ("a line that is not JSON", ndjson(order_event(1), "{oops"), {}, 400, "body line 2: not valid JSON"),
    ("a line that is not an object", ndjson(order_event(1), "[1, 2]"), {}, 400, "body line 2: expected a JSON object"),
    ("a line that is not UTF-8", ndjson(order_event(1)) + b"\xff\xfe\n", {}, 400, "body line 2: not UTF-8"),
    (
        "JSON nested too deeply",
        ndjson(order_event(1)) + b"[" * 3_000 + b"\n",
        {},
        400,
        "line 2: JSON nested too deeply",
    ),
    (
        "an array element that is not an object",
        b'[{"order_id": 1}, 7]',
        {"Content-Type": "application/json"},
        400,
        "body element 1: expected a JSON object",
    ),
    ("an array that is not JSON", b'[{"order_id": 1},', {"Content-Type": "application/json"}, 400, "not valid JSON"),
    ("a gzip body that is not gzip", ndjson(order_event(1)), {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    (
        "a truncated gzip body",
        gzip.compress(ndjson(order_event(1)))[:-12],
        {"Content-Encoding": "gzip"},
        400,
        "truncated",
    ),
    ("an unknown encoding", ndjson(order_event(1)), {"Content-Encoding": "br"}, 415, "Content-Encoding 'br'"),
    ("a body over max_request_bytes", b" " * 9_000 + ndjson(order_event(1)), {}, 413, "larger than 8192 bytes as sent"),
    (
        "a gzip bomb",
        gzip.compress(b" " * 3_000_000),
        {"Content-Encoding": "gzip"},
        413,
        "larger than 16384 bytes decompressed",
    ),
    ("an integer of 5,000 digits", b'{"order_id": 1' + b"1" * 5000 + b"}\n", {}, 400, "line 1: not valid JSON"),
    (
        "an array with an integer of 5,000 digits",
        b'[{"order_id": 1' + b"1" * 5000 + b"}]",
        {"Content-Type": "application/json"},
        400,
        "body: not valid JSON",
    ),
    ("a malformed Idempotency-Key", ndjson(order_event(1)), {"Idempotency-Key": "has space"}, 400, "Idempotency-Key"),
]


def test_each_bad_request_gets_its_4xx_naming_the_problem_and_lands_nothing(http_home, tmp_path, monkeypatch):
    write_config(tmp_path, http_config(max_request_bytes=8192, max_events_bytes=16384), monkeypatch)
    wrong = []
    with HttpServer(tmp_path / "serve.log") as running:
        for problem, body, headers, status, message in BAD_REQUESTS:
            answer = post(running, body, **{name.replace("-", "_"): value for name, value in headers.items()})
            if answer.status_code != status or message not in answer.json()["error"]:
                wrong.append(f"{problem}: {answer.status_code} {answer.text}")

    assert wrong == []
    assert landed_lines() == []


def test_tokens_are_per_stream_and_never_logged(server, tmp_path):
    body = ndjson(order_event(1))
    missing = post(server, body, token=None)
    wrong = post(server, body, token="not-a-token")
    other_stream = post(server, body, token=CLICKS_TOKEN)
    unknown = post(server, body, stream="../../etc", token=ORDERS_TOKEN)
    unknown_name = post(server, body, stream="payments", token=ORDERS_TOKEN)
    own = post(server, ndjson('{"click_id": 1}'), stream="clicks", token=CLICKS_TOKEN)

    assert [missing.status_code, wrong.status_code, other_stream.status_code] == [401, 401, 403]
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert "stream 'orders'" in other_stream.json()["error"]
    assert unknown.status_code == 404 and unknown_name.status_code == 404
    assert "no stream named 'payments'" in unknown_name.json()["error"]
    assert own.status_code == 200 and landed_lines() == [] and len(landed_lines("clicks")) == 1
    assert not list((tmp_path / "lakehouse").rglob("etc"))
    assert ORDERS_TOKEN not in (tmp_path / "serve.log").read_text()


def test_a_missing_token_variable_is_named_when_the_server_starts(http_home, monkeypatch, capsys):
    from lakehouse_assets.cli import main as cli

    monkeypatch.delenv("ORDERS_HTTP_TOKEN")

    assert cli.main(["serve"]) == 2
    assert (
        "stream 'orders': source.landing.http.tokens refers to environment variable ORDERS_HTTP_TOKEN, "
        "which is not set" in capsys.readouterr().err
    )


def test_concurrent_retries_with_one_key_land_once_and_a_restart_remembers_the_key(server, tmp_path):
    body = ndjson(*(order_event(i) for i in range(1, 51)))
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda _: post(server, body, Idempotency_Key="batch-0001"), range(32)))
    server.kill()
    with HttpServer(tmp_path / "serve-2.log") as restarted:
        after_restart = post(restarted, body, Idempotency_Key="batch-0001")
        other_body = post(restarted, ndjson(order_event(99)), Idempotency_Key="batch-0001")

    assert {answer.status_code for answer in answers} == {200}
    assert len({answer.json()["landing_file"] for answer in answers}) == 1
    assert sum(answer.headers.get("Idempotent-Replayed") != "true" for answer in answers) == 1
    assert after_restart.status_code == 200 and after_restart.headers["Idempotent-Replayed"] == "true"
    assert after_restart.json() == answers[0].json()
    assert other_body.status_code == 422 and "another body" in other_body.json()["error"]
    assert sorted(json.loads(line)["order_id"] for line in landed_lines()) == list(range(1, 51))


def test_concurrent_requests_share_landing_files(server):
    bodies = [ndjson(*(order_event(100 * request + i) for i in range(10))) for request in range(64)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda body: post(server, body), bodies))

    assert {answer.status_code for answer in answers} == {200}
    files = {answer.json()["landing_file"] for answer in answers}
    assert len(files) < len(bodies)
    assert sorted(landed_lines()) == sorted(line for body in bodies for line in body.splitlines())


@pytest.mark.parametrize("point", faults.HTTP_CRASH_POINTS)
def test_a_server_killed_while_landing_lands_all_or_nothing_and_the_retry_lands_once(point, http_home, tmp_path):
    body = ndjson(*(order_event(i) for i in range(1, 21)))
    with HttpServer(tmp_path / "serve.log", {faults.CRASH_ENV: point}) as doomed:
        with pytest.raises(httpx.TransportError):
            post(doomed, body, Idempotency_Key="k-1")
        doomed.process.wait(timeout=30)
    half_landed = landed_lines()
    with HttpServer(tmp_path / "serve-2.log") as restarted:
        retried = post(restarted, body, Idempotency_Key="k-1")

    assert half_landed in ([], body.splitlines())
    assert retried.status_code == 200 and retried.json()["events"] == 20
    assert (retried.headers.get("Idempotent-Replayed") == "true") == (point == faults.HTTP_BEFORE_ACKNOWLEDGING)
    assert sorted(landed_lines()) == sorted(body.splitlines())
    directory = landing_dir(LakehousePaths.from_env(), load_config().stream("orders"))
    assert [entry.name for entry in directory.iterdir() if entry.name.startswith(".")] == []


def test_backpressure_refuses_with_retry_after_while_the_backlog_is_over_its_bound(http_home, tmp_path, monkeypatch):
    write_config(tmp_path, http_config(max_pending_bytes=2000), monkeypatch)
    with HttpServer(tmp_path / "serve.log") as running:
        first = post(running, ndjson(*(order_event(i) for i in range(30))))
        # The backlog is measured every second.
        refused = None
        for _ in range(50):
            refused = post(running, ndjson(order_event(100)))
            if refused.status_code == 503:
                break
            threading.Event().wait(0.1)

    assert first.status_code == 200
    assert refused is not None and refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"].isdigit() and "max_pending_bytes 2000" in refused.json()["error"]


def test_health_metrics_and_openapi(server):
    post(server, ndjson(order_event(1), order_event(2)))
    post(server, b"{oops\n")

    health = request("GET", f"{server.url}/healthz").json()
    metrics = request("GET", f"{server.url}/metrics").text
    openapi = request("GET", f"{server.url}/openapi.json").json()

    assert health == {"status": "ok", "streams": ["clicks", "orders"]}
    assert 'lakehouse_http_events_accepted_total{stream="orders"} 2.0' in metrics
    assert 'lakehouse_http_requests_total{code="400",reason="invalid_event",stream="orders"} 1.0' in metrics
    assert 'lakehouse_http_ack_latency_seconds_count{stream="orders"} 1.0' in metrics
    assert "lakehouse_http_pending_landing_bytes" in metrics
    assert openapi["paths"]["/v1/streams/{stream}/events"]["post"]["parameters"][0]["schema"]["enum"] == [
        "clicks",
        "orders",
    ]


def _response(client: socket.socket) -> str:
    """One whole HTTP response read from ``client``: its head, then Content-Length bytes of body."""
    client.settimeout(30)
    received = b""
    while b"\r\n\r\n" not in received:
        received += client.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += client.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


def test_a_client_too_slow_to_send_its_body_gets_408_and_lands_nothing(http_home, tmp_path, monkeypatch):
    write_config(tmp_path, http_config(body_timeout="1s"), monkeypatch)
    body = ndjson(order_event(1))
    head = (
        f"POST /v1/streams/orders/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ORDERS_TOKEN}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with HttpServer(tmp_path / "serve.log") as running, socket.create_connection(("127.0.0.1", running.port)) as client:
        client.sendall(head + body[:5])
        answer = _response(client)

    assert answer.startswith("HTTP/1.1 408") and "not received within 1 s" in answer, answer
    assert landed_lines() == []


def test_curl_as_the_readme_shows_it(server, tmp_path):
    events = tmp_path / "events.ndjson"
    events.write_bytes(ndjson(order_event(1), order_event(2)))
    zipped = tmp_path / "events.ndjson.gz"
    zipped.write_bytes(gzip.compress(ndjson(order_event(3))))
    curl = [
        "curl",
        "-sS",
        "-X",
        "POST",
        f"{server.url}/v1/streams/orders/events",
        "-H",
        f"Authorization: Bearer {ORDERS_TOKEN}",
    ]

    plain = subprocess.run(
        [*curl, "-H", "Idempotency-Key: b-1", "--data-binary", f"@{events}"], capture_output=True, check=True
    )
    again = subprocess.run(
        [*curl, "-H", "Idempotency-Key: b-1", "--data-binary", f"@{events}"], capture_output=True, check=True
    )
    compressed = subprocess.run(
        [*curl, "-H", "Content-Encoding: gzip", "--data-binary", f"@{zipped}"], capture_output=True, check=True
    )

    assert json.loads(plain.stdout)["events"] == 2 and json.loads(again.stdout) == json.loads(plain.stdout)
    assert json.loads(compressed.stdout)["events"] == 1
    assert [json.loads(line)["order_id"] for line in landed_lines()] == [1, 2, 3]


def test_sigterm_answers_the_request_in_flight_then_exits_cleanly(server):
    body = ndjson(*(order_event(i) for i in range(1, 11)))
    head = (
        f"POST /v1/streams/orders/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ORDERS_TOKEN}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(head + body[:40])
        threading.Event().wait(0.3)  # the request is in flight: its body half sent
        server.process.terminate()
        threading.Event().wait(0.3)
        client.sendall(body[40:])
        answer = _response(client)

    assert answer.startswith("HTTP/1.1 200"), answer
    assert server.process.wait(timeout=60) == 0
    assert sorted(landed_lines()) == sorted(body.splitlines())


# Any header value h11 can send: visible bytes, Latin-1 included, no surrounding whitespace.
HEADER_VALUES = st.binary(max_size=40).map(lambda raw: bytes(c for c in raw if c >= 0x20 and c != 0x7F).strip())
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)
LINES = st.one_of(
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4).map(lambda event: json.dumps(event).encode()),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.text(max_size=30).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=30),
)
BODIES = st.one_of(st.lists(LINES, max_size=6).map(b"\n".join), st.binary(max_size=120))
CONTENT_TYPES = st.one_of(
    st.none(),
    st.sampled_from([b"application/json", b"application/x-ndjson", b"application/json; charset=utf-8"]),
    HEADER_VALUES,
)
ENCODINGS = st.one_of(st.none(), st.sampled_from([b"gzip", b"identity", b"GZIP", b"br"]), HEADER_VALUES)


def _expected_ndjson(events: bytes) -> list[bytes]:
    """The oracle for an accepted NDJSON body: its non-blank lines as sent, without a final \\r."""
    return [line.removesuffix(b"\r") for line in events.split(b"\n") if line.decode().strip()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=BODIES,
    gzipped=st.booleans(),
    content_type=CONTENT_TYPES,
    encoding=ENCODINGS,
    key=st.one_of(st.none(), HEADER_VALUES),
    token=st.sampled_from([ORDERS_TOKEN, CLICKS_TOKEN, None, "x" * 20]),
    stream=st.one_of(st.sampled_from(["orders", "clicks"]), st.text(max_size=12)),
)
def test_any_request_is_landed_whole_or_refused_with_a_4xx_and_never_a_500(
    server, body, gzipped, content_type, encoding, key, token, stream
):
    headers = {
        name: value
        for name, value in (("Content-Type", content_type), ("Content-Encoding", encoding), ("Idempotency-Key", key))
        if value is not None
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}".encode()
    sent = gzip.compress(body) if gzipped else body
    before = {name: landed_lines(name) for name in ("orders", "clicks")}
    answer = request("POST", f"{server.url}/v1/streams/{quote(stream, safe='')}/events", content=sent, headers=headers)
    after = {name: landed_lines(name) for name in ("orders", "clicks")}

    assert answer.status_code < 500, answer.text
    landed = {name: after[name][len(before[name]) :] for name in after}
    assert all(after[name][: len(before[name])] == before[name] for name in after)
    if answer.status_code != 200 or answer.headers.get("Idempotent-Replayed") == "true":
        assert landed == {"orders": [], "clicks": []}
        if answer.status_code != 200:
            assert answer.json()["error"]
        return
    events = gzip.decompress(sent) if encoding and encoding.lower() == b"gzip" else sent
    if content_type and content_type.split(b";")[0].strip().lower() == b"application/json":
        # The same events, each on a line of its own (compared in json's canonical text: NaN too).
        assert [json.dumps(json.loads(line)) for line in landed[stream]] == [
            json.dumps(event) for event in _as_list(json.loads(events))
        ]
    else:
        assert landed[stream] == _expected_ndjson(events)
    assert answer.json()["events"] == len(landed[stream])


def _as_list(document: object) -> list:
    return document if isinstance(document, list) else [document]


@pytest.mark.spark
def test_a_producer_killed_and_retrying_at_random_gets_each_acknowledged_event_into_the_table_once(
    http_home, tmp_path, lake, instance
):
    """The HTTP source's promise end to end: a producer posts with an Idempotency-Key and retries
    every request until it is acknowledged while the server is SIGKILLed at random moments and at
    its crash points, and restarted;
    the pipeline then commits what was landed, and DuckDB reads each event exactly once."""
    requests = {f"request-{number:03d}": list(range(number * 25, number * 25 + 25)) for number in range(160)}
    server = HttpServer(tmp_path / "serve.log").start()
    done = threading.Event()
    kills = 0

    def kill_and_restart_at_random() -> None:
        # SIGKILLs at random moments, and restarts that die at one of the landing's crash points
        # (the windows a random kill rarely hits: after the rename, before the answer).
        nonlocal server, kills
        chooser = random.Random(7)
        while not done.wait(chooser.uniform(0.05, 0.4)):
            server.kill()
            kills += 1
            crash_at = chooser.choice([None, *faults.HTTP_CRASH_POINTS])
            fault = {faults.CRASH_ENV: crash_at} if crash_at else {}
            # Its next kill comes a random while after it answers (or it dies at its crash point).
            server = HttpServer(tmp_path / "serve.log", fault, port=server.port).launch()
            server.wait_until_answering()

    def post_until_acknowledged(key: str) -> int:
        body = ndjson(*(order_event(order_id) for order_id in requests[key]))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                answer = post(server, body, client=client, Idempotency_Key=key)
            except httpx.TransportError:  # killed mid-request, or not started again yet
                time.sleep(0.05)
                continue
            if answer.status_code == 200:
                time.sleep(0.025)  # a producer's pace, so the kills fall among its requests
                return answer.json()["events"]
            assert answer.status_code == 503, answer.text
            time.sleep(0.05)
        raise AssertionError(f"{key} was not acknowledged within 120 s")

    killer = threading.Thread(target=kill_and_restart_at_random)
    killer.start()
    try:
        with httpx.Client() as client, ThreadPoolExecutor(max_workers=4) as pool:
            acknowledged = list(pool.map(post_until_acknowledged, requests))
    finally:
        done.set()
        killer.join()
        server.kill()
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    order_ids = [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")]
    staged = instance.fetch_materializations(names.staged_batches_key("orders"), limit=1000).records
    assert kills >= 5 and acknowledged == [25] * len(requests)
    assert order_ids == sorted(order_id for ids in requests.values() for order_id in ids)
    # What the UI shows per staged batch: the events that came over HTTP, all of them here.
    assert sum(record.asset_materialization.metadata["http_events"].value for record in staged) == len(order_ids)
