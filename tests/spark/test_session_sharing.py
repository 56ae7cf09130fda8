"""Every process of a user attaches to one Spark Connect session on a server (so the
server's Python workers, their imports and bucket-state caches, outlive each command),
unless the URL names a session or sharing is turned off; and a shared session is never
stopped by a client."""

from __future__ import annotations

from resources.spark_session import _shared_sessions, release, shared_session_url

URL = "sc://127.0.0.1:15002"
HOUR = 3600.0


def test_the_same_user_server_and_hour_share_one_session_id() -> None:
    first = shared_session_url(URL, env={}, now=10 * HOUR + 5)
    assert first.startswith(URL + "/;session_id=")
    assert shared_session_url(URL, env={}, now=10 * HOUR + 3500) == first
    assert shared_session_url(URL + "/", env={}, now=10 * HOUR) == first
    assert shared_session_url(URL, env={}, now=11 * HOUR) != first  # a new id each hour
    other = shared_session_url("sc://10.0.0.1:15002", env={}, now=10 * HOUR)
    assert other.split("=")[-1] != first.split("=")[-1]


def test_an_explicit_session_or_opting_out_keeps_the_url() -> None:
    named = URL + "/;session_id=5b6b3a36-7a8e-4b7e-9a39-3f1f3b0c9d11"
    assert shared_session_url(named, env={}) == named
    assert shared_session_url(URL, env={"UPSERT_SPARK_SHARED_SESSION": "0"}) == URL
    with_token = URL + "/;token=abc"
    assert shared_session_url(with_token, env={}, now=0).startswith(with_token + ";session_id=")


def test_release_closes_a_shared_session_and_stops_any_other() -> None:
    class Client:
        closed = False

        def close(self) -> None:
            self.closed = True

    class Session:
        def __init__(self) -> None:
            self.client = Client()
            self.stopped = False

        def stop(self) -> None:
            self.stopped = True

    shared, own = Session(), Session()
    _shared_sessions.add(id(shared))
    release(shared)  # type: ignore[arg-type]
    release(own)  # type: ignore[arg-type]
    assert shared.client.closed and not shared.stopped
    assert own.stopped and not own.client.closed
    assert id(shared) not in _shared_sessions
