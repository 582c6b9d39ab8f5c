"""Client certificate subjects: RFC 4514 strings, normalised so that two spellings of one name match.

SAP client certificates come from the customer's own PKI (DAY2_FACTS.md), so the broker is told
which subjects may send bundles (``--allowed-client-subjects``) as people write them, in RFC 4514
form: ``CN=sap-erp-prod,OU=Basis,O=ACME,C=DE``. The TLS stack reports a peer's subject as
``getpeercert()["subject"]``: a tuple of RDNs in certificate order (RFC 4514 writes them in the
reverse order), each a tuple of ``(long attribute name, value)``. Both are brought to one
:data:`Subject` form and compared for equality:

* RDNs in certificate order; the attributes inside a multi-valued RDN (``CN=a+UID=b``) sorted;
* attribute types as OpenSSL's long names (``CN``, ``cn``, ``commonName`` and ``2.5.4.3`` are one
  type); a type this module does not know is refused, so a typo cannot make an entry that
  matches nobody without anyone noticing;
* values unescaped (``\\,``, ``\\+``, ``\\2C``, UTF-8 hex pairs), spaces around separators dropped,
  and then compared **exactly**: no case folding, although X.500 compares most of these types
  case-insensitively. An allow-list entry is the subject as the customer's CA issued it, and an
  exact rule is the one nobody has to reason about.

The ``#hex`` form (a BER-encoded value) is refused with a message: no SAP subject needs it.

Not here: which subjects are allowed (settings) or where a peer's subject comes from (the
server).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

Subject = tuple[tuple[tuple[str, str], ...], ...]
"""RDNs in certificate order, each a sorted tuple of ``(long attribute name, value)``."""

MAX_SUBJECT_CHARS: Final = 4096

# RFC 4514's short names and a few more that client certificates carry, with their OIDs, to the
# long names OpenSSL (and so getpeercert) reports.
_LONG_NAMES: Final = {
    "cn": "commonName",
    "c": "countryName",
    "l": "localityName",
    "st": "stateOrProvinceName",
    "o": "organizationName",
    "ou": "organizationalUnitName",
    "street": "streetAddress",
    "dc": "domainComponent",
    "uid": "userId",
    "e": "emailAddress",
    "emailaddress": "emailAddress",
    "serialnumber": "serialNumber",
    "gn": "givenName",
    "givenname": "givenName",
    "sn": "surname",
    "title": "title",
    "2.5.4.3": "commonName",
    "2.5.4.6": "countryName",
    "2.5.4.7": "localityName",
    "2.5.4.8": "stateOrProvinceName",
    "2.5.4.10": "organizationName",
    "2.5.4.11": "organizationalUnitName",
    "2.5.4.9": "streetAddress",
    "0.9.2342.19200300.100.1.25": "domainComponent",
    "0.9.2342.19200300.100.1.1": "userId",
    "1.2.840.113549.1.9.1": "emailAddress",
    "2.5.4.5": "serialNumber",
    "2.5.4.42": "givenName",
    "2.5.4.4": "surname",
    "2.5.4.12": "title",
}
_BY_LONG_NAME: Final = {long.lower(): long for long in _LONG_NAMES.values()}
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIAL: Final = frozenset(' "#+,;<=>\\')
_HEX: Final = frozenset("0123456789abcdefABCDEF")


class SubjectError(ValueError):
    """A subject that cannot be read; the text says where and what to write instead."""


def _attribute_type(text: str, subject: str) -> str:
    name = text.strip()
    known = _LONG_NAMES.get(name.lower()) or _BY_LONG_NAME.get(name.lower())
    if known is None:
        short = ", ".join(sorted({*_SHORT_NAMES.values(), "E", "SERIALNUMBER", "GN", "SN", "TITLE"}))
        raise SubjectError(
            f"subject {subject!r}: unknown attribute type {name!r}; use one of {short} or its dotted OID"
        )
    return known


def _split(text: str, separators: str) -> list[str]:
    """``text`` cut at each unescaped separator (a backslash escapes the next character)."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char in separators:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _value(raw: str, subject: str) -> str:
    """An attribute value, unescaped, without the unescaped spaces around it."""
    text = raw.lstrip(" ")
    if text.startswith("#"):
        raise SubjectError(
            f"subject {subject!r}: the '#hex' value form is not supported; write the value as text"
        )
    # Trailing spaces go, unless escaped ("a\\ "): an odd run of backslashes before one escapes it.
    while text.endswith(" ") and (len(text) - 1 - len(text[:-1].rstrip("\\"))) % 2 == 0:
        text = text[:-1]
    out = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            if char in '"+,;<>':  # ',' and '+' were split on; ';' is RFC 2253's old separator
                raise SubjectError(
                    f"subject {subject!r}: {char!r} in a value must be escaped as '\\{char}' (RFC 4514 "
                    "separates RDNs with ',' and the attributes of one RDN with '+')"
                )
            out += char.encode()
            index += 1
            continue
        pair = text[index + 1 : index + 3]
        if len(pair) == 2 and set(pair) <= _HEX:
            out.append(int(pair, 16))
            index += 3
        elif index + 1 < len(text) and text[index + 1] in _SPECIAL:
            out += text[index + 1].encode()
            index += 2
        else:
            raise SubjectError(f"subject {subject!r}: a '\\' that escapes nothing at {raw!r}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise SubjectError(f"subject {subject!r}: the hex escapes in {raw!r} are not UTF-8") from None


def parse_subject(subject: str) -> Subject:
    """An RFC 4514 string (``CN=x,O=y``) as a :data:`Subject`, or a :class:`SubjectError`."""
    if len(subject) > MAX_SUBJECT_CHARS:
        raise SubjectError(f"a subject of {len(subject)} characters is over {MAX_SUBJECT_CHARS}")
    if not subject.strip():
        raise SubjectError("an empty subject matches no certificate")
    rdns: list[tuple[tuple[str, str], ...]] = []
    for rdn in _split(subject, ","):
        attributes = []
        for pair in _split(rdn, "+"):
            name, equals, value = pair.partition("=")
            if not equals or not name.strip():
                raise SubjectError(f"subject {subject!r}: {pair.strip()!r} is not 'TYPE=value'")
            attributes.append((_attribute_type(name, subject), _value(value, subject)))
        rdns.append(tuple(sorted(attributes)))
    return tuple(reversed(rdns))  # RFC 4514 writes the last RDN first


def peer_subject(certificate_subject: Iterable[Iterable[tuple[str, str]]]) -> Subject:
    """``getpeercert()["subject"]`` as a :data:`Subject` (types a peer may send that this module
    does not know keep OpenSSL's name; they then match no allowed entry)."""
    return tuple(
        tuple(sorted((_BY_LONG_NAME.get(name.lower(), name), value) for name, value in rdn))
        for rdn in certificate_subject
    )


def _escape(value: str) -> str:
    """RFC 4514's escapes: the special characters, a leading space or '#', a trailing space."""
    last = len(value) - 1
    return "".join(
        f"\\{char}"
        if char in '"+,;<>\\=' or (index == 0 and char in " #") or (index == last and char == " ")
        else char
        for index, char in enumerate(value)
    )


def render_subject(subject: Subject) -> str:
    """A :data:`Subject` in RFC 4514 form (short names where there are any), for messages."""
    return ",".join(
        "+".join(f"{_SHORT_NAMES.get(name, name)}={_escape(value)}" for name, value in rdn)
        for rdn in reversed(subject)
    )
