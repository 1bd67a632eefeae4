"""The rule for output paths under a storage site's --root, shared by both sites.

The compute site checks -out with it before starting MPI (a usage error, exit 2); the storage site checks
the same string again, because it comes off the network (see `site.admission.safe_output_path`).
"""

from __future__ import annotations

MAX_PATH = 1024
# A name is at most 255 bytes (NAME_MAX), and the site writes `.<name>.paramedic-<32 hex>` beside it first.
MAX_NAME_BYTES = 255 - len(".") - len(".paramedic-") - 32


def output_path_problem(relative: str) -> str | None:
    """Why `relative` is not an acceptable output path under a root, or None when it is."""
    if not relative:
        return "empty"
    try:
        encoded = relative.encode()
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if len(encoded) > MAX_PATH:
        return f"longer than {MAX_PATH} bytes"
    if "\0" in relative or "\\" in relative or "\n" in relative:
        return "contains a NUL, backslash or newline"
    if relative.startswith("/"):
        return "absolute; give a path relative to the storage site's root"
    parts = relative.split("/")
    if ".." in parts:
        return "contains '..'"
    if any(part in ("", ".") for part in parts):
        return "contains an empty or '.' component"
    if any(part.startswith(".") for part in parts):
        return "contains a hidden name (reserved for the site's state)"
    longest = max(parts, key=lambda part: len(part.encode()))
    if len(longest.encode()) > MAX_NAME_BYTES:
        return f"a name of {len(longest.encode())} bytes (at most {MAX_NAME_BYTES})"
    return None
