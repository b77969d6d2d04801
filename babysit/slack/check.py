"""`babysit slack check`: does this Slack setup work, before a run depends on it? (docs/slack.md, Checking it)

Each step asks Slack itself, through the one client factory (`slack/client.py`):

1. the token: set, and a bot token (`xoxb-`), not a user (`xoxp-`) or app-level (`xapp-`) one;
2. `auth.test`: Slack accepts it; which bot user, which workspace;
3. the scopes granted (the `x-oauth-scopes` header Slack sends with every Web API answer) against the
   ones babysit needs, each missing one said with what it costs;
4. each configured channel (`--channel`, else `BABYSIT_SLACK_CHANNEL`, `[daemon].channel` and the runs'
   `[notify].channel`): `conversations.info` (is the bot a member, is it archived), joined with
   `conversations.join` when asked (`--join`, public channels), then a test post (`chat.postMessage`),
   unless `--no-post`.

`run_check` returns the findings; the command prints them. Nothing here raises for what Slack answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REQUIRED = {  # scope: what babysit cannot do without it
    "chat:write": "post launches, polls, incidents and verdicts, and edit the live header",
    "files:write": "upload the verdict chart",
    "commands": "answer /verdict and /babysit",
}
RECOMMENDED = {
    "files:read": "tell, after a crash mid-upload, whether the chart is already shared (else it may show twice)",
    "channels:history": "find an earlier post after a crash in a public channel (else a post may show twice)",
    "groups:history": "the same in a private channel",
    "channels:read": "let `babysit slack check` see whether the bot is in a channel",
    "channels:join": "let `babysit slack check --join` join a public channel",
}
TEST_TEXT = "✅ babysit slack check: posts from babysit reach this channel. Nothing to do."


@dataclass(frozen=True)
class Finding:
    step: str  # token | auth | scopes | channel | post
    ok: bool
    text: str
    fix: str | None = None  # what to do, when not ok (or a warning's remedy)
    warning: bool = False  # ok, but something costs (a recommended scope missing)


def token_finding(token: str | None) -> Finding:
    if not token:
        return Finding("token", False, "SLACK_BOT_TOKEN is not set",
                       "api.slack.com/apps → your app → OAuth & Permissions → Install to Workspace; copy the "
                       "Bot User OAuth Token (xoxb-…) into SLACK_BOT_TOKEN")
    if token.startswith("xoxb-"):
        return Finding("token", True, "SLACK_BOT_TOKEN is a bot token (xoxb-…)")
    kind = {"xoxp-": "a user token", "xapp-": "an app-level token (that is SLACK_APP_TOKEN, for Socket Mode)",
            "xoxe": "a refresh token"}.get(token[:5], "not a Slack bot token")
    return Finding("token", False, f"SLACK_BOT_TOKEN is {kind}",
                   "use the Bot User OAuth Token (xoxb-…) from OAuth & Permissions")


def scope_findings(granted: Sequence[str] | None) -> list[Finding]:
    if granted is None:
        return [Finding("scopes", True, "Slack sent no x-oauth-scopes header: the scopes could not be checked",
                        warning=True)]
    have = set(granted)
    out = []
    missing = [s for s in REQUIRED if s not in have]
    if missing:
        out.append(Finding("scopes", False, "missing " + ", ".join(f"{s} (to {REQUIRED[s]})" for s in missing),
                           "OAuth & Permissions → Bot Token Scopes: add them, then reinstall the app "
                           "(the token keeps its value, its scopes change)"))
    else:
        out.append(Finding("scopes", True, "granted " + ", ".join(s for s in sorted(have))))
    for s, why in RECOMMENDED.items():
        if s not in have:
            out.append(Finding("scopes", True, f"{s} not granted: babysit cannot {why}",
                               "add it under Bot Token Scopes and reinstall, if you want that", warning=True))
    return out


def run_check(client: Any, token: str | None, channels: Sequence[str], *, join: bool = False,
              post: bool = True) -> list[Finding]:
    """Every finding, in order; stops after a token or auth.test failure (nothing else can be asked)."""
    from slack_sdk.errors import SlackApiError  # lazy: only this command and the channel talk to Slack

    first = token_finding(token)
    if not first.ok:
        return [first]
    found = [first]
    try:
        auth = client.auth_test()
    except SlackApiError as exc:
        error = exc.response.get("error")
        return [*found, Finding("auth", False, f"auth.test refused the token: {error}",
                                "the token was revoked or the app uninstalled: reinstall it (OAuth & Permissions) "
                                "and copy the new Bot User OAuth Token")]
    except Exception as exc:  # unreachable Slack: a connection error, a proxy
        return [*found, Finding("auth", False, f"Slack could not be reached: {type(exc).__name__}: {exc}",
                                "check the network and BABYSIT_SLACK_API_URL (unset: https://slack.com/api/)")]
    found.append(Finding("auth", True, f"bot @{auth.get('user')} ({auth.get('user_id')}) in workspace "
                                       f"{auth.get('team')} ({auth.get('team_id')})"))
    header = _header(auth, "x-oauth-scopes")
    granted = None if header is None else [s.strip() for s in header.split(",") if s.strip()]
    found += scope_findings(granted)
    if not channels:
        found.append(Finding("channel", False, "no channel configured: every run's messages would be marked failed "
                             "(\"no Slack channel for run …\", in `babysit status` and daemon.log) and nothing "
                             "posted", "set [daemon].channel in babysit.toml (a channel ID such as C0123ABCD) or "
                             "[notify].channel in each run.toml; or pass --channel to check one"))
        return found
    for channel in channels:
        found += _channel(client, channel, granted, join=join, post=post, error_type=SlackApiError)
    return found


def _channel(client: Any, channel: str, granted: Sequence[str] | None, *, join: bool, post: bool,
             error_type: type[Exception]) -> list[Finding]:
    out: list[Finding] = []
    if channel.startswith("#"):
        out.append(Finding("channel", True, f"{channel} is a name: babysit's duplicate-post check looks posts up by "
                           "channel ID", "use the channel's ID (its About tab) in babysit.toml", warning=True))
    else:
        try:
            info = client.conversations_info(channel=channel)["channel"]
        except error_type as exc:
            error = exc.response.get("error")  # type: ignore[attr-defined]
            if error == "missing_scope":
                out.append(Finding("channel", True, f"{channel}: cannot look it up without channels:read; the test "
                                   "post decides", warning=True))
            else:
                return [*out, Finding("channel", False, f"{channel}: conversations.info: {error}",
                                      "check the channel ID (the channel's About tab)")]
        else:
            name = f"{channel} (#{info.get('name')})"
            if info.get("is_archived"):
                return [*out, Finding("channel", False, f"{name} is archived", "unarchive it or configure another")]
            if info.get("is_member"):
                out.append(Finding("channel", True, f"{name}: the bot is a member"))
            elif join and not info.get("is_private"):
                try:
                    client.conversations_join(channel=channel)
                    out.append(Finding("channel", True, f"{name}: the bot was not a member; it joined"))
                except error_type as exc:
                    error = exc.response.get("error")  # type: ignore[attr-defined]
                    return [*out, Finding("channel", False, f"{name}: conversations.join: {error}",
                                          f"/invite @babysit in #{info.get('name')}"
                                          + (" (or grant channels:join)" if error == "missing_scope" else ""))]
            else:
                how = "rerun with --join (public channels; needs channels:join), or " if not info.get("is_private") \
                    else ""
                return [*out, Finding("channel", False, f"{name}: the bot is not a member, so it cannot post there",
                                      f"{how}/invite @babysit in #{info.get('name')}")]
    if not post:
        return out
    try:
        resp = client.chat_postMessage(channel=channel, text=TEST_TEXT)
    except error_type as exc:
        error = exc.response.get("error")  # type: ignore[attr-defined]
        fix = {"not_in_channel": f"/invite @babysit in {channel}" + (", or rerun with --join" if not join else ""),
               "channel_not_found": "check the channel ID (its About tab); a private channel needs the bot invited",
               "missing_scope": "grant chat:write and reinstall the app"}.get(str(error), "see docs/slack.md")
        return [*out, Finding("post", False, f"{channel}: chat.postMessage: {error}", fix)]
    out.append(Finding("post", True, f"a test message was posted to {resp.get('channel')} (ts {resp.get('ts')})"))
    return out


def _header(resp: Any, name: str) -> str | None:
    headers = getattr(resp, "headers", None) or {}
    for key, value in dict(headers).items():
        if key.lower() == name:
            return value[0] if isinstance(value, list) else str(value)
    return None
