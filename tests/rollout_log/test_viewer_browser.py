"""The web viewer in a real browser (headless Chromium through selenium and chromedriver) over the dump of a real
two-step fit: the module, Lightning's loop, the in-line source's tool loop (a scripted engine that writes a python
call, a scripted sandbox that answers it), the reward, the update and the ``RolloutDumper`` writing every trajectory
with its tokens. Each check writes a screenshot under the test's temporary folder.

Skipped, with the reason, where selenium, ``chromium`` or ``chromedriver`` is missing (Debian: ``apt-get install
chromium chromium-driver``; scripts/install.sh installs them when it runs as root with apt).
"""

from __future__ import annotations

import json
import shutil

import lightning.pytorch as pl
import pytest

from callbacks import RolloutDumper
from tests.rollout.scripted import InlineEngine, ScriptedSandbox, ok
from zerotir.config import BaseModelConfig, HFRollout, OptimConfig, RLConfig, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.data.datamodule import PromptDataModule
from zerotir.data.prompts import PLAIN_TEMPLATE
from zerotir.module import ZeroTIRModule
from zerotir.rewards import MathReward
from zerotir.rollout.source import InlineSource
from zerotir.rollout_log.server import serve_in_thread, url_of
from zerotir.tools.registry import Toolbox

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="needs chromium and chromedriver on PATH (apt-get install chromium "
                                       "chromium-driver)")

PROBLEMS = {"What is 3 + 4?": "7", "What is 2 + 3?": "5"}


def transcripts(answer: str) -> list[list[str]]:
    """Two samples: one computes with a python call and answers right, one guesses wrong without a call."""
    return [[f"Let me compute.\n```python\nprint({answer})\n```", f"\nSo the answer is \\boxed{{{answer}}}."],
            ["I guess \\boxed{0}."]]


class ScriptedPython(InlineSource):
    """The in-line source of the run (its tool loop over the python tool, the reward) with scripted sampling."""

    def start(self, actor, tokenizer, device, stream) -> None:
        self.stream, self._tokenizer = stream, tokenizer
        self.toolbox = Toolbox.build(self.tool, ScriptedSandbox(default=ok("the printed value\n")))
        self.toolbox.start()
        scripts = {PLAIN_TEMPLATE.format(problem=p): transcripts(a) for p, a in PROBLEMS.items()}
        self.engine = InlineEngine(tokenizer, scripts, n=2)


@pytest.fixture(scope="module")
def run_dir(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer_run")
    train = root / "train.jsonl"
    rows = [{"id": f"q{i}", "problem": p, "answer": a} for i, (p, a) in enumerate(list(PROBLEMS.items()) * 2)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pl.seed_everything(0)
    tool, sampling = ToolConfig(), SamplingConfig(n=2, max_response_tokens=256)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(micro_batch_size=2), optim=OptimConfig(lr=1e-2),
                           tool=tool, sampling=sampling, seed=3)
    module.source = ScriptedPython(HFRollout(), SandboxConfig(), tool, sampling, MathReward(), "unused", 3)
    data = PromptDataModule(train_files=[str(train)], template="plain", tokenizer=str(tiny_dir), prompts_per_step=2,
                            test_files=[])
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
                         callbacks=[RolloutDumper(tensorboard_samples=False, token_samples=None)])
    trainer.fit(module, datamodule=data)
    assert module.rl_steps_done == 2
    return root


@pytest.fixture
def browser(run_dir):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        options.add_argument(arg)
    server, thread = serve_in_thread(run_dir / "rollouts")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver, url_of(server)
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
        thread.join(10)


def wait_for(driver, css: str, count: int = 1):
    """The elements matching ``css`` once there are at least ``count`` of them (polled until the page has them)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def found(d):
        elements = d.find_elements("css selector", css)
        return elements if len(elements) >= count else False

    return WebDriverWait(driver, 30).until(found)


def token_colours(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#traj-body .tok')].map(t => getComputedStyle(t).backgroundColor)")


def sampled_tokens(driver) -> int:
    """Tokens of the open trajectory with an engine log-prob (the ones the policy sampled), from the page's data."""
    return driver.execute_script("return trajData.tokens.engine_logprob.filter(v => v !== null).length")


def test_steps_groups_blocks_overlays_and_filters_render_in_a_browser(browser, tmp_path):
    driver, url = browser
    driver.get(url)
    steps = wait_for(driver, "#steps tbody tr", 2)
    assert [row.text.split()[:2] for row in steps] == [["1", "4"], ["2", "4"]]  # step, trajectories
    assert all(row.text.split()[2:] == ["0.50", "0.50", "0.50"] for row in steps)  # reward, accuracy, tool use
    driver.save_screenshot(str(tmp_path / "1_steps.png"))

    groups = wait_for(driver, ".group", 2)
    groups[0].find_element("css selector", ".group-head").click()
    cards = groups[0].find_elements("css selector", ".traj-card")
    assert len(cards) == 2 and all(card.is_displayed() for card in cards)  # the group's samples side by side
    assert not groups[1].find_element("css selector", ".traj-card").is_displayed()  # the other group stays shut
    driver.save_screenshot(str(tmp_path / "2_group.png"))

    next(card for card in cards if "correct" in card.get_attribute("class").split()).click()
    call = wait_for(driver, "#traj-body .block.call")[0]
    output = wait_for(driver, "#traj-body .block.output")[0]
    assert "print(" in call.text and "the printed value" in output.text
    assert output.get_attribute("data-label") == "python output (ok)"
    driver.save_screenshot(str(tmp_path / "3_trajectory.png"))

    plain = token_colours(driver)
    driver.find_element("css selector", "input[name=overlay][value=logprob]").click()
    by_logprob = token_colours(driver)
    clear = "rgba(0, 0, 0, 0)"
    assert set(plain) == {clear} and by_logprob[0] == clear  # a prompt token has no log-prob
    assert sum(c != clear for c in by_logprob) == sampled_tokens(driver) > 0  # each sampled token shaded
    driver.find_element("css selector", "input[name=overlay][value=weight]").click()
    by_weight = token_colours(driver)
    assert by_weight != by_logprob and len(set(by_weight)) == 2  # trained or not
    assert "overlay=weight" in driver.current_url
    driver.save_screenshot(str(tmp_path / "4_overlay.png"))

    shown = driver.find_element("css selector", "#shown")
    assert shown.text == "4 of 4 trajectories"
    driver.find_element("css selector", "#filters input[value=correct]").click()
    assert shown.text == "2 of 4 trajectories" and "filter=correct" in driver.current_url
    assert all("correct" in c.get_attribute("class").split() for c in driver.find_elements("css selector",
                                                                                           ".traj-card"))
    driver.save_screenshot(str(tmp_path / "5_filter.png"))
    assert [p.name for p in sorted(tmp_path.glob("*.png"))] == ["1_steps.png", "2_group.png", "3_trajectory.png",
                                                                 "4_overlay.png", "5_filter.png"]


def test_a_shared_link_opens_its_step_trajectory_and_overlay(browser, tmp_path):
    driver, url = browser
    driver.get(url + "#split=train&step=1&traj=0-1&overlay=logprob&filter=wrong")
    head = wait_for(driver, "#traj-head strong")[0]
    assert head.text.startswith("#0-1 ")
    assert driver.find_element("css selector", "#steps tr.selected").text.split()[0] == "1"
    assert driver.find_element("css selector", "input[name=overlay][value=logprob]").is_selected()
    assert driver.find_element("css selector", "#filters input[value=wrong]").is_selected()
    colours = token_colours(driver)
    assert sum(c != "rgba(0, 0, 0, 0)" for c in colours) == sampled_tokens(driver) > 0
    driver.save_screenshot(str(tmp_path / "link.png"))
