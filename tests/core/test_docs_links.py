"""Every relative link in the README and docs/ points at a file that exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_relative_links_resolve():
    missing = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                missing.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_readme_opens_with_the_two_commands_ci_runs():
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    assert "bash scripts/demo.sh" in first_block and "bash scripts/test.sh" in first_block
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
