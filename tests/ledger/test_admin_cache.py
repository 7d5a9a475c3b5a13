"""The admin works without its cache: a dead Redis is logged and bypassed, never a 500.

The cache is django-redis pointed at a loopback port where nothing listens (a real refused
connection, not a mock); the test first proves that this cache does fail.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import Client
from django.urls import reverse

from zeroloss.ledger.models import Message
from zeroloss.ledger.service import ZeroLossMessageService


def unused_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dead_cache(settings: Any) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{unused_loopback_port()}/11",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        }
    }
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 30}
    with pytest.raises(Exception, match=r"(?i)connect"):
        caches["default"].get("zeroloss:probe")


@pytest.fixture
def root(db: None) -> Client:
    service = ZeroLossMessageService(instance_id="w")
    service.persist_messages([("a1", "emails", {}), ("a2", "sms", {})])
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.mark.parametrize(
    "url",
    [
        "/admin/zeroloss/message/dashboard/",
        "/admin/zeroloss/message/dashboard/?refresh=1",
        "/admin/zeroloss/message/",
        "/admin/zeroloss/message/?queue=sms",
    ],
)
def test_admin_pages_work_with_a_dead_cache(
    dead_cache: None, root: Client, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="zeroloss"):
        response = root.get(url)
    assert response.status_code == 200, response.content[:3000]
    html = response.content.decode()
    if "dashboard" in url:
        assert response.context["data"].total == 2
    else:
        # The queue filter still lists the queues (read from the ledger instead).
        assert "?queue=emails" in html
        assert ">a2<" in html
        if "queue=sms" in url:
            assert ">a1<" not in html
    assert any("cache" in r.getMessage().lower() for r in caplog.records if r.name.startswith("zeroloss"))


def test_dead_cache_reads_fresh_numbers(dead_cache: None, root: Client) -> None:
    url = reverse("admin:zeroloss_message_dashboard")
    assert root.get(url).context["data"].total == 2
    ZeroLossMessageService().persist_message("a3", "emails", {})
    assert root.get(url).context["data"].total == 3
    assert Message.objects.count() == 3
