"""Storage URL masking and path-safe names."""

from __future__ import annotations

import pytest

from harness.core.names import check_safe_name
from harness.core.redact import STORAGE_ENV, mask_url, mask_urls_in_text, storage_url_from_env


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
        (
            "postgresql+psycopg2://u:p%40ss@h:5432/db?sslmode=require",
            "postgresql+psycopg2://u:***@h:5432/db?sslmode=require",
        ),
        ("mysql://root:hunter2@127.0.0.1/optuna", "mysql://root:***@127.0.0.1/optuna"),
        ("redis://:tok3n@cache:6379/0", "redis://:***@cache:6379/0"),
    ],
)
def test_password_masked(url, masked):
    assert mask_url(url) == masked
    password = url.split("@")[0].rsplit(":", 1)[1]
    assert password not in mask_url(url)


@pytest.mark.parametrize(
    "url", ["sqlite:///runs/x.db", "mysql://u@h/db", "runs/sweep/journal.log", "/abs/path/optuna.journal"]
)
def test_url_without_password_unchanged(url):
    assert mask_url(url) == url


def test_urllib_fallback_masks_too(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sqlalchemy(name, *args, **kwargs):
        if name.startswith("sqlalchemy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sqlalchemy)
    assert mask_url("postgresql://user:secret@host:5433/db") == "postgresql://user:***@host:5433/db"


def test_masks_urls_quoted_in_messages():
    text = (
        "OperationalError: could not connect to postgresql://bob:s3cr3t@db.internal:5432/optuna; "
        "also tried mysql://root:pw@h/x"
    )
    masked = mask_urls_in_text(text)
    assert "s3cr3t" not in masked and ":pw@" not in masked
    assert "postgresql://bob:***@db.internal:5432/optuna" in masked and "mysql://root:***@h/x" in masked


def test_storage_url_from_env():
    assert storage_url_from_env({STORAGE_ENV: "  postgresql://u:p@h/db \n"}) == "postgresql://u:p@h/db"
    assert storage_url_from_env({STORAGE_ENV: "  "}) is None
    assert storage_url_from_env({}) is None


@pytest.mark.parametrize("name", [".", "..", "", "  ", "a/b", "../x", "a\\b", "x\n", "/abs"])
def test_unsafe_names_rejected(name):
    with pytest.raises(ValueError) as info:
        check_safe_name(name, "stage name")
    assert str(info.value).startswith("stage name") and "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["assistant", "stage-1", "v1.2", "...", "a..b", "ünïcode"])
def test_safe_names_pass(name):
    assert check_safe_name(name, "experiment name") == name
