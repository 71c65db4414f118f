"""The status page's markup, style and script (``_status_static/``): served from the scheduler's own
origin, no framework, nothing from a CDN.

The script (``app.js``) polls ``/status/data`` (the session cookie goes with it) and redraws; it builds
every node with ``textContent``, never ``innerHTML``, so no model id or note can inject markup.
"""

from __future__ import annotations

import html
from pathlib import Path

__all__ = ["PAGE_CSS", "PAGE_JS", "POLL_MS", "page_html", "signin_html"]

POLL_MS = 2000

_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>prewarm status</title><link rel="stylesheet" href="/status/app.css"></head>
"""


def signin_html(error: str = "") -> str:
    message = f'<p class="error" id="signin-error">{html.escape(error)}</p>' if error else ""
    return (
        _HEAD
        + """<body><main class="signin"><h1>prewarm status</h1>
<p>Sign in with a read token (a hint writer's token works too; a publishable token does not).</p>
"""
        + message
        + """<form method="post" action="/status/session" autocomplete="off">
<label>Token <input type="password" name="token" id="token" required></label>
<button type="submit" id="signin">Sign in</button></form></main></body></html>
"""
    )


def page_html() -> str:
    return (
        _HEAD
        + f"""<body data-poll-ms="{POLL_MS}">
<header><h1>prewarm status</h1><span id="replica"></span><span id="updated"></span>
<form method="post" action="/status/signout"><button type="submit">Sign out</button></form></header>
<p id="error" class="error"></p>
<section><h2>Models <small id="models-count"></small></h2>
<p class="legend">Demand of the last 24 h (bars, per hour) against the forecast (line), and the
forecast of the next 2 h (per 10 min).</p>
<table id="models"><thead><tr><th>model</th><th>where</th><th>hints</th><th>last 24 h vs forecast</th>
<th>next 2 h</th></tr></thead><tbody></tbody></table></section>
<section><h2>Nodes</h2><div id="nodes"></div></section>
<section><h2>Active hints</h2><table id="hints"><thead><tr><th>model</th><th>source</th><th>eta</th>
<th>ttl</th><th>confidence</th></tr></thead><tbody></tbody></table></section>
<section><h2>Upcoming orders</h2><table id="upcoming"><thead><tr><th>at</th><th>node</th><th>model</th>
<th>action</th><th>tier</th><th>reason</th><th>note</th></tr></thead><tbody></tbody></table></section>
<section><h2>Recent orders</h2><table id="recent"><thead><tr><th>at</th><th>node</th><th>model</th>
<th>action</th><th>tier</th><th>reason</th><th>note</th></tr></thead><tbody></tbody></table></section>
<section><h2>Recent mispredictions</h2><table id="mispredictions"><thead><tr><th>at</th><th>node</th>
<th>model</th><th>tier</th><th>note</th></tr></thead><tbody></tbody></table></section>
<section><h2>Recent cold starts</h2><table id="cold-starts"><thead><tr><th>minute</th><th>model</th>
<th>cold starts</th><th>requests</th><th>wait (s)</th></tr></thead><tbody></tbody></table></section>
<script src="/status/app.js"></script></body></html>
"""
    )


# Files beside this module: the script and the style are what a browser runs, kept as what they are.
_STATIC = Path(__file__).with_name("_status_static")
PAGE_CSS = (_STATIC / "app.css").read_text()
PAGE_JS = (_STATIC / "app.js").read_text()
