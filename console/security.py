"""The console's browser-facing protections: response headers, same-origin and CSRF checks, and
bounded form bodies. Pure functions over header values and strings."""

from __future__ import annotations

from urllib.parse import parse_qs

# Everything from the console itself; no inline script or style, no framing, forms post only here.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # Not no-referrer: with it Chromium sends "Origin: null" even on the console's own forms.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"strict-transport-security", b"max-age=31536000"),
    (b"cache-control", b"no-store"),
]
MAX_FORM_BYTES = 16 * 1024


class Refused(Exception):
    """A request the console will not act on; ``code`` is stable, ``status`` the HTTP status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def same_origin(own: tuple[str, ...], origin: str | None, fetch_site: str | None) -> None:
    """Refuse a state-changing request another site made the browser send.

    Browsers send ``Origin`` on every POST and ``Sec-Fetch-Site`` on every request; either one
    naming another site is refused. (The CSRF token is checked as well: this is the first line.)
    """
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise Refused(403, "cross_site_request", "requests from other sites are refused")
    if origin is not None and origin not in own:
        raise Refused(403, "cross_site_request", "requests from other origins are refused")


def form(body: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (first value of each field)."""
    if len(body) > MAX_FORM_BYTES:
        raise Refused(413, "body_too_large", f"a form is at most {MAX_FORM_BYTES} bytes")
    try:
        parsed = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=32)
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "invalid_body", "the form could not be read") from None
    return {k: v[0] for k, v in parsed.items()}
