"""somnus.streams.kafka_compat: applied only where asked, and what each workaround relies on still exists."""

from __future__ import annotations

import inspect
import subprocess
import sys

from aiokafka.client import AIOKafkaClient


def test_importing_the_publishing_client_leaves_aiokafka_unpatched():
    code = ("import somnus.client\n"
            "from aiokafka.client import AIOKafkaClient\n"
            "print(getattr(AIOKafkaClient._wait_on_metadata, '_somnus_tracks', False))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_worker_app_and_the_projector_apply_it():
    code = ("import somnus.streams.kafka_compat as k\n"
            "from aiokafka.client import AIOKafkaClient\n"
            "k.track_topics_sent_to(); k.track_topics_sent_to()\n"
            "m = AIOKafkaClient._wait_on_metadata\n"
            "print(m._somnus_tracks, getattr(m._somnus_original, '_somnus_tracks', False))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]  # idempotent: applied once, over aiokafka's own
    import somnus.projections.projector
    import somnus.streams.app

    assert "track_topics_sent_to()" in inspect.getsource(somnus.projections.projector.Projector.run)
    assert "track_topics_sent_to()" in inspect.getsource(somnus.streams.app)


def test_the_private_attributes_it_relies_on_are_still_there():
    # track_topics_sent_to wraps AIOKafkaClient._wait_on_metadata(topic) and adds to client._topics
    assert list(inspect.signature(AIOKafkaClient._wait_on_metadata).parameters) == ["self", "topic"]
    assert "self._topics" in inspect.getsource(AIOKafkaClient.__init__)
