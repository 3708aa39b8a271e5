"""The operator console in a real browser: headless Chromium from Debian, driven through
WebDriver by Debian's chromedriver (Selenium), against ``masd serve`` on loopback.

One walk through the console as an operator takes it: sign in, the case list, a case's
timeline growing live while a mail is delivered over LMTP (its header counts following), a
reply's own words with its whole text opened by a click and its attachment downloaded,
retry and drop on the outbound queue, the other pages, sign out.  Each page is saved as a
screenshot under ``build/screenshots/`` (CI keeps them).  Without chromium or chromedriver
the test is skipped, naming the package (failed under ``MASD_REQUIRE_SYSTEM_TESTS=1``).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import time
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.wait import WebDriverWait
from support.masd_process import MasdProcess, free_port, mx_mail, write_master_config
from support.system import require_program

from masd.testing.lmtpclient import deliver

#: A reply above the mail it answers, as a mail client writes it, and the file it carries.
REPLY = "Tuesday at 10 works for me."
QUOTED = f"{REPLY}\n\nOn Mon, 30 Nov 2026, Help Desk wrote:\n> When may we come by?\n"
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 16
#: A file that would change the page it is shown in.
HOSTILE = b"<html><script>document.title = 'ran'</script><p>Invoice</p></html>"
#: An attachment: (filename, content type, bytes).
File = tuple[str, str, bytes]
FILES: tuple[File, ...] = (
    ("plan.pdf", "application/pdf", PDF),
    ("invoice.html", "text/html", HOSTILE),
)
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "build" / "screenshots"
WAIT = 20.0
#: The launch flags of a headless Chromium run as root in a test: no sandbox (root), no
#: GPU, nothing fetched from the network behind the test's back, a fresh profile each time.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,860",
)

pytestmark = [pytest.mark.slow, pytest.mark.system]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Chromium, downloading into ``tmp_path / "downloads"`` without asking."""
    chromium = require_program("chromium")
    chromedriver = require_program("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    service = Service(executable_path=chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def masd(tmp_path: Path) -> Iterator[tuple[MasdProcess, str, int, str]]:
    """masd with the console on, its mode endpoint and SMTP relay unreachable (a closed
    loopback port), so what it sends waits in the outbox: (process, base URL, LMTP port,
    admin secret)."""
    closed = free_port()
    setup = write_master_config(
        tmp_path / "etc", endpoint_url=f"http://127.0.0.1:{closed}/mas", smtp_port=closed
    )
    text = setup.config.read_text()
    setup.config.write_text(text.replace("[server]\n", "[server]\nconsole = true\n", 1))
    process = MasdProcess(setup.config, tmp_path / "masd.log")
    asyncio.run(process.start())
    try:
        yield process, setup.http_url, setup.lmtp_port, setup.admin_token
    finally:
        process.kill()
        process.close()


def lmtp(
    port: int, to: str, subject: str, body: str = "Hello.\n", files: tuple[File, ...] = ()
) -> None:
    _, raw = mx_mail("ann@example.org", to, name="Ann Example", subject=subject, body=body)
    if files:
        msg = email.message_from_bytes(raw, policy=email.policy.SMTP)
        assert isinstance(msg, EmailMessage)
        for name, kind, data in files:
            main, sub = kind.split("/")
            msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
        raw = msg.as_bytes()
    result = asyncio.run(deliver(("127.0.0.1", port), "ann@example.org", [to], raw))
    assert result.codes == (250,), result


def shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))


def wait_for(driver: WebDriver, css: str, text: str = "") -> None:
    located = (By.CSS_SELECTOR, css)
    condition = ready.text_to_be_present_in_element(located, text) if text else None
    WebDriverWait(driver, WAIT).until(condition or ready.presence_of_element_located(located))


def no_errors(driver: WebDriver) -> None:
    """The page's console holds no error: nothing the policy refused, no script error."""
    logged = driver.get_log("browser")
    errors = [e["message"] for e in logged if e["level"] == "SEVERE"]
    assert errors == [], errors


def click(driver: WebDriver, css: str) -> None:
    driver.find_element(By.CSS_SELECTOR, css).click()


def header_counts(driver: WebDriver) -> dict[str, int]:
    found = driver.find_elements(By.CSS_SELECTOR, "dd[data-count]")
    return {node.get_attribute("data-count") or "": int(node.text) for node in found}


def header_and_rows(driver: WebDriver) -> tuple[dict[str, int], tuple[int, int]]:
    """The header's counts and the timeline's entries and mails in, read at one moment
    (in one script, between two events of the feed)."""
    counts, entries, mails = driver.execute_script(
        "const counts = {};"
        "for (const n of document.querySelectorAll('dd[data-count]'))"
        "  counts[n.dataset.count] = Number(n.textContent);"
        "return [counts, document.querySelectorAll('#timeline li.entry').length,"
        "  document.querySelectorAll('#timeline li.entry.kind-mail-in').length];"
    )
    return {str(k): int(v) for k, v in counts.items()}, (int(entries), int(mails))


def own_words(base: str, secret: str, mail: WebElement) -> str:
    """The words the row should show, as the HTTP API gives the mail's event: its
    ``reply_text`` where it has one, else its ``text`` (trailing blank lines aside, as
    a browser shows a paragraph's text)."""
    raw = mail.find_element(By.CSS_SELECTOR, ".raw a").get_attribute("href") or ""
    ref = raw.split("/messages/", 1)[1].split("/", 1)[0]
    answer = httpx.get(
        f"{base}/mas/v0.1/messages/{ref}", headers={"Authorization": f"Bearer {secret}"}
    )
    event = answer.json()["message"]["event"]
    return str(event.get("reply_text", event["text"])).strip()


def downloaded(directory: Path, name: str) -> bytes:
    """The bytes of the file ``name`` once the browser has finished downloading it."""
    target = directory / name
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if target.exists() and not list(directory.glob("*.crdownload")):
            return target.read_bytes()
        time.sleep(0.1)
    raise AssertionError(f"{name} not downloaded: {sorted(p.name for p in directory.iterdir())}")


def test_an_operator_walks_through_the_console(
    browser: WebDriver, masd: tuple[MasdProcess, str, int, str], tmp_path: Path
) -> None:
    _, base, lmtp_port, secret = masd
    lmtp(lmtp_port, "ticket!callback@help.example", "Printer on fire")
    lmtp(lmtp_port, "ticket@help.example", "Where is my order?")

    # Signing in: a wrong secret is refused, the right one opens the case list.
    browser.get(base + "/console/")
    wait_for(browser, "form.sign-in")
    shot(browser, "sign-in")
    no_errors(browser)
    browser.find_element(By.ID, "secret").send_keys("not-the-secret")
    click(browser, "form.sign-in button")
    wait_for(browser, "p.refused", "not the admin secret")
    browser.get_log("browser")  # the 401 of that answer, logged as expected
    browser.find_element(By.ID, "secret").send_keys(secret)
    click(browser, "form.sign-in button")
    wait_for(browser, "#cases")
    assert browser.current_url == base + "/console/cases"
    assert browser.get_cookie("masd_console")["httpOnly"] is True
    wait_for(browser, "h2 .live-state", "live")
    rows = browser.find_elements(By.CSS_SELECTOR, "#cases tbody tr")
    assert len(rows) == 2
    assert "callback" in rows[1].text  # the older case has its handoff open
    # The list's live panel shows each event as it commits.
    lmtp(lmtp_port, "ticket@help.example", "Third time lucky")
    wait_for(browser, "#live-events li", "Third time lucky")
    shot(browser, "cases")
    no_errors(browser)

    # A case's thread as a timeline; a mail delivered meanwhile appears in it live.
    rows[1].find_element(By.TAG_NAME, "a").click()  # the case with a handoff
    wait_for(browser, "#timeline li.entry")
    wait_for(browser, ".live-state", "live")
    address = browser.find_element(By.CSS_SELECTOR, "h1").text
    before = len(browser.find_elements(By.CSS_SELECTOR, "#timeline li.entry"))
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline .delivery")  # delivery states
    assert "callback" in browser.find_element(By.CSS_SELECTOR, "main table").text  # its handoff
    lmtp(lmtp_port, address, "Any news?")
    wait_for(browser, "#timeline li.entry.kind-mail-in:last-of-type .what", "Any news?")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#timeline li.entry")) > before
    counted, rows_shown = header_and_rows(browser)  # the header follows the rows that arrived
    assert (counted["entries"], counted["mails_in"]) == rows_shown

    # A reply with two files arrives: its own words show, the whole text is a click away, the
    # files download, and the header counts one more mail and its two attachments.
    lmtp(lmtp_port, address, "Re: Any news?", body=QUOTED, files=FILES)
    last = "#timeline li.entry.kind-mail-in:last-of-type"
    wait_for(browser, f"{last} .what", "Re: Any news?")
    mail = browser.find_element(By.CSS_SELECTOR, f"{last} .mail")
    assert mail.find_element(By.CSS_SELECTOR, ".reply").text == own_words(base, secret, mail)
    assert REPLY in mail.find_element(By.CSS_SELECTOR, ".reply").text
    whole = mail.find_element(By.CSS_SELECTOR, "details.whole pre.text")
    assert not whole.is_displayed()
    mail.find_element(By.CSS_SELECTOR, "details.whole summary").click()
    WebDriverWait(browser, WAIT).until(lambda _: whole.is_displayed())
    assert "When may we come by?" in whole.text
    WebDriverWait(browser, WAIT).until(
        lambda _: header_counts(browser)["attachments"] == counted["attachments"] + len(FILES)
    )
    now, rows_shown = header_and_rows(browser)
    assert now["mails_in"] == counted["mails_in"] + 1
    assert (now["entries"], now["mails_in"]) == rows_shown
    browser.set_window_size(1280, 1700)  # the whole case in one picture (docs/console-case.png)
    browser.execute_script("window.scrollTo(0, 0)")
    shot(browser, "case")
    browser.set_window_size(1280, 860)
    no_errors(browser)
    plan, invoice = mail.find_elements(By.CSS_SELECTOR, "a.attachment")
    plan.click()
    assert downloaded(tmp_path / "downloads", "plan.pdf") == PDF
    # An HTML file is saved, not shown: neither its link nor its address opens it as a page.
    title, page = browser.title, browser.current_url
    invoice.click()
    assert downloaded(tmp_path / "downloads", "invoice.html") == HOSTILE
    (tmp_path / "downloads" / "invoice.html").unlink()
    browser.get(invoice.get_attribute("href") or "")
    assert downloaded(tmp_path / "downloads", "invoice.html") == HOSTILE
    assert (browser.title, browser.current_url, len(browser.window_handles)) == (title, page, 1)
    # The page read anew counts what the script counted.
    browser.refresh()
    wait_for(browser, f"{last} .what", "Re: Any news?")
    assert header_counts(browser) == now
    no_errors(browser)

    # The outbound queue: retry one item, drop another (the script asks first).
    click(browser, 'nav a[href="/console/outbox"]')
    wait_for(browser, "#outbox")
    waiting = browser.find_elements(By.CSS_SELECTOR, "#outbox tbody tr")
    assert len(waiting) >= 2
    click(browser, "#outbox tbody tr:first-child form.retry button")
    wait_for(browser, "p.notice", "retried")
    first = browser.find_element(By.CSS_SELECTOR, "#outbox tbody tr:first-child td").text
    click(browser, "#outbox tbody tr:first-child form.drop button")
    WebDriverWait(browser, WAIT).until(ready.alert_is_present()).accept()
    wait_for(browser, "p.notice", f"Item {first} dropped (now failed)")
    # A dropped item is withdrawn: no longer in the queue.
    ids = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#outbox tbody td:first-child")]
    assert first not in ids
    shot(browser, "outbox")
    no_errors(browser)

    for page, says in (
        ("intakes", "No intake is waiting"),
        ("suppressions", "No suppression is recorded"),
        ("health", "200 ok"),
    ):
        click(browser, f'nav a[href="/console/{page}"]')
        wait_for(browser, "main", says)
        shot(browser, page)
        no_errors(browser)

    # Signing out ends the session: the pages send the browser to sign in again.
    click(browser, "form.sign-out button")
    wait_for(browser, "form.sign-in")
    assert browser.get_cookie("masd_console") is None
    browser.get(base + "/console/outbox")
    wait_for(browser, "form.sign-in")
    assert browser.current_url == base + "/console/sign-in"
