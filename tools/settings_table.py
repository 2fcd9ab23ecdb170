"""docs/settings.md from the settings' table in visemz/config.py: each setting with its environment variable,
default, allowed values (config.RULES) and meaning (the first sentence of the comment above its field; the rest
of that comment, the reasons and measurements behind the default, stays in config.py).

    python tools/settings_table.py            # writes docs/settings.md
    python tools/settings_table.py --check    # exit status 1 if docs/settings.md is not what it would write

tests/test_defaults.py runs the check, so a setting added to config.py without its line here fails there.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

from visemz import config
from visemz.image import pixels, tiling

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"

HEAD = """# Settings

<!-- Written by tools/settings_table.py from visemz/config.py: change the comments there, then run it. -->

visemz's runtime settings are one set for the whole process. Each starts from its environment variable
(`VISEMZ_ZSTD_LEVEL=9 python job.py`), read when visemz first needs a setting; a program can then change
them, for good or for one block:

```python
import visemz

visemz.defaults.get("zstd_level")                  # the value in force
visemz.defaults.set(zstd_level=9)                  # from here on
with visemz.defaults.set(entropy_chunk=1 << 16, threads=4):
    ...                                            # these values within the block, the earlier ones after it
```

A new value applies to the next call that reads the setting, in every thread (the settings are the
process's, not a thread's); the worker processes of a folder job (`processes`) start with the values in
force. Values are checked by the rules of the environment variables: a bad name or value raises
`InvalidArgumentError` naming it (from `set`, which then changes nothing, or when visemz reads the
environment). An integer setting takes integers only. Why each default is what it is, with the
measurements behind it, is written beside its field of `Defaults` in `visemz/config.py`.

| setting | environment variable | default | values | meaning |
| --- | --- | --- | --- | --- |
"""


def comments() -> dict[str, str]:
    """Each field's ``#:`` comment, its lines joined (two spaces after a line that ends a sentence)."""
    out, lines = {}, []
    for line in inspect.getsource(config.Defaults).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            lines.append(text[2:].strip())
            continue
        field = re.match(r"(\w+): \w+ = ", text)
        if field:
            out[field.group(1)] = "".join(s + ("  " if s.endswith(".") else " ") for s in lines).strip()
            lines = []
    return out


def first_sentence(text: str) -> str:
    # the house's comments put two spaces after a sentence, one after an abbreviation (e.g.)
    return re.split(r"(?<=\.) {2,}", text)[0]


def values(name: str) -> str:
    if name == "tile":  # its rule is tiling.check_tile's (config.RULES says why)
        return f"a multiple of {pixels.PAD} in {pixels.PAD}..{tiling.MAX_TILE}"
    rule = config.RULES.get(name)
    return rule[1] if rule else f"any {config.TYPES[name].__name__}"


def cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def row(field: dataclasses.Field, meaning: str) -> str:
    default = f'"{field.default}"' if isinstance(field.default, str) else str(field.default)
    cells = [f"`{field.name}`", f"`{config.ENV[field.name]}`", f"`{default}`", values(field.name),
             first_sentence(meaning)]
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def render() -> str:
    meanings = comments()
    return HEAD + "".join(row(f, meanings[f.name]) + "\n" for f in dataclasses.fields(config.Defaults))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say whether docs/settings.md is up to date")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = DOC.exists() and DOC.read_text() == text
        print(f"{DOC} is {'up to date' if same else 'out of date: run python tools/settings_table.py'}")
        return 0 if same else 1
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
