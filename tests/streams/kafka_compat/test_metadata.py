"""somnus.streams.kafka_compat.metadata: applied only where asked, and what it relies on still exists."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from types import SimpleNamespace

from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient

import somnus.projections.projector
import somnus.streams.app
import somnus.streams.worker
from somnus.streams.kafka_compat.metadata import refresh_metadata


def test_importing_the_publishing_client_leaves_aiokafka_unpatched():
    code = (
        "import somnus.client\n"
        "from aiokafka.client import AIOKafkaClient\n"
        "print(getattr(AIOKafkaClient._wait_on_metadata, '_somnus_tracks', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_worker_app_and_the_projector_apply_it():
    code = (
        "import somnus.streams.kafka_compat as k\n"
        "from aiokafka.client import AIOKafkaClient\n"
        "k.track_topics_sent_to(); k.track_topics_sent_to()\n"
        "m = AIOKafkaClient._wait_on_metadata\n"
        "print(m._somnus_tracks, getattr(m._somnus_original, '_somnus_tracks', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]  # idempotent: applied once, over aiokafka's own
    assert "track_topics_sent_to()" in inspect.getsource(somnus.projections.projector.Projector.run)
    assert "track_topics_sent_to()" in inspect.getsource(somnus.streams.app.Distiller.create)
    # the decompression bound too: `somnus forget` and the memory rebuild run a Projector in process
    assert "bound_decompression(self.settings.max_batch_bytes)" in inspect.getsource(
        somnus.projections.projector.Projector.run
    )
    assert "bound_decompression(settings.max_batch_bytes)" in inspect.getsource(somnus.streams.app.Distiller.create)
    # and the entry points apply every process-wide workaround before they make a Kafka client
    assert "kafka_compat.apply(settings.max_batch_bytes)" in inspect.getsource(somnus.projections.projector.main)
    assert "kafka_compat.apply(settings.max_batch_bytes)" in inspect.getsource(somnus.streams.worker.main)


def test_apply_patches_the_client_once():
    code = (
        "from somnus.streams import kafka_compat\n"
        "from aiokafka.client import AIOKafkaClient\n"
        "kafka_compat.apply(); kafka_compat.apply()\n"
        "m = AIOKafkaClient._wait_on_metadata\n"
        "print(m._somnus_tracks, m._somnus_original._somnus_tracks if hasattr(m._somnus_original, '_somnus_tracks') else False)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


def test_the_private_attributes_it_relies_on_are_still_there():
    # track_topics_sent_to wraps AIOKafkaClient._wait_on_metadata(topic) and adds to client._topics
    assert list(inspect.signature(AIOKafkaClient._wait_on_metadata).parameters) == ["self", "topic"]
    assert "self._topics" in inspect.getsource(AIOKafkaClient.__init__)


def test_refresh_metadata_asks_the_consumers_client():
    # refresh_metadata reaches AIOKafkaConsumer._client (set in its __init__) and calls the client's
    # force_metadata_update
    assert "self._client = AIOKafkaClient(" in inspect.getsource(AIOKafkaConsumer.__init__)
    assert "self._md_update_fut" in inspect.getsource(AIOKafkaClient.force_metadata_update)  # an awaitable
    calls: list[str] = []

    async def force() -> bool:
        calls.append("refresh")
        return True

    asyncio.run(refresh_metadata(SimpleNamespace(_client=SimpleNamespace(force_metadata_update=force))))
    assert calls == ["refresh"]
