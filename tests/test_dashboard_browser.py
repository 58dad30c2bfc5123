"""The dashboard in a real headless Chromium (Selenium + the distribution's chromedriver).

Opened from disk it must load with no console error and no network request, draw its charts, and its
filters and sorting must change the table. Served by `redline dashboard`, it must follow new results.
Skipped where no browser is installed; scripts/install_browser.sh installs one (Debian: chromium,
chromium-driver, and selenium into the environment).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from redline.experiments.report import write_report

FIXTURES = Path(__file__).parent / "fixtures"
CHROMIUM = Path(os.environ.get("REDLINE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("REDLINE_CHROMEDRIVER", "/usr/bin/chromedriver"))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def _missing() -> str | None:
    try:
        import selenium
    except ImportError:
        return "selenium is not installed (scripts/install_browser.sh)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} not found (scripts/install_browser.sh)"
    return None


pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    browser.set_page_load_timeout(30)
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dash") / "sweep_small"
    shutil.copytree(FIXTURES / "sweep_small", root)
    files = write_report(root)
    return files["dashboard"], json.loads(files["results_json"].read_text())


def requested_urls(driver) -> list[str]:
    """URLs the page asked the network stack for since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def count(driver, css: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", css)


def table_labels(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#cells-table tbody tr')].map(tr => tr.dataset.label)")


def wait_for(driver, condition, timeout: float = 10):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition())


def test_offline_dashboard_loads_draws_filters_and_sorts(driver, sweep):
    path, report = sweep
    driver.get_log("browser"), driver.get_log("performance")  # start with empty logs
    url = path.resolve().as_uri()
    driver.get(url)
    wait_for(driver, lambda: count(driver, "#cells-table tbody tr") > 0)

    assert console_errors(driver) == []
    assert [u for u in requested_urls(driver) if u != url] == []  # the page itself, nothing else
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0

    completed_runs = sum(r["status"] == "completed" for r in report["runs"])
    measured_cells = [c for c in report["cells"] if c["n_completed"]]
    assert count(driver, "#chart-loss svg path.series") == completed_runs
    assert count(driver, "#chart-speed svg rect.bar") == len(measured_cells)
    assert count(driver, "#chart-memory svg rect.bar") == len(measured_cells)
    assert count(driver, "#chart-scatter svg .point") == len(measured_cells)
    other_recipes = [c for c in report["claims"] if c.get("absent")]
    assert count(driver, "#claims-table tbody tr") == len(report["claims"]) - len(other_recipes)
    assert other_recipes and f"({len(other_recipes)} of other recipes not listed)" in \
        driver.find_element("id", "claims-count").text
    assert "oom__tiny__bf16__4x64__s1" in driver.find_element("id", "failed-table").text

    all_labels = table_labels(driver)
    assert sorted(all_labels) == sorted(c["label"] for c in report["cells"])
    mqa_runs = sum(r["variant"] == "mqa" and r["status"] == "completed" for r in report["runs"])
    driver.find_element("css selector", "input[data-axis='variant'][data-value='mqa']").click()
    assert sorted(table_labels(driver)) == sorted(label for label in all_labels if not label.startswith("mqa"))
    assert count(driver, "#chart-loss svg path.series") == completed_runs - mqa_runs
    driver.find_element("css selector", "input[data-axis='precision'][data-value='fp32']").click()
    assert sorted(table_labels(driver)) == sorted(c["label"] for c in report["cells"]
                                                  if c["variant"] != "mqa" and c["precision"] != "fp32")
    for axis, value in (("variant", "mqa"), ("precision", "fp32")):
        driver.find_element("css selector", f"input[data-axis='{axis}'][data-value='{value}']").click()
    assert len(table_labels(driver)) == len(all_labels)

    speed = {c["label"]: c["tokens_per_second"]["mean"] for c in report["cells"]}
    header = lambda: driver.find_element("css selector", "#cells-table th[data-key='tokens_per_second']")
    header().click()
    with_speed = sorted((label for label in all_labels if speed[label] is not None), key=lambda label: speed[label])
    assert table_labels(driver)[: len(with_speed)] == with_speed
    assert header().get_attribute("aria-sort") == "ascending"
    header().click()
    assert table_labels(driver)[: len(with_speed)] == with_speed[::-1]

    driver.find_element("css selector", "#loss-x option[value='time']").click()
    assert count(driver, "#chart-loss svg path.series") == completed_runs
    assert console_errors(driver) == []


def test_served_dashboard_follows_new_results(driver, tmp_path):
    from redline.experiments.dashboard import make_server

    root = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "sweep_small", root)
    lines = (root / "results.jsonl").read_text().splitlines(keepends=True)
    (root / "results.jsonl").write_text("".join(lines[:4]))
    server = make_server(root, "127.0.0.1", 0, poll_seconds=0.3)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        driver.get_log("browser"), driver.get_log("performance")
        driver.get(base)
        wait_for(driver, lambda: count(driver, "#cells-table tbody tr") > 0)
        before = len(table_labels(driver))
        with open(root / "results.jsonl", "a") as f:
            f.write("".join(lines[4:]))  # the sweep finishes more runs
        wait_for(driver, lambda: len(table_labels(driver)) > before)
        assert console_errors(driver) == []
        urls = requested_urls(driver)
        assert urls and all(u.startswith(base) for u in urls), urls
        assert base + "data.json" in urls
    finally:
        server.shutdown()
        server.server_close()


def test_the_checks_themselves_see_requests_and_errors(driver, tmp_path):
    """A control: a page that fetches a remote image and throws must fail both checks above."""
    page = tmp_path / "bad.html"
    page.write_text('<img src="http://192.0.2.1/x.png"><script>throw new Error("boom")</script>')
    driver.get_log("browser"), driver.get_log("performance")
    driver.get(page.as_uri())
    assert "http://192.0.2.1/x.png" in requested_urls(driver)
    assert any("boom" in e["message"] for e in console_errors(driver))


def test_headline_names_no_winner_within_the_noise(driver, tmp_path):
    """Two configurations whose throughput spreads overlap: the headline says so instead of naming the faster."""
    root = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "sweep_small", root)
    records = [json.loads(line) for line in (root / "results.jsonl").read_text().splitlines() if line.strip()]
    noisy = {("baseline", 1): 1000.0, ("baseline", 2): 1040.0, ("mqa", 1): 990.0, ("mqa", 2): 1060.0}
    kept = [r for r in records if r["precision"] == "bf16" and (r["variant"], r["seed"]) in noisy
            and r["status"] == "completed"]
    for r in kept:
        r["tokens_per_second"] = noisy[(r["variant"], r["seed"])]
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    page = write_report(root)["dashboard"]
    driver.get(page.resolve().as_uri())
    wait_for(driver, lambda: count(driver, "#cells-table tbody tr") > 0)
    headline = driver.find_element("id", "best").text
    assert "fastest: no clear winner (mqa 1,025 tok/s vs baseline 1,020 tok/s" in headline, headline
    assert console_errors(driver) == []
