#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
"""Writes the SIWX_* settings from docs/settings.txt into their two readers.

The README's Configuration table and the ENVIRONMENT list of siwx(7)
(docs/siwx.7) are generated between marker lines; everything outside the
markers is hand-written. With --check nothing is written: the exit status is
1 and the stale files are named when either is out of date (the docs.settings
test, label unit, runs this).
"""

import argparse
import pathlib
import re
import sys
import textwrap

TOP = pathlib.Path(__file__).resolve().parent.parent
SOURCE = TOP / "docs" / "settings.txt"
README = TOP / "README.md"
MANPAGE = TOP / "docs" / "siwx.7"

README_BEGIN = "<!-- BEGIN SETTINGS: generated from docs/settings.txt by scripts/gen-settings.py -->"
README_END = "<!-- END SETTINGS -->"
MAN_BEGIN = '.\\" BEGIN SETTINGS: generated from docs/settings.txt by scripts/gen-settings.py'
MAN_END = '.\\" END SETTINGS'

KEYS = ("name", "values", "default", "wire", "meaning")


def parse(text):
    """Returns the settings as a list of dicts with the KEYS."""
    settings, current, key = [], {}, None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{SOURCE.name}:{number}"
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                settings.append(current)
            current, key = {}, None
            continue
        if line.startswith("  "):
            if key is None:
                sys.exit(f"{where}: continuation line before any key")
            current[key] += " " + line.strip()
            continue
        match = re.fullmatch(r"([a-z]+): (.*)", line)
        if not match or match.group(1) not in KEYS:
            sys.exit(f"{where}: expected 'key: text' with key one of {', '.join(KEYS)}")
        key = match.group(1)
        if key in current:
            sys.exit(f"{where}: '{key}' given twice in one block")
        current[key] = match.group(2).strip()
    if current:
        settings.append(current)
    names = set()
    for setting in settings:
        missing = [k for k in KEYS if k not in setting]
        if missing:
            sys.exit(f"{SOURCE.name}: {setting.get('name', '?')} lacks {', '.join(missing)}")
        if not re.fullmatch(r"SIWX_[A-Z0-9_]+", setting["name"]):
            sys.exit(f"{SOURCE.name}: '{setting['name']}' is not a SIWX_* name")
        if setting["name"] in names:
            sys.exit(f"{SOURCE.name}: {setting['name']} listed twice")
        names.add(setting["name"])
    return settings


def readme_table(settings):
    def cell(text):
        return text.replace("|", "\\|")

    rows = ["| variable | values | default | on the wire | meaning |",
            "| --- | --- | --- | --- | --- |"]
    for s in settings:
        rows.append(f"| `{s['name']}` | {cell(s['values'])} | {cell(s['default'])} | "
                    f"{cell(s['wire'])} | {cell(s['meaning'])} |")
    return rows


def roff(text):
    """Markdown `code` to bold, escaped for groff, as lines of at most 78."""
    out = []
    for i, part in enumerate(text.split("`")):
        part = part.replace("\\", "\\e")
        if i % 2:
            out.append("\\fB" + part.replace("-", "\\-") + "\\fR")
        else:
            out.append(part)
    lines = textwrap.wrap("".join(out), 78, break_long_words=False, break_on_hyphens=False)
    return ["\\&" + line if line.startswith((".", "'")) else line for line in lines]


def man_list(settings):
    lines = []
    for s in settings:
        lines += [".TP", f".B {s['name']}",
                  *roff(f"Values: {s['values']}. Default: {s['default']}. "
                        f"On the wire: {s['wire']}."),
                  ".br", *roff(s["meaning"])]
    return lines


def replace_between(path, begin, end, body):
    """The text of path with the lines between begin and end set to body."""
    lines = path.read_text().splitlines()
    try:
        first = lines.index(begin)
        last = lines.index(end, first)
    except ValueError:
        sys.exit(f"{path.relative_to(TOP)}: marker lines missing:\n  {begin}\n  {end}")
    return "\n".join(lines[:first + 1] + body + lines[last:]) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a generated part is out of date")
    args = parser.parse_args()

    settings = parse(SOURCE.read_text())
    stale = []
    for path, begin, end, body in ((README, README_BEGIN, README_END, readme_table(settings)),
                                   (MANPAGE, MAN_BEGIN, MAN_END, man_list(settings))):
        wanted = replace_between(path, begin, end, body)
        if path.read_text() == wanted:
            continue
        stale.append(str(path.relative_to(TOP)))
        if not args.check:
            path.write_text(wanted)
    if args.check and stale:
        print(f"out of date with docs/settings.txt: {', '.join(stale)}; "
              "run scripts/gen-settings.py and commit the result", file=sys.stderr)
        return 1
    if stale:
        print(f"rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
