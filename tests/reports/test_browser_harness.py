"""The Playwright harness (``browser_page`` in conftest) sees what the browser tests rely on it to see:
console errors, uncaught page errors and horizontal page scroll. Without this positive control an
empty ``errors`` list could mean "not captured" rather than "no errors"."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_harness_sees_console_errors_page_errors_and_horizontal_scroll(browser_page, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><div style='width:3000px'>wide</div>"
                    "<script>console.error('deliberate'); no_such_function();</script></body></html>")
    browser_page.page.goto(page.as_uri())
    assert browser_page.scroll_overflow() > 1000
    assert any("deliberate" in e for e in browser_page.errors)
    assert any("no_such_function" in e for e in browser_page.errors)


def test_a_plain_page_has_no_errors_and_no_scroll(browser_page, tmp_path):
    page = tmp_path / "ok.html"
    page.write_text("<!DOCTYPE html><html><body><p>fine</p></body></html>")
    browser_page.page.goto(page.as_uri())
    assert browser_page.scroll_overflow() == 0 and browser_page.errors == []
    shot = browser_page.screenshot("harness-plain-page")
    assert shot.stat().st_size > 1000
