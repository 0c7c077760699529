"""Keeping storage passwords out of everything the harness shows or saves.

A sweep's optuna storage may be an RDB URL with a password (``postgresql://user:secret@host/db``). Wherever such a
URL is printed, written to ``sweep.resolved.yaml`` or put in a report, it goes through :func:`mask_url`
(``postgresql://user:***@host/db``); free text that may quote one (an exception message from the database driver)
goes through :func:`mask_urls_in_text`. The URL itself can come from the environment (``HARNESS_STORAGE``) so it
need not be written in a sweep file at all: :func:`storage_url_from_env`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

STORAGE_ENV = "HARNESS_STORAGE"
MASK = "***"
# scheme://user:password@ — the password is everything up to the last "@" before the host part; a password with a
# literal "@" should be percent-encoded (%40), as RFC 3986 requires.
_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<password>[^\s/@]+)(?=@)")


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``; a URL without a password (``sqlite:///x.db``, a journal
    path) is returned unchanged. Uses SQLAlchemy's URL parser when installed (optuna's RDB storage depends on it,
    so it parses the URL exactly as the storage will), else ``urllib.parse``."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url
    except ImportError:  # pragma: no cover — sqlalchemy comes with optuna
        return _mask_with_urllib(url)
    try:
        parsed = make_url(url)
    except Exception:  # not an SQLAlchemy URL (e.g. redis://…): fall back to the generic RFC 3986 split
        return _mask_with_urllib(url)
    if parsed.password is None:
        return url
    return parsed.render_as_string(hide_password=True)


def _mask_with_urllib(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:{MASK}"
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal goes back into brackets
        host = f"[{host}]"
    netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def mask_urls_in_text(text: str) -> str:
    """Every ``scheme://user:password@`` in ``text`` with the password masked (for messages that quote a URL)."""
    return _CREDENTIALS.sub(lambda m: m.group("head") + MASK, text)


def storage_url_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The storage URL in ``$HARNESS_STORAGE`` (stripped), or None when unset or blank. A sweep file's
    ``study.storage`` wins over it; the sweep keeps only the masked form in anything it writes."""
    value = (os.environ if environ is None else environ).get(STORAGE_ENV, "").strip()
    return value or None
