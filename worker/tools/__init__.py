"""Tools: the tool box (Python tools, `@tool`, the threads they run on) and the MCP client."""

from agentrun.worker.core.waits import WaitForEvent as WaitForEvent
from agentrun.worker.tools.box import BUILTINS as BUILTINS
from agentrun.worker.tools.box import DEFAULT_INPUT_SCHEMA as DEFAULT_INPUT_SCHEMA
from agentrun.worker.tools.box import SourceStatus as SourceStatus
from agentrun.worker.tools.box import Tool as Tool
from agentrun.worker.tools.box import ToolBox as ToolBox
from agentrun.worker.tools.box import ToolContext as ToolContext
from agentrun.worker.tools.box import ToolOutcome as ToolOutcome
from agentrun.worker.tools.box import ToolResult as ToolResult
from agentrun.worker.tools.box import ToolSource as ToolSource
from agentrun.worker.tools.box import ToolThreads as ToolThreads
from agentrun.worker.tools.box import load_tool_modules as load_tool_modules
from agentrun.worker.tools.box import tool as tool
