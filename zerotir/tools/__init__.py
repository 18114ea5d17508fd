"""Tools the model calls during a rollout (``model.tool.tools``) and the formats it calls them in
(``model.tool.format``): the protocol (``base``), the registry (``registry``), the formats (``formats``), the
built-in tools (``python``, ``calculator``, ``search``) and the per-tool metrics (``stats``). docs/tools.md."""

from zerotir.tools.base import Observation, Tool, ToolEnv
from zerotir.tools.registry import Toolbox

__all__ = ["Observation", "Tool", "ToolEnv", "Toolbox"]
