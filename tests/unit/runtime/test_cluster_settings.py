"""Pointing a process at a NATS cluster: a NATS_URL with several servers, and GPUSCHED_STREAM_REPLICAS."""

from __future__ import annotations

import pytest

from libs.bus.jetstream import BusConfig, server_urls, stream_replicas_from_env
from libs.runtime.settings import Settings

CLUSTER_URL = "nats://n1:4222, nats://n2:4222,nats://n3:4222"


def test_a_nats_url_with_commas_is_the_client_s_server_list() -> None:
    assert server_urls(CLUSTER_URL) == ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"]
    assert server_urls("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]
    assert BusConfig(url=CLUSTER_URL).servers == server_urls(CLUSTER_URL)
    with pytest.raises(ValueError, match="no server"):
        server_urls(" , ")


def test_stream_replicas_come_from_the_environment_and_are_checked() -> None:
    assert stream_replicas_from_env({}) == 1
    assert stream_replicas_from_env({"GPUSCHED_STREAM_REPLICAS": " 3 "}) == 3
    for bad in ("0", "7"):
        with pytest.raises(ValueError, match="between 1 and 5"):
            stream_replicas_from_env({"GPUSCHED_STREAM_REPLICAS": bad})


def test_every_process_creates_the_streams_with_the_replicas_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_URL", CLUSTER_URL)
    monkeypatch.setenv("GPUSCHED_STREAM_REPLICAS", "3")
    settings = Settings.from_env("quota")
    assert (settings.bus.url, settings.bus.replicas, settings.stream_replicas) == (CLUSTER_URL, 3, 3)
    # Built field by field (the node agent) or bare (the CLI's live-log helpers): the environment still counts,
    # so whichever process connects first creates the streams alike.
    assert Settings(service="agent", nats_url=settings.nats_url).bus.replicas == 3
    assert BusConfig().replicas == 3
    assert BusConfig(replicas=1).replicas == 1
    monkeypatch.delenv("GPUSCHED_STREAM_REPLICAS")
    assert Settings.from_env("quota").bus.replicas == BusConfig().replicas == 1
