"""Redaction of credentials in text that people and scrapers read: the one function for it.

Error text is built from what a component has at hand: a target's URL (which may carry
``user:password@`` or a ``?sig=`` token), a library's exception (which repeats the URL), a
target's reply body (which may echo the request back, ``Authorization`` header and all). That
text becomes a heartbeat's ``unavailabilityMessage``, a BrokerCluster's status, a Warning
event, a log line, a held message's last error. ARCHITECTURE.md ("Channels and trust"): no
credential, token or URL userinfo ever reaches any of them. So every place where such text is
*produced* from foreign or credential-bearing input passes it through :func:`redact` once, at
that boundary (the broker's relay client, the operator's heartbeat client), and what is
downstream can be shown as it is.

:func:`redact` removes what it can recognise without being told (the userinfo and every query
value of any URL in the text, the value after ``Bearer``/``Basic``, ``password=``-style pairs),
and every value the caller knows to be secret (its own tokens, passwords, query values and the
Basic credential they make), raw and percent-encoded. :func:`redact_url` is the display form of
one URL. Values shorter than :data:`MIN_SECRET_LENGTH` are not searched for in free text: a
one-letter "secret" would blank out every word that contains its letter; such a value is not
a credential worth the name (docs/crd.md asks for long random ones).

What this module does not do: decide what is secret beyond these shapes, or parse anything
but text. It is pure (no I/O), so both sides and the tests import it.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Iterable
from typing import Final

MASK: Final = "***"
MIN_SECRET_LENGTH: Final = 4

# scheme://userinfo@ : the userinfo runs to the *last* "@" before the authority ends, so a raw
# "@" inside a password (which should have been %40) is masked whole, never half.
_USERINFO: Final = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#\s]*@)")
# ?a=1&b=2 inside a URL, or a bare path (a request line echoed back), in text: every value goes
# (a poll's ?max=500 included; a query is where SAS-style tokens live, and a name tells us
# nothing reliable about its value).
_URL: Final = re.compile(r"(?:\b[a-zA-Z][a-zA-Z0-9+.-]*://|(?<![\w/])/)[^\s'\"<>]*")
_QUERY_VALUE: Final = re.compile(r"(?P<key>[?&;][^=&;#\s'\"<>]*=)(?P<value>[^&;#\s'\"<>]*)")
# An Authorization value as a header (or an echo of one) spells it; six characters at least, so
# that "Basic auth" in a sentence stays readable (the caller's own short values go by name).
_AUTH_SCHEME_VALUE: Final = re.compile(
    r"\b(?P<scheme>Bearer|Basic|bearer|basic|BEARER|BASIC)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=%-]{6,})"
)
# password=x, "password": "x", api_key=x (a form, a query, JSON or a config echoed back).
_SECRET_PAIR: Final = re.compile(
    r"(?i)(?P<key>\b(?:password|passwd|pwd|secret|access_token|api_?key)['\"]?\s*[=:]\s*['\"]?)"
    r"(?P<value>[^\s'\"&,;]+)"
)


def _mask_query(match: re.Match[str]) -> str:
    return _QUERY_VALUE.sub(lambda q: q.group("key") + (MASK if q.group("value") else ""), match.group(0))


def secret_forms(secrets: Iterable[str]) -> list[str]:
    """Each secret as it can appear in text: raw, percent-encoded, and form-encoded; longest first."""
    forms: set[str] = set()
    for secret in secrets:
        if len(secret) < MIN_SECRET_LENGTH:
            continue
        forms.update({secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)})
    return sorted(forms, key=len, reverse=True)


def basic_credential(username: str, password: str) -> str:
    """The token of ``Authorization: Basic <token>`` for this pair (a secret of its own)."""
    return base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without URL userinfo, URL query values, ``Bearer``/``Basic`` values, ``password=``
    values, and without any of ``secrets`` (raw or percent-encoded)."""
    for form in secret_forms(secrets):
        text = text.replace(form, MASK)
    text = _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    text = _URL.sub(_mask_query, text)
    text = _AUTH_SCHEME_VALUE.sub(lambda m: m.group("scheme") + m.group("sep") + MASK, text)
    return _SECRET_PAIR.sub(lambda m: m.group("key") + MASK, text)


def redact_url(url: str) -> str:
    """The display form of one URL: scheme, host, port and path; userinfo and query values masked."""
    return redact(url)
