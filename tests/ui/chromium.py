"""Where the browser tests find Chromium (Debian's `chromium`, or AGENTRUN_CHROMIUM), and why they cannot run
when they cannot: Playwright never downloads a browser here."""

from __future__ import annotations

import os
import shutil


def executable() -> str | None:
    for candidate in (os.environ.get("AGENTRUN_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[test]')"
    if executable() is None:
        return "no Chromium found (apt-get install chromium, or set AGENTRUN_CHROMIUM); .ci/run installs it"
    return None
