"""`redline serve`'s chat page in a real headless Chromium (Selenium + the distribution's chromedriver), against a
live server with an API key and a tiny model on the CPU: the page asks for the key, streams a reply from
/v1/chat/completions, and the reply's text equals the API's own greedy reply; it asks the network for nothing but
this server. Skipped where no browser is installed (scripts/install_browser.sh installs one)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.test_dashboard_browser import CHROMEDRIVER, CHROMIUM, FLAGS, _missing

pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]

KEY = "page-key"


@pytest.fixture(scope="module")
def live():
    from redline.chat.render import renderer_for
    from redline.model import GPT
    from redline.serve.api import Server
    from redline.tokenizer import load_tokenizer
    from tests.test_serve import CFG, MODEL, Live, scheduler_for

    torch.manual_seed(0)
    tokenizer = load_tokenizer("bytes")
    tokenizer.add_chat_tokens()
    server = Server(scheduler_for(GPT(CFG), tokenizer), tokenizer, MODEL, renderer=renderer_for(tokenizer),
                    api_key=KEY)
    live = Live(server)
    yield live
    live.close()


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    browser.set_page_load_timeout(30)
    yield browser
    browser.quit()


def wait_for(driver, condition, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition())


def test_the_chat_page_streams_the_greedy_reply_with_the_key(live, driver):
    import openai
    from selenium.webdriver.common.by import By

    message, max_tokens = "hello there", 24
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY)
    expected = client.chat.completions.create(model="tiny-test", messages=[{"role": "user", "content": message}],
                                              temperature=0, max_tokens=max_tokens).choices[0].message.content
    assert expected, "the tiny model's greedy reply is empty: pick another message"

    driver.get_log("performance")
    driver.get(live.url + "/")
    status = driver.find_element(By.ID, "status")
    wait_for(driver, lambda: "API key" in status.text)  # /v1/models answered 401: the page asks for the key
    driver.find_element(By.ID, "key").send_keys(KEY)
    for field, value in (("temperature", "0"), ("max-tokens", str(max_tokens))):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "input").send_keys(message)
    driver.find_element(By.ID, "send").click()
    wait_for(driver, lambda: driver.execute_script(
        "const r = document.querySelector('.msg.assistant'); return r && r.dataset.done === 'true'"))
    reply = driver.execute_script("return document.querySelector('.msg.assistant').textContent")
    assert reply == expected
    assert status.get_attribute("data-state") == "idle"
    assert not driver.find_elements(By.CSS_SELECTOR, ".msg.error")
    urls = [json.loads(e["message"])["message"]["params"]["request"]["url"] for e in driver.get_log("performance")
            if json.loads(e["message"])["message"].get("method") == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(live.url) for u in urls), urls
