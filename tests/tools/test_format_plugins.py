"""``model.tool.format`` as a plug-in (``zerotir.tools.formats``): a built-in short name, a dotted path or a
``{class_path, init_args}`` entry, each resolved to a ``CallFormat`` whose markers every reader takes; the command
line parses all three and links the format to the data's prompt; an entry that cannot apply is refused when the
group is built, naming ``model.tool.format`` and the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from zerotir.cli.app import ZeroTIRCLI, prompt_tools
from zerotir.config import ToolConfig
from zerotir.tools.formats import CallFormat, FormatWatch, Hermes, build_format, call_format, markers

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "toy_tools.yaml")  # a shipped config with format: hermes
ANGLE = '''
from zerotir.tools.formats import Call, CallFormat


class Angle(CallFormat):
    output_start, output_end = "<out>", "</out>"

    def __init__(self, opener="<<", closer=">>"):
        self.call_start, self.call_end = opener, closer

    def parse(self, block):
        return Call("calculator", {"expression": block})

    def render(self, text):
        return f"<out>{text}</out>"

    def describe(self, schemas):
        return f"Write {self.call_start}expression{self.call_end}."


class NotAFormat:
    pass


class NoMarkers(CallFormat):
    output_start, output_end = "<out>", "</out>"
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_formats.py").write_text(ANGLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_formats"
    sys.modules.pop("user_formats", None)


def test_a_short_name_and_its_entry_are_the_same_format():
    for spec in ("hermes", {"class_path": "hermes"}, {"class_path": "zerotir.tools.formats.Hermes", "init_args": {}}):
        tool = ToolConfig(format=spec, tools=[{"class_path": "calculator"}])
        assert type(call_format(tool)) is Hermes
        assert markers(tool) == ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
        assert prompt_tools(spec, tool.tools) == tool.tools  # its calls name their tool: the prompt lists them
    assert prompt_tools("fences", [{"class_path": "python"}]) is None
    assert prompt_tools({"class_path": "fences"}, [{"class_path": "python"}]) is None  # the entry, not the name


def test_a_format_of_your_own_takes_its_settings_from_init_args(user_module):
    entry = {"class_path": f"{user_module}.Angle", "init_args": {"opener": "[[", "closer": "]]"}}
    tool = ToolConfig(format=entry, tools=[{"class_path": "calculator"}])
    assert markers(tool) == ("[[", "]]", "<out>", "</out>")  # what the loop stops on and the filters count
    assert markers(ToolConfig(format=f"{user_module}.Angle", tools=[{"class_path": "calculator"}]))[:2] == ("<<", ">>")
    assert isinstance(build_format(entry), CallFormat)


@pytest.mark.parametrize("spec,says", [
    ("hermse", r"model.tool.format='hermse': not a built-in format \(fences, hermes, chat\) .* \(did you mean "
               r"'hermes'\?\)"),
    ("Fences", r"did you mean 'fences'\?"),
    ("no_such_module.Format", r"model.tool.format='no_such_module.Format': cannot import"),
    ({"class_path": "hermes", "args": {}}, r"model.tool.format=.*: write a built-in name .* \{class_path: "),
    ({"class_path": "hermes", "init_args": {"strict": True}},
     r"model.tool.format 'hermes' init_args \{'strict': True\}: .*the arguments of zerotir.tools.formats.Hermes"),
    ({"class_path": "fences", "init_args": {"code_start": "<code>"}}, r"fences takes no init_args .* "
                                                                      r"model.tool.code_start"),
])
def test_an_entry_that_cannot_apply_is_refused_naming_the_setting(spec, says):
    with pytest.raises(ValueError, match=says):
        ToolConfig(format=spec, tools=[{"class_path": "calculator"}])


def test_a_path_to_no_format_a_format_without_markers_and_the_fences_markers_elsewhere_are_refused(user_module):
    with pytest.raises(ValueError, match=rf"{user_module}.NotAFormat is not a subclass of zerotir.tools.formats."
                                         "CallFormat"):
        ToolConfig(format=f"{user_module}.NotAFormat", tools=[{"class_path": "calculator"}])
    with pytest.raises(ValueError, match=rf"{user_module}.NoMarkers sets no string call_start, call_end "):
        ToolConfig(format=f"{user_module}.NoMarkers", tools=[{"class_path": "calculator"}])
    with pytest.raises(ValueError, match=rf"model.tool.output_template set with model.tool.format="
                                         rf"'{user_module}.Angle'"):
        ToolConfig(format=f"{user_module}.Angle", output_template="<o>{output}</o>", tools=[{"class_path": "python"}])


def test_the_watch_names_the_built_in_format_a_model_writes_under_a_format_of_your_own(user_module):
    watch = FormatWatch(ToolConfig(format=f"{user_module}.Angle", tools=[{"class_path": "calculator"}]))
    said = watch.update(2, ['<tool_call>{"name": "calculator"}</tool_call>'], torch.tensor([0]))
    assert said is not None and f"model.tool.format={user_module}.Angle" in said
    assert "'<tool_call>', a call of the hermes format" in said and "--model.tool.format hermes" in said


def test_the_command_line_parses_a_name_and_an_entry_and_links_the_format_to_the_prompt(user_module, tiny_dir,
                                                                                       tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    for given in ("hermes", "{class_path: user_formats.Angle, init_args: {opener: '[['}}"):
        with pytest.raises(SystemExit) as done:
            ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.tool.format", given,
                             "--model.tool.tools", "[{class_path: calculator}]", "--print_config"])
        assert done.value.code == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["model"]["tool"]["format"] == yaml.safe_load(given)  # as written: a name stays a name
    entry = "{class_path: user_formats.Angle, init_args: {opener: '[['}}"
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                           "--trainer.default_root_dir", str(tmp_path), "--model.tool.format", entry,
                           "--model.tool.tools", "[{class_path: calculator}]"], run=False)
    assert cli.datamodule.tool_format == cli.model.tool.format == yaml.safe_load(entry)  # the prompt's format
    assert cli.datamodule.tools == [{"class_path": "calculator"}]  # its calls name their tool: the prompt lists them
    with pytest.raises(SystemExit) as done:  # a run: refused before anything is built
        ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.tool.format", "hermse", "--toy_base", "null",
                         "--trainer.default_root_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "model.tool.format='hermse'" in err and "did you mean 'hermes'?" in err
