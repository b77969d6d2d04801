"""The verdict chart's upload, exactly once across crashes: files_upload_v2's three steps, each journalled.

files_upload_v2 is three calls — files.getUploadURLExternal (a file id and an upload URL), a POST of
the bytes to that URL, files.completeUploadExternal (which shares the file into the channel or
thread) — and only the last one shows anything in Slack. Each step's outcome goes into the Slack
journal (babysit/slack/journal.py) under the chart's key:

    KEY:file      done FILE_ID   the upload URL was issued for FILE_ID
    KEY:bytes     done FILE_ID   its bytes were accepted
    KEY:complete  begin          the share may have landed
    KEY           done FILE_ID   shared

A process killed before `:bytes` starts over with a fresh URL: a file never completed is never shown
(Slack drops it). Killed after `:bytes`, it completes that same file id. Killed after `:complete`
began, it first asks files.info whether the file is already shared there and completes only if not.
If files.info is refused (the app lacks files:read) it completes again: a duplicate beats a loss.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from babysit.core.errors import PermanentDeliveryError
from babysit.runtime.faults import crash_point
from babysit.slack.errors import delivery_error
from babysit.slack.journal import Journal

log = structlog.get_logger("babysit.slack")


def upload_once(client: Any, journal: Journal, key: str, path: Path, *, channel: str, thread_ts: str | None,
                title: str, comment: str) -> str:
    """Share `path` into `channel` (or its thread `thread_ts`) unless the journal says it already is;
    returns the file id."""
    shared = journal.ref(key)
    if shared is not None:
        return shared
    file_id = journal.ref(f"{key}:bytes")
    if file_id is not None and journal.began(f"{key}:complete") and _is_shared(client, file_id, channel, thread_ts):
        journal.done(key, file_id)
        log.info("chart found already shared after a restart; not uploaded again", key=key, file=file_id)
        return file_id
    if file_id is None:
        data = path.read_bytes()
        issued = client.files_getUploadURLExternal(filename=path.name, length=len(data))
        file_id, upload_url = str(issued["file_id"]), str(issued["upload_url"])
        crash_point("chart-after-url")
        journal.done(f"{key}:file", file_id)
        _post_bytes(upload_url, data, client.timeout)
        crash_point("chart-after-bytes")
        journal.done(f"{key}:bytes", file_id)
    journal.begin(f"{key}:complete")
    client.files_completeUploadExternal(files=[{"id": file_id, "title": title}], channel_id=channel,
                                        thread_ts=thread_ts, initial_comment=comment)
    crash_point("chart-after-complete")
    journal.done(key, file_id)
    return file_id


def _post_bytes(url: str, data: bytes, timeout: float) -> None:
    """Step two: the bytes to the URL Slack issued (signed; it takes no token)."""
    from slack_sdk.errors import SlackRequestError

    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if response.status != 200:
            raise SlackRequestError(f"the chart's upload URL answered {response.status}")


def _is_shared(client: Any, file_id: str, channel: str, thread_ts: str | None) -> bool:
    """Whether files.info shows the file posted in `channel` (in the thread `thread_ts`, when given)."""
    from slack_sdk.errors import SlackApiError

    try:
        info = client.files_info(file=file_id)
    except SlackApiError as exc:
        error = delivery_error(exc, "files.info")
        if isinstance(error, PermanentDeliveryError):
            log.warning("cannot check whether the chart was shared; completing it (a duplicate beats a loss)",
                        file=file_id, error=str(error))
            return False
        raise error from None
    return shared_in(info.get("file") or {}, channel, thread_ts)


def shared_in(file: Mapping[str, Any], channel: str, thread_ts: str | None) -> bool:
    """Pure: does a files.info `file` carry a share in `channel` — in the thread, or at the top level?"""
    shares = file.get("shares") or {}
    for scope in ("public", "private"):
        for share in (shares.get(scope) or {}).get(channel) or ():
            in_thread = share.get("thread_ts")
            if thread_ts is not None and in_thread == thread_ts:
                return True
            if thread_ts is None and in_thread in (None, "", share.get("ts")):
                return True
    return False
