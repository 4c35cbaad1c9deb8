"""The generated pages (scripts/gen_docs.py) are what the code says today, and every AGENTRUN_* variable the
code reads is in the environment reference."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.docs.examples import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


def test_no_generated_page_is_stale() -> None:
    gen = _generator()
    stale = [page for page, text in gen.render().items()
             if not (ROOT / "docs" / page).exists() or (ROOT / "docs" / page).read_text() != text]
    assert not stale, f"stale: {', '.join('docs/' + p for p in stale)}; run `{gen.COMMAND}` and commit the pages"


def test_every_variable_the_code_reads_is_documented() -> None:
    gen = _generator()
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    names = gen.environment_variables()
    assert "AGENTRUN_DATABASE_URL" in names and "AGENTRUN_MODEL_LIMITS" in names
    missing = [name for name in names if f"\n## `{name}`\n" not in page]
    assert not missing, f"read by the code, not in docs/reference/environment.md: {missing}; run `{gen.COMMAND}`"
    undescribed = [name for name in names if f"## `{name}`\n\n\n" in page]
    assert not undescribed, f"say what these are in the code (a docstring or --help): {undescribed}"


def test_every_cli_command_is_in_the_cli_reference() -> None:
    gen = _generator()
    from agentrun.worker.cli.parser import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for words, parser in gen._parsers(build_parser(), ("agentrun",)):
        assert f"## `{' '.join(words)}`" in page
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, f"{' '.join(words)} {flag}"
