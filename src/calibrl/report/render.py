"""Markdown pages with an HTML twin, for the Snakemake report."""

from __future__ import annotations

from pathlib import Path

from calibrl.io import write_text

HTML_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>
body {{font-family: sans-serif; max-width: 75em; margin: 1em auto; line-height: 1.4}}
table {{border-collapse: collapse; margin: 0.5em 0}} th, td {{border: 1px solid #bbb; padding: 2px 6px}}
td {{text-align: right}} td:first-child, td:nth-child(2) {{text-align: left}} th {{background: #eee}}
</style></head><body>
{body}
</body></html>
"""


def write_markdown(path: str | Path, text: str) -> None:
    """``path`` (Markdown) and the same page as HTML beside it (``.html``), for the Snakemake report."""
    import markdown

    path = Path(path)
    write_text(path, text)
    body = markdown.markdown(text, extensions=["tables"])
    title = next((line.lstrip("# ") for line in text.splitlines() if line.startswith("#")), path.stem)
    write_text(path.with_suffix(".html"), HTML_PAGE.format(title=title, body=body))
